"""NetworkPolicy on the real node (#37 point 5): what a packet from a run Pod meets.

The node enforces NetworkPolicies with kube-network-policies' engine beside its kubelet
(tests/cluster/enforcer.py). The policy is the operator's own per-Workflow run-Pod policy
(`run_network_policy_manifest`, `lorenz-runs-<workflow>`), applied by the test for a Workflow
that does not exist (no operator runs here): a Pod with that Workflow's run labels in "team-b"
must not open a connection to a Pod in "team-a", nor to a server in another namespace standing
in for the operator's :9090, nor to a node port its Workflow does not list; it may reach port 53
in `kube-system` (where the policy sends DNS: the test node runs no cluster DNS, so a TCP server
on port 53 there stands in for it) and what its `worker.egress` lists. A Pod of team-b that no
policy selects reaches all of them: the control that proves a refusal is the policy's doing.
Stopping the enforcer lets the refused connection through (what the operator's "not enforced"
probe will see on a cluster whose CNI ignores policies), and starting it again refuses it.

Connections are tried with `kubectl exec` (the API's exec channel, which never crosses the Pod
network) running a short Python script in the Pod: a refused connection is a dropped SYN, so the
script's connect times out.
"""

from __future__ import annotations

import socket
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from lorenz.config import WorkerSettings
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.pods.manifests import DNS_NAMESPACE, run_network_policy_manifest
from tests.cluster.cluster import Cluster, wait_until
from tests.cluster.controlplane import NODE_IP
from tests.cluster.fixtures import NodeImages
from tests.cluster.node import Node
from tests.node.pods import RESTRICTED_LABELS, pod, wait_for_phase

pytestmark = [pytest.mark.node, pytest.mark.cluster, pytest.mark.timeout(600)]

SERVER_PORT = 8080
OPERATOR_PORT = 9090  # the operator's API port, as the chart sets it
DNS_PORT = 53
CONNECT_TIMEOUT_S = 3.0

CONNECT = textwrap.dedent(
    """\
    import socket, sys
    host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        print("connected")
    except TimeoutError:
        print("timed out")
    except OSError as err:
        print(f"failed: {err}")
    """
)


def serve(port: int) -> list[str]:
    """A Pod command: an HTTP server on `port` (nothing written: the root is read-only)."""
    return ["python3", "-m", "http.server", str(port), "--bind", "0.0.0.0"]


SLEEP = ["python3", "-c", "import time; time.sleep(3600)"]


@dataclass
class Network:
    cluster: Cluster
    team_a: str
    team_b: str
    operator_namespace: str
    server_a: str  # a Pod IP in team-a, serving SERVER_PORT
    operator: str  # a Pod IP in the stand-in operator namespace, serving OPERATOR_PORT
    dns: str  # a Pod IP in kube-system, serving DNS_PORT (TCP) and SERVER_PORT
    listed_port: int  # on NODE_IP: the Workflow's `worker.egress` lists it
    unlisted_port: int  # on NODE_IP: not listed

    def connect(self, *, from_pod: str, host: str, port: int) -> str:
        """'connected', 'timed out' or 'failed: …', as `from_pod` in team-b saw it."""
        done = self.cluster.kubectl(
            "exec",
            "-n",
            self.team_b,
            from_pod,
            "--",
            "python3",
            "-c",
            CONNECT,
            host,
            str(port),
            str(CONNECT_TIMEOUT_S),
            timeout=60.0,
        )
        return done.stdout.strip()


def pod_ip(cluster: Cluster, *, namespace: str, name: str) -> str:
    body = wait_for_phase(cluster, namespace=namespace, name=name, phases=("Running",))
    return str(body["status"]["podIP"])


