"""NetworkPolicy enforcement on the test node: kube-network-policies' policy engine beside the
kubelet.

The node's bridge CNI enforces nothing, so without this a NetworkPolicy on the test cluster is
only an object: a test could not tell a policy that isolates from one that does not.
kube-network-policies (kubernetes-sigs) decides per connection in userspace: the first packet
of each connection goes to an nfqueue, its policy engine says accept or drop. Its own command
steers packets with nftables' `queue` expression, which this host's kernel lacks (no nft_queue,
no /lib/modules); `tools/netpol/main.go` (built by build.sh at `NETWORK_POLICIES_VERSION`) keeps
upstream's engine and steers with iptables-nft's xtables `NFQUEUE` target instead, which works
here. It runs in the node's network, PID and mount namespaces like the kubelet, as a user of
its own with read access to Pods, Namespaces and NetworkPolicies, and logs to
`network-policy-enforcer.log` in the control plane's log directory.

What it enforces: connections opened from or to the Pod subnet (Pod to Pod, Pod to the node's
addresses), judged on their first packet. Not: the node's own connections to Pods (the
kubelet's probes, the API server's egress proxy), and connections that were open before a
policy was seen. Its rules pass packets (`--queue-bypass`) while it is stopped, so stopping it
(`Node.stop_network_policy_enforcer()`) gives the node of a cluster that does not enforce.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.cluster import Cluster, wait_until
from tests.cluster.controlplane import Binaries, ControlPlaneError, _Process

ENFORCER_BINARY = "netpol"
ENFORCER_USER = "lorenz:network-policy-enforcer"
NFQUEUE_ID = 100
_RBAC_NAME = "lorenz-test-network-policy-enforcer"


class EnforcerError(ControlPlaneError):
    """The NetworkPolicy enforcer could not be started."""


def enforcer_rbac() -> list[dict[str, object]]:
    """What the enforcer may read: the objects upstream's engine watches, nothing else."""
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": _RBAC_NAME},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "namespaces"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["networking.k8s.io"],
                    "resources": ["networkpolicies"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": _RBAC_NAME},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": _RBAC_NAME,
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": ENFORCER_USER}
            ],
        },
    ]


@dataclass
class PolicyEnforcer:
    """The enforcer process of one node: `start()` returns once policies are enforced,
    `stop()` (idempotent) once its steering rules are gone."""

    cluster: Cluster
    binaries: Binaries
    kubeconfig: Path
    node_name: str
    pod_subnet: str
    state_dir: Path  # the node's data directory: the ready file
    log: Path
    # argv -> the same argv run inside the node's namespaces (Node._nsenter)
    in_node: Callable[[list[str]], list[str]]
    start_timeout: float = 60.0
    timings: dict[str, float] = field(default_factory=dict)
    _process: _Process | None = field(default=None, repr=False)
    _began: float = field(default=0.0, repr=False)

    @property
    def ready_file(self) -> Path:
        return self.state_dir / "network-policy-enforcer.ready"

    @property
    def running(self) -> bool:
        process = self._process
        return process is not None and process.exited() is None and self.ready_file.exists()

    def spawn(self) -> None:
        """Start the process; `wait_ready()` waits until it enforces (so a node can start its
        kubelet meanwhile)."""
        if self._process is not None and self._process.exited() is None:
            return
        self.cluster.apply(enforcer_rbac())
        self.ready_file.unlink(missing_ok=True)
        argv = self.in_node(
            [
                "env",
                "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                str(self.binaries.path(ENFORCER_BINARY)),
                f"--kubeconfig={self.kubeconfig}",
                f"--hostname-override={self.node_name}",
                f"--pod-cidr={self.pod_subnet}",
                f"--nfqueue-id={NFQUEUE_ID}",
                f"--ready-file={self.ready_file}",
                "--v=1",
            ]
        )
        self._process = _Process(name="network-policy-enforcer", argv=argv, log=self.log)
        self._began = time.monotonic()
        self._process.start()

    def wait_ready(self) -> None:
        process = self._process
        if process is None:
            raise EnforcerError("the NetworkPolicy enforcer was not spawned")

        def ready() -> bool:
            code = process.exited()
            if code is not None:
                raise EnforcerError(
                    f"the NetworkPolicy enforcer exited with {code}; log {self.log}:\n"
                    f"{process.tail()}"
                )
            return self.ready_file.exists()

        try:
            wait_until(
                ready,
                timeout=self.start_timeout,
                interval=0.05,
                message="the NetworkPolicy enforcer to enforce",
            )
        except TimeoutError as err:
            raise EnforcerError(f"{err}; log {self.log}:\n{process.tail()}") from err
        self.timings["network-policy enforcer"] = time.monotonic() - self._began

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def stop(self) -> None:
        """SIGTERM: the enforcer removes its steering rules, then exits."""
        process, self._process = self._process, None
        if process is not None:
            process.stop(grace=10.0)
        self.ready_file.unlink(missing_ok=True)
