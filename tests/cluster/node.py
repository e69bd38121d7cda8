"""A real Kubernetes node for the test control plane: kubelet + containerd + runc.

The control plane (tests/cluster/controlplane.py) has no node, so no Pod would ever run. This
module adds one, built by tests/cluster/build.sh like the rest:

- a *holder* process (our `pause` command) started by `unshare` as PID 1 of new network, PID and
  mount namespaces. containerd, the kubelet, every shim and every container run inside them
  (`nsenter`), so the node can have a non-loopback address (NODE_IP, on a veth pair that exists
  only in its namespace — never on the host's interfaces), a CNI bridge for pods, a tmpfs over
  /run/containerd, and its mounts stay out of the host's mount table;
- teardown kills the holder: the kernel then kills every process left in the PID namespace, and
  the network and mount namespaces (with the pods' own network namespaces, their mounts and the
  bridge) vanish with their last process. `unshare --kill-child` plus PR_SET_PDEATHSIG make the
  same happen when pytest is SIGKILLed; `sweep_stale_nodes()` removes what a killed run leaves on
  disk (its data directory and the containers' cgroups);
- traffic across the namespace boundary goes through tests/cluster/portforward.py: the kubelet
  and pods reach the API server through forwarders on NODE_IP:6443 and on the `kubernetes`
  Service IP (10.0.0.1:443 — there is no kube-proxy), and the API server reaches the kubelet
  through its egress-selector CONNECT proxy;
- kube-scheduler runs on the host, next to the API server (one per control plane, shared with
  the kwok fake nodes: tests/cluster/scheduler.py);
- NetworkPolicies are enforced by kube-network-policies' engine beside the kubelet
  (tests/cluster/enforcer.py); tests can stop and start it.

Logs (containerd, kubelet, kube-scheduler, the namespace set-up) go to the control plane's log
directory, which the pytest summary prints.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.certs import issue_client_cert
from tests.cluster.cluster import Cluster, wait_until, write_kubeconfig
from tests.cluster.controlplane import (
    KUBERNETES_SERVICE_IP,
    NODE_IP,
    NODE_NETWORK,
    Binaries,
    ControlPlane,
    ControlPlaneError,
    _die_with_parent,
    _Process,
    runs_root,
)
from tests.cluster.enforcer import ENFORCER_BINARY, ENFORCER_USER, PolicyEnforcer
from tests.cluster.portforward import Forwarder
from tests.cluster.scheduler import ensure_scheduler

NODE_NAME = "lorenz-node"
POD_SUBNET = "10.77.1.0/24"
NODE_BINARIES = (
    "kubelet",
    "kube-scheduler",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "pause",
    "bridge",
    "host-local",
    "loopback",
    ENFORCER_BINARY,
)
# Test pods must tolerate this taint: it keeps the Pods of other tests (Deployments that used
# to stay Pending for lack of a node) off the node.
NODE_TAINT_KEY = "lorenz.test/node"
NODE_TOLERATION = {"key": NODE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
NODE_LABEL = "lorenz.test/node"
APISERVER_PORT_IN_NODE = 6443
_MARKER = "lorenz-test-node"  # in the holder's argv: how a sweep recognises our processes
_CGROUP_ROOT = "/sys/fs/cgroup"


class NodeError(ControlPlaneError):
    """The test node could not be started."""


def _run(argv: list[str], *, log: Path, timeout: float = 60.0) -> None:
    with log.open("ab") as out:
        out.write(f"== {time.strftime('%FT%T')} {' '.join(argv)}\n".encode())
        out.flush()
        done = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise NodeError(f"{argv[0]} exited with {done.returncode}; log {log}:\n{tail}")


@dataclass
class Node:
    """One node joined to `control_plane`'s API server. `start()`, then `stop()` (idempotent)."""

    control_plane: ControlPlane
    binaries: Binaries
    start_timeout: float = 120.0
    timings: dict[str, float] = field(default_factory=dict)
    holder: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _processes: list[_Process] = field(default_factory=list, repr=False)
    _forwarders: list[Forwarder] = field(default_factory=list, repr=False)
    _holder_pid: int = 0
    # overlayfs where the kernel allows it in the node's mount namespace, else native (a full
    # copy of the image per container: tens of seconds for the project's image on a busy host)
    snapshotter: str = "native"
    _kubelet: _Process | None = field(default=None, repr=False)
    _enforcer: PolicyEnforcer | None = field(default=None, repr=False)

    name: str = NODE_NAME

    @property
    def cluster(self) -> Cluster:
        return self.control_plane.cluster

    @property
    def dir(self) -> Path:
        return self.control_plane.run_dir / "node"

    @property
    def log_dir(self) -> Path:
        return self.control_plane.log_dir

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd.sock"

    def container_cgroups(self) -> list[Path]:
        """The cgroups of this node's sandboxes and containers that exist now."""
        return _container_cgroups(self.dir)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Node:
        reason = self.binaries.missing_reason(NODE_BINARIES)
        if reason is not None:
            raise NodeError(reason)
        began = time.monotonic()
        try:
            sweep_stale_nodes()
            self.dir.mkdir(parents=True, exist_ok=True)
            self._start_holder()
            self._set_up_network()
            self._start_forwarders()
            self._start_containerd()
            self._start_scheduler()
            self._spawn_enforcer()
            self._start_kubelet()
            self._wait_ready()
            self.start_network_policy_enforcer()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - began
        (self.log_dir / "node-timings.json").write_text(json.dumps(self.timings, indent=2))
        return self

    def stop(self) -> None:
        """Stop the kubelet and containerd, kill everything left in the node's namespaces,
        and delete the node's data (logs stay)."""
        proxy = self.control_plane.egress_proxy
        if proxy is not None:
            proxy.unroute(NODE_NETWORK)
        # NB: noted before anything stops: a container the kubelet or containerd removes
        # while shutting down is gone from containerd's root, but can leave its cgroup behind.
        cgroups = set(_container_cgroups(self.dir))
        if self._holder_pid:
            cgroups.update(_process_cgroups(node_processes(marker_pid=os.getpid())))
        self.stop_network_policy_enforcer()
        while self._processes:
            self._processes.pop().stop(grace=5.0)
        holder, self.holder = self.holder, None
        if holder is not None:
            _kill_holder(holder)
        while self._forwarders:
            self._forwarders.pop().close()
        cgroups.update(_container_cgroups(self.dir))
        _remove_cgroups(cgroups)
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def enforces_network_policy(self) -> bool:
        """Whether NetworkPolicies are enforced on this node now (the enforcer runs)."""
        return self._enforcer is not None and self._enforcer.running

    def stop_network_policy_enforcer(self) -> None:
        """Stop enforcing: the node then behaves as on a cluster whose CNI ignores
        NetworkPolicies (connections opened from now on pass)."""
        if self._enforcer is not None:
            self._enforcer.stop()

    def start_network_policy_enforcer(self) -> None:
        """Enforce again (returns once it does; a no-op while it runs)."""
        enforcer = self._enforcer
        if enforcer is None:
            raise NodeError("the node is not started")
        enforcer.start()
        self.timings.update(enforcer.timings)

    # -- pieces ------------------------------------------------------------------------------

    def _spawn_enforcer(self) -> None:
        kubeconfig = self._client_kubeconfig(
            stem="network-policy-enforcer",
            user=ENFORCER_USER,
            groups=(),
            server=f"https://{NODE_IP}:{APISERVER_PORT_IN_NODE}",
        )
        self._enforcer = PolicyEnforcer(
            cluster=self.cluster,
            binaries=self.binaries,
            kubeconfig=kubeconfig,
            node_name=self.name,
            pod_subnet=POD_SUBNET,
            state_dir=self.dir,
            log=self.log_dir / "network-policy-enforcer.log",
            in_node=self._nsenter,
        )
        self._enforcer.spawn()

    def _nsenter(self, argv: list[str]) -> list[str]:
        return [
            "nsenter",
            f"--target={self.holder_pid}",
            "--net",
            "--pid",
            "--mount",
            "--",
            *argv,
        ]

    def _start_holder(self) -> None:
        log = self.log_dir / "node-namespaces.log"
        # NB: --kill-child: if unshare dies (PR_SET_PDEATHSIG from a SIGKILLed pytest), the
        # holder is SIGKILLed too, and with it, as PID 1, the whole PID namespace.
        argv = [
            "unshare",
            "--net",
            "--pid",
            "--mount",
            "--propagation=private",
            "--fork",
            "--kill-child",
            "--mount-proc",
            str(self.binaries.path("pause")),
            _MARKER,
            str(os.getpid()),
        ]
        (self.dir / "pid").write_text(str(os.getpid()))
        with log.open("ab") as out:
            out.write(f"== {time.strftime('%FT%T')} {' '.join(argv)}\n".encode())
            out.flush()
            unshare = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                close_fds=True,
            )
        self.holder = unshare
        # The holder is unshare's child; nsenter needs *its* pid (the namespaces are its own).
        holder_pid = wait_until(
            lambda: _child_of(unshare.pid),
            timeout=10.0,
            interval=0.02,
            message="the node's namespace holder to start",
        )
        self._holder_pid = holder_pid
        (self.dir / "holder-pid").write_text(str(holder_pid))

    @property
    def holder_pid(self) -> int:
        return self._holder_pid

    def _in_node(self, script: str, *, log: str = "node-namespaces.log") -> None:
        _run(
            [
                "nsenter",
                f"--target={self.holder_pid}",
                "--net",
                "--pid",
                "--mount",
                "--",
                "sh",
                "-euxc",
                script,
            ],
            log=self.log_dir / log,
        )

    def _set_up_network(self) -> None:
        began = time.monotonic()
        for sub in (
            "containerd-root",
            "containerd-state",
            "kubelet",
            "pod-logs",
            "cni/net.d",
            "cni/ipam",
        ):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        # NB: the shims put their sockets under /run/containerd/s (a compiled-in path): a tmpfs
        # there, visible only in the node's mount namespace, keeps them apart from any host
        # containerd. The veth pair's both ends stay inside the namespace.
        self._in_node(
            f"""
            mkdir -p /run/containerd /run/netns
            mount -t tmpfs -o mode=0711 lorenz-node-run /run/containerd
            mount -t tmpfs -o mode=0755 lorenz-node-netns /run/netns
            ip link set lo up
            ip link add node0 type veth peer name node1
            ip addr add {NODE_IP}/24 dev node0
            ip addr add {KUBERNETES_SERVICE_IP}/32 dev node0
            ip link set node0 up
            ip link set node1 up
            ip route add default dev node0
            probe={self.dir / "overlay-probe"}
            mkdir -p $probe/lower $probe/upper $probe/work $probe/merged
            if mount -t overlay overlay \
                -o lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work $probe/merged
            then umount $probe/merged; echo overlayfs > {self.dir / "snapshotter"}
            else echo native > {self.dir / "snapshotter"}
            fi
            rm -rf $probe
            """
        )
        self.snapshotter = (self.dir / "snapshotter").read_text().strip()
        self.timings["namespaces"] = time.monotonic() - began

    def _start_forwarders(self) -> None:
        port = int(self.cluster.server.rsplit(":", 1)[1])
        target = ("127.0.0.1", port)
        for listen in ((NODE_IP, APISERVER_PORT_IN_NODE), (KUBERNETES_SERVICE_IP, 443)):
            self._forwarders.append(
                Forwarder(listen=listen, target=target, listen_netns=self.netns_path).start()
            )
        proxy = self.control_plane.egress_proxy
        if proxy is None:
            raise NodeError("the control plane runs without its egress proxy")
        proxy.route(NODE_NETWORK, self.netns_path)

    @property
    def netns_path(self) -> Path:
        return Path(f"/proc/{self.holder_pid}/ns/net")

    def forward_to_host(self, *, port: int, node_port: int | None = None) -> tuple[str, int]:
        """Make the host's 127.0.0.1:`port` reachable from pods at NODE_IP:`node_port` (default:
        the same port); returns that address."""
        forwarder = Forwarder(
            listen=(NODE_IP, node_port or port),
            target=("127.0.0.1", port),
            listen_netns=self.netns_path,
        ).start()
        self._forwarders.append(forwarder)
        return forwarder.listen

    def _spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> _Process:
        if env:
            argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
        proc = _Process(name=name, argv=argv, log=self.log_dir / f"{name}.log")
        proc.start()
        self._processes.append(proc)
        return proc

    def _containerd_config(self) -> str:
        pause_image = _pause_image_ref()
        bin_dir = self.binaries.directory
        return f"""\
version = 3
root = "{self.dir / "containerd-root"}"
state = "{self.dir / "containerd-state"}"

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{self.dir / "containerd.sock.ttrpc"}"

[debug]
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "{self.snapshotter}"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause_image}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  disable_apparmor = true
  # NB: without it runc fails: failed to update /proc/self/oom_score_adj: Permission denied
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      snapshotter = "{self.snapshotter}"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{bin_dir / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{bin_dir}"]
    conf_dir = "{self.dir / "cni/net.d"}"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

    def _cni_config(self) -> str:
        return json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "lorenz-pods",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "cni0",
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_SUBNET}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(self.dir / "cni/ipam"),
                        },
                    }
                ],
            },
            indent=2,
        )

    def _start_containerd(self) -> None:
        began = time.monotonic()
        config = self.dir / "containerd.toml"
        config.write_text(self._containerd_config())
        (self.dir / "cni/net.d/10-lorenz.conflist").write_text(self._cni_config())
        path = f"{self.binaries.directory}:/usr/sbin:/usr/bin:/sbin:/bin"
        proc = self._spawn(
            "containerd",
            self._nsenter(
                ["env", f"PATH={path}", str(self.binaries.path("containerd")), f"--config={config}"]
            ),
        )
        wait_until(
            lambda: self._ctr_ok(proc),
            timeout=60.0,
            interval=0.1,
            message=f"containerd to serve on {self.containerd_socket} (log {proc.log})",
        )
        self.timings["containerd"] = time.monotonic() - began
        from tests.cluster.images import pause_image

        # NB: before the kubelet starts: the sandbox image cannot be pulled from anywhere.
        self.import_image(pause_image(self.binaries).archive)

    def _ctr_ok(self, proc: _Process) -> bool:
        if proc.exited() is not None:
            raise NodeError(
                f"containerd exited with {proc.exited()}; log {proc.log}:\n{proc.tail()}"
            )
        if not self.containerd_socket.exists():
            return False
        done = subprocess.run(
            [*self.ctr(), "version"], capture_output=True, timeout=10.0, check=False
        )
        return done.returncode == 0

    def ctr(self, namespace: str = "k8s.io") -> list[str]:
        """argv prefix of `ctr` talking to this node's containerd."""
        return [
            str(self.binaries.path("ctr")),
            f"--address={self.containerd_socket}",
            f"--namespace={namespace}",
        ]

    def import_image(self, archive: Path) -> None:
        """`ctr images import` an OCI archive into the CRI's `k8s.io` namespace."""
        began = time.monotonic()
        _run(
            [*self.ctr(), "images", "import", "--no-unpack=false", str(archive)],
            log=self.log_dir / "images.log",
            timeout=600.0,
        )
        self.timings[f"import {archive.name}"] = time.monotonic() - began
        (self.log_dir / "node-timings.json").write_text(json.dumps(self.timings, indent=2))

    def _client_kubeconfig(
        self, *, stem: str, user: str, groups: tuple[str, ...], server: str
    ) -> Path:
        pki = self.control_plane.pki
        if pki is None:
            raise NodeError("control plane has no PKI")
        pair = issue_client_cert(
            ca=pki.ca, directory=self.dir / "pki", stem=stem, user=user, groups=groups
        )
        return write_kubeconfig(
            path=self.dir / f"{stem}.kubeconfig",
            server=server,
            ca_pem=self.cluster.ca_pem,
            user=user,
            client_cert_pem=pair.cert.read_bytes(),
            client_key_pem=pair.key.read_bytes(),
        )

    def _start_scheduler(self) -> None:
        # NB: shared with the kwok fake nodes (tests/cluster/scheduler.py): one per control
        # plane, stopped with it.
        ensure_scheduler(self.control_plane, self.binaries)

    def _kubelet_config(self) -> str:
        pki = self.control_plane.pki
        assert pki is not None
        zero = {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        }
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # NB: this host is cgroup v1; kubelet 1.35+ refuses to start on it without this.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            # NB: without QoS cgroups the kubelet gives the runtime no cgroup parent, and
            # containerd puts each container in /k8s.io/<id> under every hierarchy; stop() and
            # sweep_stale_nodes() remove those by the ids in containerd's root.
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": NODE_IP,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki.ca.cert)},
            },
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.dir / "pod-logs"),
            # NB: the host's disk is shared by everyone; eviction would taint the node.
            "evictionHard": zero,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "registerWithTaints": [
                {"key": NODE_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
            ],
            "serializeImagePulls": False,
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "resolvConf": "",
            "localStorageCapacityIsolation": True,
            "protectKernelDefaults": False,
            "shutdownGracePeriod": "0s",
        }
        return json.dumps(config, indent=2)

    def _start_kubelet(self) -> None:
        began = time.monotonic()
        kubeconfig = self._client_kubeconfig(
            stem="kubelet",
            user=f"system:node:{NODE_NAME}",
            groups=("system:nodes",),
            server=f"https://{NODE_IP}:{APISERVER_PORT_IN_NODE}",
        )
        config = self.dir / "kubelet.json"
        config.write_text(self._kubelet_config())
        self._kubelet = self._spawn(
            "kubelet",
            self._nsenter(
                [
                    "env",
                    f"PATH={self.binaries.directory}:/usr/sbin:/usr/bin:/sbin:/bin",
                    str(self.binaries.path("kubelet")),
                    f"--config={config}",
                    f"--kubeconfig={kubeconfig}",
                    f"--root-dir={self.dir / 'kubelet'}",
                    f"--cert-dir={self.dir / 'kubelet/pki'}",
                    f"--hostname-override={NODE_NAME}",
                    f"--node-ip={NODE_IP}",
                    f"--node-labels={NODE_LABEL}=true",
                    "--v=1",
                ]
            ),
        )
        self.timings["kubelet spawned"] = time.monotonic() - began

    def _wait_ready(self) -> None:
        began = time.monotonic()

        kubelet = self._kubelet
        assert kubelet is not None

        def ready() -> bool:
            code = kubelet.exited()
            if code is not None:
                raise NodeError(f"kubelet exited with {code}; log {kubelet.log}:\n{kubelet.tail()}")
            done = self.cluster.kubectl(
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                check=False,
            )
            return done.returncode == 0 and done.stdout.strip() == "True"

        try:
            wait_until(ready, timeout=self.start_timeout, interval=0.2, message="node Ready")
        except TimeoutError as err:
            raise NodeError(f"{err}; kubelet log {kubelet.log}:\n{kubelet.tail()}") from err
        self.timings["ready"] = time.monotonic() - began