def host_listener() -> tuple[socket.socket, int]:
    """A TCP server on the host's 127.0.0.1 that accepts and closes (a thread of its own)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=accept, daemon=True, name=f"listener-{port}").start()
    return server, port


@pytest.fixture(scope="module")
def network(
    kube_control_plane: Cluster, kube_node: Node, node_images: NodeImages
) -> Iterator[Network]:
    if not isinstance(kube_node, Node):
        pytest.skip(
            "a kind cluster (LORENZ_TEST_CLUSTER=kind) has no Lorenz test node whose "
            "NetworkPolicy enforcer the test can stop and start"
        )
    cluster = kube_control_plane
    team_a = cluster.create_namespace(labels=RESTRICTED_LABELS)
    team_b = cluster.create_namespace(labels=RESTRICTED_LABELS)
    operator_namespace = cluster.create_namespace(labels=RESTRICTED_LABELS)
    listeners = [host_listener(), host_listener()]
    (_, listed_port), (_, unlisted_port) = (
        kube_node.forward_to_host(port=port) for _, port in listeners
    )
    worker = WorkerSettings.model_validate(
        {"kind": "pod", "egress": [{"cidr": f"{NODE_IP}/32", "ports": [listed_port]}]}
    )
    policy = run_network_policy_manifest(
        workflow=WorkflowRef(namespace=team_b, name="hostile"), worker=worker
    )
    run_labels = dict(policy["spec"]["podSelector"]["matchLabels"])
    cluster.apply(policy)

    image = node_images.project
    run_pod = pod("run", image=image, command=SLEEP)
    run_pod["metadata"]["labels"] = run_labels
    dns_pod = pod(
        "dns",
        image=image,
        command=[
            "sh",
            "-c",
            f"{' '.join(serve(DNS_PORT))} & exec {' '.join(serve(SERVER_PORT))}",
        ],
    )
    # NB: a safe sysctl (the restricted standard admits it): uid 10001 may bind port 53.
    dns_pod["spec"]["securityContext"]["sysctls"] = [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": str(DNS_PORT)}
    ]
    dns_name = f"stand-in-dns-{team_b}"
    dns_pod["metadata"]["name"] = dns_name
    for namespace, manifest in (
        (team_a, pod("server", image=image, command=serve(SERVER_PORT))),
        (operator_namespace, pod("operator", image=image, command=serve(OPERATOR_PORT))),
        (DNS_NAMESPACE, dns_pod),
        (team_b, run_pod),
        (team_b, pod("free", image=image, command=SLEEP)),
    ):
        cluster.apply(manifest, namespace=namespace)
    rig = Network(
        cluster=cluster,
        team_a=team_a,
        team_b=team_b,
        operator_namespace=operator_namespace,
        server_a=pod_ip(cluster, namespace=team_a, name="server"),
        operator=pod_ip(cluster, namespace=operator_namespace, name="operator"),
        dns=pod_ip(cluster, namespace=DNS_NAMESPACE, name=dns_name),
        listed_port=listed_port,
        unlisted_port=unlisted_port,
    )
    for namespace, name in ((team_b, "run"), (team_b, "free")):
        wait_for_phase(cluster, namespace=namespace, name=name, phases=("Running",))
    # The servers listen once their Python has started: wait until the control Pod connects.
    for host, port in (
        (rig.server_a, SERVER_PORT),
        (rig.operator, OPERATOR_PORT),
        (rig.dns, DNS_PORT),
        (rig.dns, SERVER_PORT),
    ):
        wait_until(
            lambda: rig.connect(from_pod="free", host=host, port=port) == "connected",  # noqa: B023
            timeout=120.0,
            message=f"the policy-free Pod to reach {host}:{port}",
        )
    yield rig
    kube_node.start_network_policy_enforcer()
    for server, _ in listeners:
        server.close()
    cluster.kubectl("delete", "pod", dns_name, "-n", DNS_NAMESPACE, "--wait=false", check=False)
    for namespace in (team_a, team_b, operator_namespace):
        cluster.delete_namespace(namespace, wait=False)


def test_the_node_enforces_network_policy(network: Network, kube_node: Node) -> None:
    assert kube_node.enforces_network_policy


def test_a_run_pod_reaches_neither_another_namespace_nor_the_operator(network: Network) -> None:
    for host, port in ((network.server_a, SERVER_PORT), (network.operator, OPERATOR_PORT)):
        assert network.connect(from_pod="run", host=host, port=port) == "timed out", (host, port)
        # The control: the same team's Pod that no policy selects gets through.
        assert network.connect(from_pod="free", host=host, port=port) == "connected", (host, port)


def test_a_run_pod_reaches_dns_and_what_its_workflow_lists_only(network: Network) -> None:
    # DNS: the policy admits port 53 in kube-system (TCP here), and nothing else there.
    assert network.connect(from_pod="run", host=network.dns, port=DNS_PORT) == "connected"
    assert network.connect(from_pod="run", host=network.dns, port=SERVER_PORT) == "timed out"
    # worker.egress: the node's listed port, not another one of the same address.
    listed = network.connect(from_pod="run", host=NODE_IP, port=network.listed_port)
    assert listed == "connected"
    unlisted = network.connect(from_pod="run", host=NODE_IP, port=network.unlisted_port)
    assert unlisted == "timed out"
    assert network.connect(from_pod="free", host=NODE_IP, port=network.unlisted_port) == (
        "connected"
    )


def test_stopping_the_enforcer_lets_the_refused_connection_through(
    network: Network, kube_node: Node
) -> None:
    assert network.connect(from_pod="run", host=network.server_a, port=SERVER_PORT) == "timed out"
    kube_node.stop_network_policy_enforcer()
    try:
        assert not kube_node.enforces_network_policy
        assert network.connect(from_pod="run", host=network.server_a, port=SERVER_PORT) == (
            "connected"
        )
    finally:
        kube_node.start_network_policy_enforcer()
    assert kube_node.enforces_network_policy
    assert network.connect(from_pod="run", host=network.server_a, port=SERVER_PORT) == "timed out"
