"""The one interface cluster tests use, whichever backend runs the cluster.

The envtest-style control plane (tests/cluster/controlplane.py) and a pytest-kind cluster both
end up as a kubeconfig for an admin user; everything a test does on top of that — kubectl and
helm with the right kubeconfig, installing CRDs, namespaces, ServiceAccount tokens and
kubeconfigs that act as a ServiceAccount under RBAC — lives here once, so the same tests run on
either backend.

NB: helpers shell out to the kubectl built at the pinned release (tests/cluster/build.sh), not
to whatever kubectl is on PATH, which may be many minor versions older than the API server.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

if TYPE_CHECKING:
    import kubernetes.client

T = TypeVar("T")

_MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class CommandError(subprocess.CalledProcessError):
    """A kubectl/helm call failed; unlike CalledProcessError, says what the tool printed."""

    def __str__(self) -> str:
        cmd = " ".join(str(part) for part in self.cmd)
        return (
            f"{cmd!r} exited with {self.returncode}\n"
            f"--- stderr ---\n{self.stderr or ''}\n--- stdout ---\n{self.output or ''}"
        )


class WaitAborted(AssertionError):
    """Raised by a :func:`wait_until` check when waiting longer cannot help (the process it
    waits for has exited): :func:`wait_until` lets it through at once instead of retrying."""


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.2,
    message: str,
) -> T:
    """Call `check` until it returns something other than None/False; fail after `timeout`.

    An exception from `check` is retried (the condition may not hold *yet*), except
    :class:`WaitAborted`, which ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
        except WaitAborted:
            raise
        except Exception as exc:  # NB: retried: the condition may not hold *yet*
            last_error = exc
        else:
            if result is not None and result is not False:
                return result
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s: {message}{detail}")
        time.sleep(interval)


def wait_while_progressing(
    progress: Callable[[], int],
    *,
    goal: int,
    stall_timeout: float,
    interval: float = 0.5,
    message: str,
    describe: Callable[[], str] | None = None,
) -> None:
    """Wait until ``progress()`` reaches ``goal``; fail only when it stops moving.

    For a wait whose length is the amount of work times the machine's speed (90 issues worked
    through after 30 failovers): a fixed bound either fails on a loaded machine or hides a
    stall for many minutes. Each step forward restarts the ``stall_timeout`` clock; ``describe``
    says what was left when it ran out.
    """
    best = progress()
    moved_at = time.monotonic()
    while best < goal:
        time.sleep(interval)
        now = progress()
        if now > best:
            best, moved_at = now, time.monotonic()
        elif time.monotonic() - moved_at >= stall_timeout:
            detail = f"; {describe()}" if describe is not None else ""
            raise TimeoutError(
                f"no progress for {stall_timeout:.0f}s at {best}/{goal}: {message}{detail}"
            )