def _pause_image_ref() -> str:
    from tests.cluster.images import PAUSE_IMAGE

    return PAUSE_IMAGE


def _child_of(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _kill_holder(unshare: subprocess.Popen[bytes]) -> None:
    """SIGKILL the namespace holder (PID 1 of the node's PID namespace: the kernel kills all
    the rest) and wait until unshare has reaped it."""
    holder = _child_of(unshare.pid)
    if holder is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(unshare.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        unshare.wait(timeout=30.0)


def node_processes(marker_pid: int | None = None) -> list[int]:
    """PIDs of live processes that belong to a test node (this run's when `marker_pid` is set):
    holders, found by their argv, and everything descended from them (containerd, the kubelet,
    shims, containers)."""
    parents: dict[int, int] = {}
    holders: list[int] = []
    pid_namespaces: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(proc.name)
        parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        with contextlib.suppress(OSError):
            pid_namespaces[pid] = os.readlink(proc / "ns/pid")
        ours = len(argv) >= 3 and argv[0].endswith(b"/pause") and argv[1] == _MARKER.encode()
        if ours and (marker_pid is None or argv[2] == str(marker_pid).encode()):
            holders.append(pid)
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    # NB: containerd and the kubelet are nsenter's children (in the node's PID namespace, but
    # not below the holder); shims and containers are the holder's (re-parented orphans).
    node_namespaces = {pid_namespaces[h] for h in holders if h in pid_namespaces}
    found: list[int] = []
    todo = [pid for pid, ns in pid_namespaces.items() if ns in node_namespaces]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.append(pid)
            todo.extend(children.get(pid, ()))
    return sorted(found)


_CRI_CGROUP_PARENT = "k8s.io"  # containerd's CRI namespace: the default cgroup parent


def _container_ids(node_dir: Path) -> set[str]:
    """Ids of every sandbox and container this node's containerd made (from its root)."""
    ids: set[str] = set()
    cri = node_dir / "containerd-root" / "io.containerd.grpc.v1.cri"
    for kind in ("containers", "sandboxes"):
        with contextlib.suppress(OSError):
            ids.update(p.name for p in (cri / kind).iterdir())
    tasks = node_dir / "containerd-state" / "io.containerd.runtime.v2.task" / "k8s.io"
    with contextlib.suppress(OSError):
        ids.update(p.name for p in tasks.iterdir())
    return ids


def _container_cgroups(node_dir: Path) -> list[Path]:
    ids = _container_ids(node_dir)
    found: list[Path] = []
    with contextlib.suppress(OSError):
        for hierarchy in Path(_CGROUP_ROOT).iterdir():
            for container_id in ids:
                candidate = hierarchy / _CRI_CGROUP_PARENT / container_id
                if candidate.is_dir():
                    found.append(candidate)
    return found


def _process_cgroups(pids: list[int]) -> set[Path]:
    """The containers' cgroups (under /k8s.io/) that these processes are in, every hierarchy."""
    found: set[Path] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                _, _controllers, path = line.split(":", 2)
                if not path.startswith(f"/{_CRI_CGROUP_PARENT}/"):
                    continue
                for hierarchy in Path(_CGROUP_ROOT).iterdir():
                    candidate = hierarchy / path.lstrip("/")
                    if candidate.is_dir():
                        found.add(candidate)
    return found


def _remove_cgroups(cgroups: set[Path]) -> None:
    """rmdir cgroups (empty once their processes are gone), leaves first."""
    for cgroup in cgroups:
        for dirpath, _dirs, _files in sorted(os.walk(cgroup), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def _remove_container_cgroups(node_dir: Path) -> None:
    """rmdir the cgroups of the node's containers (empty once their processes are gone)."""
    _remove_cgroups(set(_container_cgroups(node_dir)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_node_dirs() -> list[Path]:
    """Node data directories (under the control-plane runs) whose pytest is gone."""
    found = []
    root = runs_root()
    with contextlib.suppress(OSError):
        for run in root.iterdir():
            node_dir = run / "node"
            pid_file = node_dir / "pid"
            with contextlib.suppress(OSError, ValueError):
                if node_dir.is_dir() and not _alive(int(pid_file.read_text())):
                    found.append(node_dir)
    return found


def sweep_stale_nodes() -> list[str]:
    """Remove what SIGKILLed test runs left: node processes of dead pytests (normally already
    gone: PR_SET_PDEATHSIG), their cgroups and data directories. Returns what it removed."""
    removed: list[str] = []
    for pid in node_processes():
        with contextlib.suppress(OSError, ValueError):
            holder_argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if len(holder_argv) >= 3 and holder_argv[1] == _MARKER.encode():
                owner = int(holder_argv[2])
                if not _alive(owner):
                    os.kill(pid, signal.SIGKILL)
                    removed.append(f"process {pid}")
    for node_dir in stale_node_dirs():
        cgroups = _container_cgroups(node_dir)
        _remove_container_cgroups(node_dir)
        removed.extend(str(c) for c in cgroups if not c.exists())
        shutil.rmtree(node_dir, ignore_errors=True)
        removed.append(str(node_dir))
    if removed:
        print(f"tests/cluster/node.py: swept {len(removed)} leftovers: {removed}", file=sys.stderr)
    return removed


@dataclass
class KindNode:
    """The kind cluster's node in `Node`'s place (machines with Docker): images are loaded with
    `kind load image-archive`; its pods reach the host only the way Docker's network allows."""

    cluster: Cluster
    kind_path: Path
    cluster_name: str
    name: str
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_kind(cls, kind_cluster: Any, cluster: Cluster) -> KindNode:
        name = str(kind_cluster.name)
        return cls(
            cluster=cluster,
            kind_path=Path(kind_cluster.kind_path),
            cluster_name=name,
            name=f"{name}-control-plane",
        )

    @property
    def log_dir(self) -> Path | None:
        return self.cluster.log_dir

    def import_image(self, archive: Path) -> None:
        subprocess.run(
            [
                str(self.kind_path),
                "load",
                "image-archive",
                f"--name={self.cluster_name}",
                str(archive),
            ],
            check=True,
            timeout=600.0,
        )

    def forward_to_host(self, *, port: int, node_port: int | None = None) -> tuple[str, int]:
        raise NodeError("forward_to_host needs the test node (--test-cluster=envtest)")
