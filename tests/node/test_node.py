"""The test node runs real Pods: Ready, the restricted Pod Security Standard, logs, port-forward.

These are the node's own checks (tests/cluster/node.py): if one fails, nothing that needs a
kubelet (the operator as a Pod, probes, rolling upgrades) can be trusted.
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest

from tests.cluster.cluster import Cluster, unique_name, wait_until
from tests.cluster.controlplane import NODE_IP
from tests.cluster.fixtures import NodeImages
from tests.cluster.node import NODE_LABEL, NODE_TAINT_KEY, Node
from tests.node.pods import RESTRICTED_LABELS, pod, wait_for_phase

# NB: the first run builds the images (minutes on 2 busy cores) inside a fixture, which the
# suite's 300 s per-test timeout would cut short.
pytestmark = [pytest.mark.node, pytest.mark.cluster, pytest.mark.timeout(1800)]


@pytest.fixture
def restricted_namespace(kube_control_plane: Cluster) -> Iterator[str]:
    name = kube_control_plane.create_namespace(labels=RESTRICTED_LABELS)
    yield name
    kube_control_plane.delete_namespace(name, wait=False)


def test_node_is_ready_with_its_address_label_and_taint(
    kube_control_plane: Cluster, kube_node: Node
) -> None:
    node = kube_control_plane.kubectl_json("get", "node", kube_node.name)
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True", conditions
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == NODE_IP
    assert node["metadata"]["labels"][NODE_LABEL] == "true"
    assert [t["key"] for t in node["spec"].get("taints", [])] == [NODE_TAINT_KEY]
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
    # Its logs are where the pytest summary says.
    assert kube_node.log_dir is not None
    for name in ("kubelet.log", "containerd.log", "kube-scheduler.log"):
        assert (kube_node.log_dir / name).stat().st_size > 0, name


def test_restricted_pod_runs_non_root_with_a_read_only_root_and_logs(
    kube_control_plane: Cluster,
    kube_node: Node,
    node_images: NodeImages,
    restricted_namespace: str,
) -> None:
    script = (
        "import os\n"
        "try:\n"
        "    open('/probe', 'w')\n"
        "    ro = False\n"
        "except OSError:\n"
        "    ro = True\n"
        "print(f'uid={os.getuid()} gid={os.getgid()} read-only-root={ro}', flush=True)\n"
    )
    name = unique_name("restricted")
    kube_control_plane.apply(
        pod(name, image=node_images.project, command=["python3", "-c", script]),
        namespace=restricted_namespace,
    )
    body = wait_for_phase(
        kube_control_plane,
        namespace=restricted_namespace,
        name=name,
        phases=("Succeeded", "Failed"),
    )
    assert body["status"]["phase"] == "Succeeded", body["status"]
    assert body["spec"]["nodeName"] == kube_node.name
    logs = kube_control_plane.kubectl("logs", name, "-n", restricted_namespace).stdout
    assert logs.strip() == "uid=10001 gid=10001 read-only-root=True"


def test_restricted_namespace_refuses_a_root_pod(
    kube_control_plane: Cluster,
    kube_node: Node,
    node_images: NodeImages,
    restricted_namespace: str,
) -> None:
    manifest = pod("root", image=node_images.project, command=["true"])
    del manifest["spec"]["containers"][0]["securityContext"]["runAsNonRoot"]
    manifest["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0
    done = kube_control_plane.kubectl(
        "apply",
        "-n",
        restricted_namespace,
        "-f",
        "-",
        input=json.dumps(manifest),
        check=False,
    )
    assert done.returncode != 0
    assert "violates PodSecurity" in done.stderr, done.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_port_forward_reaches_a_pod(
    kube_control_plane: Cluster,
    kube_node: Node,
    node_images: NodeImages,
    restricted_namespace: str,
) -> None:
    name = unique_name("web")
    server = (
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = b'hello from the pod'\n"
        "        self.send_response(200)\n"
        "        self.send_header('Content-Length', str(len(body)))\n"
        "        self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()\n"
    )
    kube_control_plane.apply(
        pod(name, image=node_images.project, command=["python3", "-c", server], ports=(8000,)),
        namespace=restricted_namespace,
    )
    wait_for_phase(
        kube_control_plane, namespace=restricted_namespace, name=name, phases=("Running",)
    )
    port = _free_port()

    def start_forward() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                str(kube_control_plane.kubectl_bin),
                "port-forward",
                "-n",
                restricted_namespace,
                f"pod/{name}",
                f"{port}:8000",
            ],
            env=kube_control_plane.environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    forward = start_forward()
    exits: list[bytes] = []
    try:

        def fetch() -> str | None:
            nonlocal forward
            if forward.poll() is not None:
                # NB: Running is not listening: under load the Pod's Python may still be
                # starting, and kubectl port-forward gives up at the first refused connection.
                # Start it again (bounded by the wait), keeping what it said.
                _, stderr = forward.communicate()
                exits.append(stderr)
                forward = start_forward()
                raise AssertionError(f"kubectl port-forward exited: {stderr!r}")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
                body: bytes = resp.read()
            return body.decode()

        assert wait_until(fetch, timeout=120, message="the pod through port-forward") == (
            "hello from the pod"
        )
        # Only a refused connection (the server not listening yet) may have ended a forward.
        assert all(b"connection refused" in e for e in exits), exits
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_a_runtime_class_selects_the_nodes_handler_and_an_unknown_handler_never_runs(
    kube_control_plane: Cluster,
    kube_node: Node,
    node_images: NodeImages,
    restricted_namespace: str,
) -> None:
    """``worker.podTemplate.runtimeClassName`` (#37) on a real node. The test node's containerd
    has one handler, ``runc`` (tests/cluster/node.py): a RuntimeClass naming it runs the Pod; one
    naming ``runsc`` (gVisor, not installed here) never starts — the platform team must install
    the handler its RuntimeClass names. No sandboxed runtime is exercised by the suite."""
    classes = {"runc": unique_name("rc-runc"), "runsc": unique_name("rc-runsc")}
    for handler, name in classes.items():
        kube_control_plane.apply({
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": name}, "handler": handler,
        })
    try:
        runs = pod(unique_name("runc"), image=node_images.project, command=["true"])
        runs["spec"]["runtimeClassName"] = classes["runc"]
        kube_control_plane.apply(runs, namespace=restricted_namespace)
        body = wait_for_phase(
            kube_control_plane, namespace=restricted_namespace, name=runs["metadata"]["name"],
            phases=("Succeeded", "Failed"),
        )
        assert body["status"]["phase"] == "Succeeded", body["status"]
        assert body["spec"]["runtimeClassName"] == classes["runc"]

        never = pod(unique_name("runsc"), image=node_images.project, command=["true"])
        never["spec"]["runtimeClassName"] = classes["runsc"]
        kube_control_plane.apply(never, namespace=restricted_namespace)
        name = never["metadata"]["name"]

        def sandbox_refused() -> str | None:
            events = kube_control_plane.kubectl_json(
                "get", "events", "-n", restricted_namespace,
                "--field-selector", f"involvedObject.name={name}",
            )["items"]
            return next((e["message"] for e in events
                         if e.get("reason") == "FailedCreatePodSandBox"), None)

        message = wait_until(sandbox_refused, timeout=120, interval=1.0,
                             message="the kubelet reports the missing runsc handler")
        assert "runsc" in message
        phase = kube_control_plane.kubectl_json(
            "get", "pod", name, "-n", restricted_namespace
        )["status"]["phase"]
        assert phase == "Pending"
    finally:
        for name in classes.values():
            kube_control_plane.kubectl("delete", "runtimeclass", name, check=False)
