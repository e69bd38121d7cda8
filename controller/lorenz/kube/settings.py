"""Settings of one operator process: from ``lorenz operator`` flags and the environment.

What a Workflow cannot decide — where workspaces live, how leases are timed, which ports the
process serves — is set per operator process. Each field is declared once, here, with its
default and a docstring; the ``lorenz operator`` flags (``--lease-duration-seconds``) and
environment variables (``LORENZ_OPERATOR_LEASE_DURATION_SECONDS``, what the Helm chart sets)
are derived from the field names, never listed by hand. Precedence: flag > environment >
default. Lists (``namespaces``) are comma-separated in both.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import Field

from lorenz.kube.errors import InvalidOperatorSettings
from lorenz.kube.leaderelection.leases import LeaseTiming

ENV_PREFIX = "LORENZ_OPERATOR_"
DEFAULT_AGENT_ENV_PASSTHROUGH = (
    "PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR",
)
"""What an agent needs of a process environment to run at all: no credentials."""


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_lease_namespace() -> str:
    """The operator's own namespace: ``$POD_NAMESPACE``, else the pod's ServiceAccount
    namespace, else ``default`` (a process outside a cluster)."""
    explicit = os.environ.get("POD_NAMESPACE", "").strip()
    if explicit:
        return explicit
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def default_identity() -> str:
    """``<pod name or hostname>_<8 hex>``: unique per process, readable in ``kubectl get wf``."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