def sigint_as_at_a_terminal() -> None:
    """`preexec_fn` for a child pytest that a test interrupts with SIGINT, as Ctrl-C would.

    NB: a shell without job control starts `cmd &` with SIGINT ignored, that survives exec, and
    Python then leaves it ignored: a suite started in the background (or by a CI runner that
    does so) would see its child sessions sleep through SIGINT. A terminal's pytest has it at
    the default, which Python turns into KeyboardInterrupt.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def write_kubeconfig(
    *,
    path: Path,
    server: str,
    ca_pem: bytes,
    user: str,
    client_cert_pem: bytes | None = None,
    client_key_pem: bytes | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> Path:
    """Write a single-context kubeconfig with its credentials embedded (so it can be copied)."""
    credentials: dict[str, str] = {}
    if client_cert_pem is not None and client_key_pem is not None:
        credentials["client-certificate-data"] = base64.b64encode(client_cert_pem).decode()
        credentials["client-key-data"] = base64.b64encode(client_key_pem).decode()
    if token is not None:
        credentials["token"] = token
    if not credentials:
        raise ValueError("a kubeconfig needs a client certificate and key, or a token")
    context: dict[str, str] = {"cluster": "lorenz-test", "user": user}
    if namespace is not None:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "lorenz-test",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "lorenz-test", "context": context}],
        "current-context": "lorenz-test",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def _manifest_files(paths: Iterable[Path | str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(
                sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _MANIFEST_SUFFIXES)
            )
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"no CRD manifest at {path}")
    return files


def _documents(text: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(text):
        if not isinstance(doc, dict):
            continue
        if doc.get("kind", "").endswith("List") and isinstance(doc.get("items"), list):
            docs.extend(item for item in doc["items"] if isinstance(item, dict))
        else:
            docs.append(doc)
    return docs


def _manifest_text(manifest: str | Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> str:
    if isinstance(manifest, str):
        return manifest
    if isinstance(manifest, Mapping):
        return yaml.safe_dump(dict(manifest), sort_keys=False)
    return yaml.safe_dump_all([dict(doc) for doc in manifest], sort_keys=False)


_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


def unique_name(prefix: str = "test") -> str:
    """A fresh DNS-1123 label such as `test-3f9a1c2b`."""
    stem = _DNS_LABEL.sub("-", prefix.lower()).strip("-")[:50] or "test"
    return f"{stem}-{uuid.uuid4().hex[:8]}"


@dataclass
class Cluster:
    """A running cluster as the tests see it: admin kubeconfig plus helpers around it.

    Built by a backend (envtest control plane or kind); its helpers are backend-agnostic.
    """

    backend: str  # "envtest" or "kind"
    kubeconfig: Path  # admin user (system:masters)
    server: str  # https://127.0.0.1:<port>
    ca_pem: bytes  # the CA that signed the API server's serving certificate
    workdir: Path  # scratch space for generated kubeconfigs and tool caches
    kubectl_bin: Path
    helm_bin: Path | None = None
    log_dir: Path | None = None  # control-plane logs, when the backend has them
    # Whether a kube-controller-manager runs: garbage collection, namespace cleanup, default
    # ServiceAccounts.
    has_controller_manager: bool = True

    # -- tools -------------------------------------------------------------------------------

    def environ(self, *, kubeconfig: Path | None = None) -> dict[str, str]:
        """os.environ for a subprocess (e.g. the operator) that should talk to this cluster:
        KUBECONFIG points at the admin kubeconfig, or at `kubeconfig`."""
        env = self._env()
        env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)
        return env

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)  # NB: never fall back to a developer's real cluster
        # NB: keep kubectl's discovery cache and helm's state inside this run, not in ~/.kube or
        # ~/.cache, where a cache from another cluster on the same port could be picked up.
        env["KUBECACHEDIR"] = str(self.workdir / "kube-cache")
        env["HELM_CACHE_HOME"] = str(self.workdir / "helm" / "cache")
        env["HELM_CONFIG_HOME"] = str(self.workdir / "helm" / "config")
        env["HELM_DATA_HOME"] = str(self.workdir / "helm" / "data")
        return env

    def _run(
        self,
        argv: Sequence[str],
        *,
        input: str | None,
        check: bool,
        timeout: float,
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            list(argv),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self._env(),
            check=False,
        )
        if check and proc.returncode != 0:
            raise CommandError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster (as admin unless `kubeconfig` says otherwise)."""
        argv = [str(self.kubectl_bin), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        return self._run(argv, input=input, check=check, timeout=timeout)

    def kubectl_json(
        self, *args: str, kubeconfig: Path | None = None, timeout: float = 60.0
    ) -> Any:
        """Run `kubectl ... -o json` and return the parsed output."""
        proc = self.kubectl(*args, "-o", "json", kubeconfig=kubeconfig, timeout=timeout)
        return json.loads(proc.stdout)

    def helm(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 300.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned helm CLI against this cluster."""
        if self.helm_bin is None or not self.helm_bin.is_file():
            raise FileNotFoundError(
                f"helm binary missing ({self.helm_bin}); run tests/cluster/build.sh"
            )
        argv = [str(self.helm_bin), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        return self._run(argv, input=input, check=check, timeout=timeout)

    def api_client(self, *, kubeconfig: Path | None = None) -> kubernetes.client.ApiClient:
        """A fresh `kubernetes` Python client for this cluster (close it when done)."""
        import kubernetes.config

        client: kubernetes.client.ApiClient = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig or self.kubeconfig)
        )
        return client

    # -- objects -----------------------------------------------------------------------------

    def apply(
        self,
        manifest: str | Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        namespace: str | None = None,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Server-side apply YAML text, one object or a list of objects."""
        args = ["apply", "--server-side", "--field-manager=lorenz-tests", "-f", "-"]
        if namespace is not None:
            args[1:1] = ["-n", namespace]
        return self.kubectl(*args, input=_manifest_text(manifest), kubeconfig=kubeconfig)

    def install_crds(self, *paths: Path | str, timeout: float = 60.0) -> list[str]:
        """Apply CRD manifests (files, or directories of .yaml/.yml/.json) and wait until
        every CRD among them is Established. Returns the CRD names."""
        files = _manifest_files(paths)
        if not files:
            raise FileNotFoundError(f"no CRD manifests in {[str(p) for p in paths]}")
        names: list[str] = []
        for path in files:
            names.extend(
                doc["metadata"]["name"]
                for doc in _documents(path.read_text())
                if doc.get("kind") == "CustomResourceDefinition"
            )
        if not names:
            raise ValueError(f"no CustomResourceDefinition in {[str(p) for p in files]}")
        # NB: server-side apply: a big CRD's schema overflows the 256 KiB last-applied annotation
        # that client-side apply would write.
        args = ["apply", "--server-side", "--force-conflicts", "--field-manager=lorenz-tests"]
        for path in files:
            args += ["-f", str(path)]
        self.kubectl(*args)
        self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={timeout:.0f}s",
            *(f"customresourcedefinition/{name}" for name in names),
            timeout=timeout + 10,
        )
        # NB: Established is not served: right after it, a list of the new resource may still
        # answer 429 "storage is (re)initializing" on a loaded host, and a test's first list
        # failed on it. Wait until each resource lists.
        deadline = time.monotonic() + timeout
        for name in names:
            while self.kubectl("get", name, "--all-namespaces", "-o", "name",
                               check=False).returncode != 0:
                if time.monotonic() > deadline:
                    self.kubectl("get", name, "--all-namespaces", "-o", "name")  # raises
                time.sleep(0.5)
        return names

    def create_namespace(
        self,
        name: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        wait_for_default_service_account: bool = True,
        timeout: float = 30.0,
    ) -> str:
        """Create a namespace (a fresh `test-xxxxxxxx` one when `name` is None); return its name.

        NB: pods are refused until the controller-manager has created the namespace's `default`
        ServiceAccount, so by default this waits for it (when a controller-manager runs).
        """
        name = name or unique_name()
        manifest: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": dict(labels or {})},
        }
        self.kubectl("create", "-f", "-", input=_manifest_text(manifest))
        if wait_for_default_service_account and self.has_controller_manager:
            self.kubectl(
                "wait",
                "--for=create",
                f"--timeout={timeout:.0f}s",
                "-n",
                name,
                "serviceaccount/default",
                timeout=timeout + 10,
            )
        return name

    def delete_namespace(self, name: str, *, wait: bool = False, timeout: float = 60.0) -> None:
        """Delete a namespace; with `wait`, until it is gone (needs the controller-manager)."""
        self.kubectl(
            "delete",
            "namespace",
            name,
            "--ignore-not-found",
            f"--wait={'true' if wait else 'false'}",
            f"--timeout={timeout:.0f}s",
            timeout=timeout + 10,
        )

    # -- identities --------------------------------------------------------------------------

    def create_service_account(self, *, namespace: str, name: str) -> None:
        """Create a ServiceAccount unless it exists."""
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace},
            }
        )

    def mint_service_account_token(
        self,
        *,
        namespace: str,
        name: str,
        audiences: Sequence[str] = (),
        duration_seconds: int = 3600,
        create: bool = True,
    ) -> str:
        """A bound token for ServiceAccount `namespace/name`, minted through the TokenRequest
        API (`kubectl create token`). With `create`, the ServiceAccount is created first."""
        if create:
            self.create_service_account(namespace=namespace, name=name)
        args = ["create", "token", name, "-n", namespace, f"--duration={duration_seconds}s"]
        args += [f"--audience={audience}" for audience in audiences]
        token = self.kubectl(*args).stdout.strip()
        if token.count(".") != 2:
            raise RuntimeError(f"TokenRequest returned no JWT for {namespace}/{name}: {token!r}")
        return token

    def kubeconfig_for_token(
        self, token: str, *, user: str, namespace: str | None = None, path: Path | None = None
    ) -> Path:
        """A kubeconfig that authenticates with `token` (bearer) against this cluster."""
        if path is None:
            path = self.workdir / "kubeconfigs" / f"{unique_name(user.replace(':', '-'))}.yaml"
        return write_kubeconfig(
            path=path,
            server=self.server,
            ca_pem=self.ca_pem,
            user=user,
            token=token,
            namespace=namespace,
        )

    def service_account_kubeconfig(
        self,
        *,
        namespace: str,
        name: str,
        duration_seconds: int = 3600,
        create: bool = True,
    ) -> Path:
        """Mint a token for `namespace/name` and return a kubeconfig that acts as it (its
        default namespace is `namespace`). This is how a test runs as the operator's
        ServiceAccount under the chart's RBAC."""
        token = self.mint_service_account_token(
            namespace=namespace, name=name, duration_seconds=duration_seconds, create=create
        )
        return self.kubeconfig_for_token(
            token, user=f"system:serviceaccount:{namespace}:{name}", namespace=namespace
        )

    def can_i(
        self, verb: str, resource: str, *, namespace: str | None = None, kubeconfig: Path
    ) -> bool:
        """`kubectl auth can-i` as the identity in `kubeconfig`."""
        args = ["auth", "can-i", verb, resource]
        if namespace is not None:
            args += ["-n", namespace]
        proc = self.kubectl(*args, kubeconfig=kubeconfig, check=False)
        answer = proc.stdout.strip()
        if answer not in ("yes", "no"):
            raise CommandError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return answer == "yes"


def cluster_from_kubeconfig(
    *,
    backend: str,
    kubeconfig: Path,
    workdir: Path,
    kubectl_bin: Path,
    helm_bin: Path | None,
    log_dir: Path | None = None,
) -> Cluster:
    """Wrap an existing admin kubeconfig (e.g. kind's) in the `Cluster` interface."""
    config = yaml.safe_load(kubeconfig.read_text())
    current = config.get("current-context")
    contexts = {c["name"]: c["context"] for c in config.get("contexts", [])}
    clusters = {c["name"]: c["cluster"] for c in config.get("clusters", [])}
    context = contexts[current] if current in contexts else next(iter(contexts.values()))
    entry = clusters[context["cluster"]]
    if "certificate-authority-data" in entry:
        ca_pem = base64.b64decode(entry["certificate-authority-data"])
    else:
        ca_pem = (kubeconfig.parent / entry["certificate-authority"]).read_bytes()
    return Cluster(
        backend=backend,
        kubeconfig=kubeconfig,
        server=entry["server"],
        ca_pem=ca_pem,
        workdir=workdir,
        kubectl_bin=kubectl_bin,
        helm_bin=helm_bin,
        log_dir=log_dir,
        has_controller_manager=True,
    )
