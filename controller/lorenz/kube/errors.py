"""The coded errors of the operator: what a user (or a cluster admin) can get wrong.

Each one becomes a ``Degraded`` condition reason, a Kubernetes Event or a CLI exit message, so
each carries a stable ``code`` and a one-line message that says what to do.
"""

from __future__ import annotations

from typing import Any

from lorenz.codes import ErrorCode
from lorenz.leadership import DaemonAlreadyRunning, LeadershipLost, LeaseRecord
from lorenz.model import LorenzError


class OperatorError(LorenzError):
    """Base of every operator error."""

    code = ErrorCode.OPERATOR_ERROR


class KubeApiError(OperatorError):
    """The API server refused a request, or could not be reached.

    ``status`` is the HTTP status (0 when there was no response); ``reason`` the Kubernetes
    ``Status.reason`` (``NotFound``, ``AlreadyExists``, ``Conflict``, ``Forbidden``, ...).
    """

    code = ErrorCode.KUBE_API_ERROR

    def __init__(
        self,
        *,
        method: str,
        path: str,
        status: int,
        reason: str,
        detail: str,
        body: dict[str, Any] | None = None,
    ) -> None:
        hint = _HINTS.get(status, "check the API server and the operator's kubeconfig")
        if _namespace_terminating(status, detail, body):
            hint = "the namespace is being deleted: nothing can be created in it any more"
        super().__init__(f"{method} {path} failed: {status} {reason}: {detail}; {hint}")
        self.method = method
        self.path = path
        self.status = status
        self.reason = reason
        self.detail = detail
        self.body = body or {}

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """A stale resourceVersion (409 Conflict) or a failed JSON-patch test (422 on ``test``)."""
        return self.status == 409 and self.reason != "AlreadyExists"

    @property
    def namespace_terminating(self) -> bool:
        """A create refused because its namespace is being deleted (403, not an RBAC denial)."""
        return _namespace_terminating(self.status, self.detail, self.body)

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"


def _namespace_terminating(status: int, detail: str, body: dict[str, Any] | None) -> bool:
    if status != 403:
        return False
    causes = ((body or {}).get("details") or {}).get("causes") or ()
    if any(isinstance(c, dict) and c.get("reason") == "NamespaceTerminating" for c in causes):
        return True
    return "because it is being terminated" in detail


_HINTS = {
    0: "the API server did not answer; check the network and the server address",
    401: "the credentials were refused; renew the token or fix the kubeconfig",
    403: "grant the operator's ServiceAccount the verbs in lorenz.kube.rbac.OPERATOR_RULES",
    404: "the object does not exist (or the CRDs are not installed: kubectl apply -f crds/)",
    409: "another writer changed the object first; the operator retries with a fresh read",
    422: "the object was refused by validation",
}


class KubeConfigMissing(OperatorError):
    """Neither a kubeconfig nor an in-cluster ServiceAccount was found."""

    code = ErrorCode.KUBE_CONFIG_MISSING

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"no Kubernetes credentials found ({detail}); set KUBECONFIG, pass --kubeconfig, "
            "or run inside a pod with a ServiceAccount"
        )


class TrackerSecretMissing(OperatorError):
    """``spec.tracker.apiKeySecretRef`` (or ``webhookSecretRef``) names a Secret (or key) that
    cannot be read."""

    code = ErrorCode.TRACKER_SECRET_MISSING

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        key: str,
        detail: str,
        field: str = "tracker.apiKeySecretRef",
    ) -> None:
        what = "webhook secret" if field == "tracker.webhookSecretRef" else "tracker API key"
        super().__init__(
            f"the {what} Secret {namespace}/{name} key {key!r} (named by {field}) cannot be "
            f"used ({detail}); create it with `kubectl create secret generic {name} -n "
            f"{namespace} --from-literal={key}=<value>` and set the lorenz.dev/refresh annotation",
            key_path=field,
        )
        self.namespace = namespace
        self.name = name
        self.key = key


class LeaseHeldElsewhere(DaemonAlreadyRunning, OperatorError):
    """Another replica holds the Workflow's Lease (the acquire attempt lost).

    A :class:`~lorenz.leadership.DaemonAlreadyRunning`, as the leadership protocol promises for
    a lost acquire, with its own code: a follower replica is normal, not a misconfiguration.
    """

    code = ErrorCode.LEASE_HELD_ELSEWHERE

    def __init__(self, *, lease: str, record: LeaseRecord | None) -> None:
        holder = record.holder if record is not None else None
        who = holder or "another candidate (a concurrent write won)"
        LorenzError.__init__(
            self,
            f"the Lease {lease} is held by {who}; this replica stays a follower and takes over "
            "if the holder stops renewing",
        )
        self.path = None
        self.lease = lease
        self.holder = holder
        self.record = record
        self.pid = None
        self.endpoint = record.endpoint if record is not None else None


class LeaseLost(LeadershipLost):
    """This replica can no longer prove it holds the Workflow's Lease (renewals failed for the
    renew deadline, or another replica holds it): it stops that Workflow's runtime."""

    def __init__(self, *, lease: str, holder: str | None, since_renew_s: float | None) -> None:
        LeadershipLost.__init__(self, path=None, holder=holder)
        who = f"held by {holder}" if holder else "not renewed"
        when = f"; last renewal {since_renew_s:.1f} s ago" if since_renew_s is not None else ""
        LorenzError.__init__(
            self,
            f"this replica's Lease {lease} is no longer provably its own ({who}{when}): it "
            "stops the Workflow's runtime and a follower takes over; check the API server "
            "connection if this repeats",
        )
        self.lease = lease


class TrackerPathOutsideWorkflow(OperatorError):
    """``tracker.path`` leaves the Workflow's own folder on the operator's volume."""

    code = ErrorCode.TRACKER_PATH_OUTSIDE_WORKFLOW

    def __init__(self, *, path: str, why: str) -> None:
        super().__init__(
            f"tracker.path {path!r} {why}: a Workflow reads issues only from inside its own "
            "folder on the operator's volume; use a relative path such as 'issues'",
            key_path="tracker.path",
        )


class InvalidOperatorSettings(OperatorError):
    """An operator setting (environment variable or ``lorenz operator`` flag) is invalid."""

    code = ErrorCode.INVALID_OPERATOR_SETTINGS

    def __init__(self, problems: list[str]) -> None:
        super().__init__(
            "invalid operator settings: " + "; ".join(problems) + "; see `lorenz operator --help`"
        )
        self.problems = problems


class LocalRunsForbidden(OperatorError):
    """A Workflow asks for ``worker.kind: local`` where the operator does not allow it.

    A local run is an agent inside the operator's own Pod: it shares the operator's
    filesystem and ServiceAccount token, so on a cluster with more than one team it would hand
    that token to any tenant. The platform team allows it per namespace (``--local-runs``).
    """

    code = ErrorCode.LOCAL_RUNS_FORBIDDEN

    def __init__(self, *, namespace: str) -> None:
        super().__init__(
            f"worker.kind local runs the agent inside the operator's Pod, with the operator's "
            f"credentials, and this operator does not allow it in namespace {namespace!r}: "
            "remove worker.kind: local so each run gets a Pod of its own (a platform team may "
            "allow local runs on a single-team cluster: --local-runs, the chart's "
            "operator.localRuns)",
            key_path="worker.kind",
        )
        self.namespace = namespace
