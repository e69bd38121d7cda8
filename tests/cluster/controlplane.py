"""An envtest-style Kubernetes control plane run from locally built binaries.

The operator is tested against a real API server, and this machine has no Docker for kind and
cannot download release binaries. tests/cluster/build.sh builds etcd, kube-apiserver,
kube-controller-manager and kubectl from the Go module proxy; this module starts them the way
controller-runtime's envtest does — etcd and kube-apiserver on random loopback ports, throwaway
certificates, RBAC, an admin client certificate in system:masters — plus a
kube-controller-manager (envtest has none), so ownerReference garbage collection, namespace
deletion and default ServiceAccounts work as in a real cluster.

Every process runs in its own process group, dies with the Python process (PR_SET_PDEATHSIG),
and is stopped by `ControlPlane.stop()`, which is idempotent and safe from atexit.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.cluster.cluster import Cluster, write_kubeconfig
from tests.cluster.portforward import ConnectProxy, egress_selector_config

if TYPE_CHECKING:
    from tests.cluster.certs import Pki

HERE = Path(__file__).resolve().parent
VERSIONS_FILE = HERE / "versions.env"
BUILD_SCRIPT = HERE / "build.sh"

# The binaries the envtest backend cannot start without; helm is checked when used.
CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
_KEEP_RUNS = 5  # finished run directories (logs) kept under runs_root()
# The `kubernetes` Service's ClusterIP (first address of --service-cluster-ip-range) and the
# test node's IP (tests/cluster/node.py): pods reach the API server at the first, the kubelet
# at the second, so the serving certificate names both.
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
NODE_IP = "10.77.0.2"
NODE_NETWORK = "10.77.0.0/16"  # the node's and its pods' addresses
SERVING_HOSTS = (
    "localhost",
    "127.0.0.1",
    KUBERNETES_SERVICE_IP,
    NODE_IP,
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


class ControlPlaneError(RuntimeError):
    """The control plane could not be found, started or reached."""


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """The pins from versions.env (KEY=VALUE lines, `#` comments)."""
    versions: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            versions[key.strip()] = value.strip()
    return versions


def cache_root() -> Path:
    """Where build.sh puts its output: $LORENZ_K8S_CACHE or ~/.cache/lorenz/k8s."""
    env = os.environ.get("LORENZ_K8S_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lorenz" / "k8s"


def runs_root() -> Path:
    """Where each control-plane run keeps its logs (and, while running, data and certs)."""
    return Path(tempfile.gettempdir()) / "lorenz-controlplane"


@dataclass(frozen=True)
class Binaries:
    """The built binaries, by name; `directory` is build.sh's bin/ for the pinned version."""

    directory: Path
    versions: dict[str, str]

    @classmethod
    def locate(cls) -> Binaries:
        """$LORENZ_K8S_BIN if set, else <cache>/<K8S_VERSION>/bin. Never raises."""
        versions = read_versions()
        env = os.environ.get("LORENZ_K8S_BIN")
        directory = Path(env) if env else cache_root() / versions["K8S_VERSION"] / "bin"
        return cls(directory=directory, versions=versions)

    def path(self, name: str) -> Path:
        return self.directory / name

    def missing(self, names: Sequence[str] = CONTROL_PLANE_BINARIES) -> list[str]:
        return [n for n in names if not os.access(self.path(n), os.X_OK)]

    def missing_reason(self, names: Sequence[str] = CONTROL_PLANE_BINARIES) -> str | None:
        """Why the control plane cannot start for lack of binaries, or None."""
        missing = self.missing(names)
        if not missing:
            return None
        log = cache_root() / self.versions["K8S_VERSION"] / "build.log"
        return (
            f"control-plane binaries missing from {self.directory}: {', '.join(missing)}. "
            f"Build them with {BUILD_SCRIPT} (./scripts/bootstrap runs it; the first build "
            f"takes tens of minutes); build log: {log}"
        )

    def require(self, names: Sequence[str] = CONTROL_PLANE_BINARIES) -> None:
        """Raise ControlPlaneError saying how to get the binaries when any is missing."""
        reason = self.missing_reason(names)
        if reason is not None:
            raise ControlPlaneError(reason)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(_free_port())
    return sorted(ports)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # NB: if pytest is SIGKILLed no teardown runs; the kernel then kills the children instead.
    # (PDEATHSIG fires when the *thread* that forked exits: the fixture starts these from the
    # main thread.)
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class _Process:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"== {time.strftime('%FT%T')} {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: signals go to it alone
                preexec_fn=_die_with_parent,
                close_fds=True,
            )

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, *, grace: float = 10.0) -> None:
        popen, self.popen = self.popen, None
        if popen is None or popen.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, sig)
            try:
                popen.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _get(url: str, *, context: ssl.SSLContext | None, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) for one test session.

    `start()` returns the `Cluster` the tests use; `stop()` ends every process and deletes
    data and certificates, keeping the logs in `log_dir`.
    """

    binaries: Binaries
    controller_manager: bool = True
    start_timeout: float = 60.0
    run_dir: Path = field(init=False)
    timings: dict[str, float] = field(default_factory=dict)
    _processes: list[_Process] = field(default_factory=list, repr=False)
    _cluster: Cluster | None = field(default=None, repr=False)
    egress_proxy: ConnectProxy | None = field(default=None, repr=False)
    pki: Pki | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        root = runs_root()
        root.mkdir(parents=True, exist_ok=True)
        _prune_runs(root)
        self.run_dir = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=root))
        (self.run_dir / "pid").write_text(str(os.getpid()))
        self.log_dir.mkdir()

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            raise ControlPlaneError("control plane not started")
        return self._cluster

    def pids(self) -> dict[str, int]:
        """``{component: pid}`` of the processes running now (etcd, kube-apiserver, ...)."""
        return {
            proc.name: proc.popen.pid
            for proc in self._processes
            if proc.popen is not None and proc.popen.poll() is None
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Cluster:
        """Start everything and wait until it serves; on any failure stop what was started."""
        self.binaries.require()
        # NB: imported here, not at module level: this module is loaded by every pytest run
        # (through the fixtures plugin), and a missing package must fail only cluster tests.
        try:
            from tests.cluster.certs import generate_pki
        except ImportError as err:
            raise ControlPlaneError(
                f"cannot generate the control plane's certificates: {err}. The `cryptography` "
                "package must be in the project's test extras (pyproject.toml)."
            ) from err
        began = time.monotonic()
        try:
            pki = generate_pki(directory=self.run_dir / "pki", hosts=SERVING_HOSTS)
            self.pki = pki
            # NB: the API server reaches kubelets (logs, exec, port-forward) through this proxy:
            # the test node lives in a network namespace the host cannot route to.
            self.egress_proxy = ConnectProxy(path=self.run_dir / "egress.sock").start()
            self._start_with_port_retries(pki)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - began
        (self.log_dir / "timings.json").write_text(json.dumps(self.timings, indent=2))
        return self.cluster

    def _start_with_port_retries(self, pki: Pki) -> None:
        # NB: a "free" port can be taken by someone else between probing and binding (other test
        # sessions run on this machine too): on "address already in use", pick new ports.
        for attempt in range(3):
            etcd_client, etcd_peer, apiserver, kcm = _free_ports(4)
            try:
                self._start_etcd(client=etcd_client, peer=etcd_peer)
                self._start_apiserver(pki=pki, port=apiserver, etcd_client=etcd_client)
                if self.controller_manager:
                    self._start_controller_manager(pki=pki, port=kcm)
                return
            except ControlPlaneError as err:
                if attempt == 2 or "address already in use" not in str(err):
                    raise
                self._stop_processes()

    def stop(self) -> None:
        """Stop every process (reverse start order); delete everything but the logs (data,
        keys, kubeconfigs with embedded credentials, tool caches)."""
        self._stop_processes()
        if self.egress_proxy is not None:
            self.egress_proxy.close()
            self.egress_proxy = None
        if not self.run_dir.is_dir():
            return
        for entry in self.run_dir.iterdir():
            if entry == self.log_dir:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()

    def _stop_processes(self) -> None:
        while self._processes:
            self._processes.pop().stop()

    # -- components --------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> _Process:
        proc = _Process(name=name, argv=argv, log=self.log_dir / f"{name}.log")
        proc.start()
        self._processes.append(proc)
        return proc

    def _wait_healthy(
        self,
        proc: _Process,
        *,
        url: str,
        context: ssl.SSLContext | None,
        ok: str,
    ) -> None:
        began = time.monotonic()
        deadline = began + self.start_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            code = proc.exited()
            if code is not None:
                raise ControlPlaneError(
                    f"{proc.name} exited with {code} during start-up; log {proc.log}:\n"
                    f"{proc.tail()}"
                )
            try:
                status, body = _get(url, context=context)
            except OSError as err:
                last = repr(err)
            else:
                if status == 200 and ok in body:
                    self.timings[proc.name] = time.monotonic() - began
                    return
                last = f"HTTP {status}: {body[:500]}"
            time.sleep(0.1)
        raise ControlPlaneError(
            f"{proc.name} not healthy at {url} after {self.start_timeout:.0f}s ({last}); "
            f"log {proc.log}:\n{proc.tail()}"
        )

    def _start_etcd(self, *, client: int, peer: int) -> None:
        client_url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        data = self.run_dir / "etcd-data"
        shutil.rmtree(data, ignore_errors=True)
        proc = self._spawn(
            "etcd",
            [
                str(self.binaries.path("etcd")),
                "--name=lorenz-test",
                f"--data-dir={data}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=lorenz-test={peer_url}",
                "--initial-cluster-state=new",
                # NB: test data need not survive a crash; fsync on every write is what makes
                # etcd slow on a shared disk.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait_healthy(proc, url=f"{client_url}/health", context=None, ok='"health":"true"')

    def _start_apiserver(self, *, pki: Pki, port: int, etcd_client: int) -> None:
        server = f"https://127.0.0.1:{port}"
        admission = (
            () if self.controller_manager else ("--disable-admission-plugins=ServiceAccount",)
        )
        egress: tuple[str, ...] = ()
        if self.egress_proxy is not None:
            config = self.run_dir / "egress-selector.yaml"
            config.write_text(egress_selector_config(self.egress_proxy.path))
            egress = (f"--egress-selector-config-file={config}",)
        proc = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.path("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.run_dir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving.cert}",
                f"--tls-private-key-file={pki.serving.key}",
                f"--client-ca-file={pki.ca.cert}",
                # NB: Node before RBAC: kubelets (user system:node:<name>) are authorized by
                # the Node authorizer, as in a real cluster; RBAC binds nothing to system:nodes.
                "--authorization-mode=Node,RBAC",
                f"--kubelet-client-certificate={pki.kubelet_client.cert}",
                f"--kubelet-client-key={pki.kubelet_client.key}",
                # NB: the default tries the node's Hostname first, which nothing resolves here.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--allow-privileged=true",
                f"--service-account-issuer={server}",
                f"--service-account-key-file={pki.sa_public_key}",
                f"--service-account-signing-key-file={pki.sa_private_key}",
                # NB: without a controller-manager nothing creates the `default` ServiceAccount,
                # and the ServiceAccount admission plugin would then refuse every pod (envtest
                # disables it for that reason).
                *admission,
                *egress,
                # NB: the API server advertises itself in default/kubernetes Endpoints; a loopback
                # address is invalid there and the host may have no routable one. No pod here
                # calls the API through that Service, so: no endpoint reconciler.
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
            ],
        )
        context = ssl.create_default_context(cafile=str(pki.ca.cert))
        context.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
        self._wait_healthy(proc, url=f"{server}/readyz", context=context, ok="ok")
        kubeconfig = write_kubeconfig(
            path=self.run_dir / "kubeconfig",
            server=server,
            ca_pem=pki.ca.cert.read_bytes(),
            user="lorenz-admin",
            client_cert_pem=pki.admin.cert.read_bytes(),
            client_key_pem=pki.admin.key.read_bytes(),
        )
        self._cluster = Cluster(
            backend="envtest",
            kubeconfig=kubeconfig,
            server=server,
            ca_pem=pki.ca.cert.read_bytes(),
            workdir=self.run_dir,
            kubectl_bin=self.binaries.path("kubectl"),
            helm_bin=self.binaries.path("helm"),
            log_dir=self.log_dir,
            has_controller_manager=self.controller_manager,
        )

    def _start_controller_manager(self, *, pki: Pki, port: int) -> None:
        cluster = self.cluster
        kubeconfig = write_kubeconfig(
            path=self.run_dir / "controller-manager.kubeconfig",
            server=cluster.server,
            ca_pem=cluster.ca_pem,
            user="system:kube-controller-manager",
            client_cert_pem=pki.controller_manager.cert.read_bytes(),
            client_key_pem=pki.controller_manager.key.read_bytes(),
        )
        proc = self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.path("kube-controller-manager")),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                # NB: otherwise it keeps asking kube-system/extension-apiserver-authentication for
                # a front-proxy CA that this API server has none of, and logs an error each time.
                "--authentication-skip-lookup=true",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.run_dir / 'kcm-certs'}",
                "--controllers=*",
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={pki.sa_private_key}",
                f"--root-ca-file={pki.ca.cert}",
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )
        # NB: its serving certificate is self-signed (in --cert-dir); /healthz needs no auth.
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        self._wait_healthy(proc, url=f"https://127.0.0.1:{port}/healthz", context=insecure, ok="ok")


def _prune_runs(root: Path) -> None:
    """Delete old run directories whose pytest is gone, keeping the newest few for their logs."""
    runs = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True)
    for old in runs[_KEEP_RUNS:]:
        pid_file = old / "pid"
        with contextlib.suppress(OSError, ValueError):
            if pid_file.exists() and _alive(int(pid_file.read_text())):
                continue
            shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