class OperatorSettings(pydantic.BaseModel):
    """One operator process."""

    model_config = pydantic.ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_default=True, frozen=True
    )

    identity: str = Field(default_factory=default_identity, min_length=1, max_length=128)
    """This replica's identity: the Lease holder name and the owner written into Claims. It must
    be unique per process, so the default adds a random suffix to the pod name."""

    namespaces: tuple[str, ...] = ()
    """Namespaces whose Workflows this process serves; empty serves every namespace (needs a
    ClusterRole; with a list, a Role per namespace suffices)."""

    workspace_root: str = Field(
        default_factory=lambda: str(Path(tempfile.gettempdir()) / "lorenz-operator"),
        min_length=1,
    )
    """Volume that holds every Workflow's workspaces, as ``<root>/<namespace>/<name>/``
    (relative ``tracker.path`` values of a Workflow resolve against that folder too)."""

    lease_duration_seconds: int = Field(default=15, ge=1)
    """Followers take a Workflow over after this long without an observed Lease renewal."""

    renew_deadline_seconds: float = Field(default=10.0, gt=0)
    """A leader that could not renew for this long stops its runtime (must be shorter than
    the lease duration: the difference is the safety margin against two leaders)."""

    retry_period_seconds: float = Field(default=3.0, gt=0)
    """How often leaders renew and followers try to acquire. Lease writes are one per held
    shard and one per replica each period, so this sets the idle write rate: 3 s gives three
    renewal attempts within the 10 s renew deadline and keeps a takeover after a crash within
    the lease duration plus one period (client-go's 2 s costs half as many writes again)."""

    shards: int = Field(default=16, ge=1, le=256)
    """How many shard Leases the Workflows are spread over. Each Workflow belongs to one shard
    (a stable hash of ``<namespace>/<name>``) and is run by the replica holding that shard's
    Lease, so Lease writes grow with shards and replicas, never with Workflows (one renewal per
    held shard and one per replica each retry period). Replicas balance shards between them
    (at most ``ceil(shards / live replicas)`` each), so this is also the most replicas that can
    share the work. Every replica of one operator must use the same value: a replica that sees
    a live peer count shards differently takes no shard until the peer is gone."""

    lease_namespace: str = Field(
        default_factory=default_lease_namespace, min_length=1, max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    )
    """The namespace of the shard and membership Leases: the operator's own
    (``$POD_NAMESPACE``, else the pod's ServiceAccount namespace, else ``default``). No Lease
    is ever written anywhere else."""

    lease_name_prefix: str = Field(
        default="lorenz", min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    )
    """Names of the Leases: ``<prefix>-shard-<n>`` and ``<prefix>-replica-<identity>``. Two
    operator installations that share a namespace need different prefixes (the chart uses the
    release's full name)."""

    status_interval_seconds: float = Field(default=1.0, ge=0)
    """At most one Workflow status patch per this interval (and only when it changed)."""

    first_status_wait_seconds: float = Field(default=10.0, ge=0)
    """A Workflow's first status after its leader takes it (a new Workflow, a failover) waits
    up to this long for the runtime's first poll (or its failure), so that it is written once
    as ``Ready`` instead of ``Starting`` and then ``Ready``; a slower start shows ``Starting``
    when this runs out. 0 writes ``Starting`` at once."""

    idle_status_interval_seconds: float = Field(default=3600.0, ge=0)
    """While only the poll bookkeeping changes (``status.poll.lastPollAt``, ``nextPollAt``,
    ``count``), at most one status patch per Workflow per this interval; anything else a user
    sees (conditions, lanes, counts, errors) is written at once. An idle Workflow's status is
    thus a heartbeat this coarse (the default: one patch an hour, 0.28/s for 1,000 Workflows),
    not a record of every tick; the operator's API and metrics always have the current
    values."""

    max_continuation_runs: int = Field(default=10, ge=0)
    """A ceiling on every Workflow's ``agent.maxContinuationRuns``: an agent that ends cleanly
    while its issue stays active is run again (a continuation retry), and after that many
    continuation re-runs of one slot in a row the core blocks the slot; the operator then holds
    the issue (the ``lorenz.dev/hold`` annotation on its Claim) and says so in a
    ``ContinuationLimit`` Event. A Workflow may ask for fewer, never for more (nor for none);
    0 leaves each Workflow's own value."""

    events_per_minute: int = Field(default=30, ge=0)
    """Kubernetes Events posted per Workflow per minute, at most (bursts up to this many);
    0 posts none."""

    start_backoff_seconds: float = Field(default=5.0, gt=0)
    """After a Workflow's runtime failed to start (its tracker cannot be built, its Claims
    cannot be read), the first retry waits this long; each further failure doubles the wait,
    up to ``start_backoff_max_seconds``. A spec change retries at once."""

    start_backoff_max_seconds: float = Field(default=300.0, gt=0)
    """The longest wait between two start attempts of a failing Workflow."""

    drain_timeout_seconds: float = Field(default=30.0, gt=0)
    """On stop, how long runs get to settle before the process moves on."""

    request_timeout_seconds: float = Field(default=10.0, gt=0)
    """Timeout of each API request the operator makes itself (Lease requests use half the
    renew deadline)."""

    kubeconfig: str | None = None
    """The kubeconfig file; unset = ``$KUBECONFIG``, ``~/.kube/config``, then the pod's
    ServiceAccount."""

    liveness_endpoint: str | None = "http://0.0.0.0:8080/healthz"
    """kopf's liveness probe URL (empty disables it)."""

    api_host: str = "0.0.0.0"
    """Address of the metrics and snapshot API server."""

    api_port: int | None = Field(default=9090, ge=0, le=65535)
    """Port of the metrics (``/metrics``) and snapshot API (``/api/v1/workflows``) server;
    unset disables it, 0 picks a free port."""

    webhook_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the webhook Service's route ``POST /webhooks/<namespace>/<workflow>`` (on
    ``api_host``, no token: deliveries are verified by their signature, see docs/webhooks.md);
    unset disables it, 0 picks a free port. Every replica needs the same port: a replica that
    does not lead a Workflow forwards its deliveries to the leader's."""

    api_auth: Literal["kubernetes", "none"] = "kubernetes"
    """Who may call the API: ``kubernetes`` — a bearer token the API server accepts
    (TokenReview) whose user may read the Workflow in its namespace (SubjectAccessReview), as
    kube-rbac-proxy does; ``none`` — anyone who can reach the port (only behind a proxy that
    authenticates, or on a trusted network)."""

    api_open_paths: tuple[str, ...] = ("/healthz",)
    """Paths served without authentication even with ``api_auth: kubernetes``: ``/healthz``
    (counts only; the readiness probe sends no token), add ``/metrics`` for a Prometheus that
    sends no token; empty authenticates everything."""

    advertise_url: str | None = None
    """The URL other replicas and ``kubectl get wf`` show for this process's API (written to
    the Lease and the Workflow status); unset leaves it out."""

    agent_env_passthrough: tuple[str, ...] = DEFAULT_AGENT_ENV_PASSTHROUGH
    """The only variables of the operator's own environment that agents and hooks get (each
    run adds its ``LORENZ_*`` variables and the agent kind's ``env`` from the spec). Nothing
    else of the operator's environment — credentials set through the chart's
    ``operator.env``, ``KUBECONFIG``, ``LORENZ_OPERATOR_*`` — ever reaches an agent."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Minimum level of process logs."""

    worker_image: str | None = None
    """The image of a run's Pod (``worker.kind: pod``) when its Workflow names none in
    ``worker.podTemplate.image``; the chart sets the operator's own image. Unset, such a run
    fails with ``worker_image_missing``."""

    local_runs: bool = False
    """Allow ``worker.kind: local``: a Workflow's agents then run inside this operator's own
    Pod, with its filesystem and its ServiceAccount token (which reads every Workflow's tracker
    Secret). Only for a single-team cluster, where whoever writes a Workflow may hold the
    operator's rights anyway. Off, a Workflow that asks for it is ``Degraded``
    (``local_runs_forbidden``) and runs nothing."""

    local_runs_namespaces: tuple[str, ...] = ()
    """With ``local_runs`` on, the namespaces whose Workflows may use it; empty = every
    namespace this operator serves."""

    network_policy_probe: bool = True
    """Check that NetworkPolicy is enforced where a Workflow's runs go to Pods: a tiny probe
    Pod with the run Pods' labels (so ``lorenz-runs-<workflow>`` selects it), the Workflow's
    run image and scheduling, tries to connect to this process's API (``advertise_url``),
    which that policy refuses. The answer is the Workflow's ``NetworkPolicyEnforced``
    condition (``False``: a ``NetworkPolicyNotEnforced`` Event too). One probe at a time per
    process, once per namespace per ``network_policy_probe_interval_seconds``; off: no probe
    Pod and no such condition."""

    network_policy_probe_interval_seconds: float = Field(default=3600.0, gt=0)
    """How long a namespace's NetworkPolicy probe answer holds before the next probe (a probe
    that could not answer is tried again after at most 5 minutes)."""

    @pydantic.field_validator(
        "namespaces", "agent_env_passthrough", "api_open_paths", "local_runs_namespaces",
        mode="before",
    )
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @pydantic.field_validator(
        "liveness_endpoint", "kubeconfig", "advertise_url", "worker_image", mode="before"
    )
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @pydantic.model_validator(mode="after")
    def _consistent_lease_timing(self) -> OperatorSettings:
        self.lease_timing()  # raises InvalidOperatorSettings
        return self

    def lease_timing(self) -> LeaseTiming:
        """The three Lease durations, checked against each other (client-go's rules)."""
        return LeaseTiming(
            lease_duration_s=self.lease_duration_seconds,
            renew_deadline_s=self.renew_deadline_seconds,
            retry_period_s=self.retry_period_seconds,
        )

    def allows_local_runs(self, namespace: str) -> bool:
        """Whether a Workflow of ``namespace`` may run its agents in this process
        (``worker.kind: local``)."""
        if not self.local_runs:
            return False
        return not self.local_runs_namespaces or namespace in self.local_runs_namespaces

    def workflow_dir(self, namespace: str, name: str) -> Path:
        """The folder of one Workflow on the workspace volume."""
        return Path(self.workspace_root).absolute() / namespace / name


def env_name(field: str) -> str:
    """``lease_duration_seconds`` → ``LORENZ_OPERATOR_LEASE_DURATION_SECONDS``."""
    return f"{ENV_PREFIX}{field.upper()}"


def flag_name(field: str) -> str:
    """``lease_duration_seconds`` → ``--lease-duration-seconds``."""
    return "--" + field.replace("_", "-")


def load_settings(
    *, flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> OperatorSettings:
    """Settings from ``flags`` (field name → value; ``None`` = not given) over ``environ``.

    Raises :class:`InvalidOperatorSettings` naming each bad flag or variable.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for field in OperatorSettings.model_fields:
        name = env_name(field)
        if name in env:
            values[field] = env[name]
            origin[field] = name
    for field, value in (flags or {}).items():
        if value is not None:
            values[field] = value
            origin[field] = flag_name(field)
    try:
        return OperatorSettings.model_validate(values)
    except InvalidOperatorSettings:
        raise
    except pydantic.ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            field = str(error["loc"][0]) if error["loc"] else ""
            where = origin.get(field, field or "settings")
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"{where}: {message}")
        raise InvalidOperatorSettings(problems) from None
