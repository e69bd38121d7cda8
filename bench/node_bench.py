"""The test node's figures: build times, node start to Ready, Pod create → Running and Ready.

    .venv/bin/python bench/node_bench.py [--runs 3] [--cold-images]

Prints:

* **build times** — the last build of each node binary (tests/cluster/build.sh writes
  ``build-times.txt`` next to ``bin/``) and of each image (tests/cluster/images.py writes
  ``~/.cache/lorenz/images/build-times.txt``); with ``--cold-images`` the images are rebuilt
  first (into a throwaway cache) so the figures are this machine's cold build now;
* **node start** — per run, a fresh control plane and node (tests/cluster/node.py): the
  namespaces, containerd, the kubelet's registration until the Node is ``Ready``;
* **image import** — ``ctr images import`` of the project image into the node;
* **Pod create → Running** — a restricted Pod of the project image, from ``kubectl apply`` to
  phase Running (the image already in the node), and the same Pod's start as the kubelet saw it;
* **operator Pod → Ready** — the Helm chart's Deployment with the project image: from
  ``helm install`` to the Pod's Ready condition (probes passing).

Also prints the load average: on a shared 2-core machine every figure scales with it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cluster.cluster import Cluster, wait_until  # noqa: E402
from tests.cluster.controlplane import Binaries, ControlPlane, cache_root  # noqa: E402
from tests.cluster.images import cache_dir, project_image  # noqa: E402
from tests.cluster.node import NODE_TOLERATION, Node  # noqa: E402
from tests.node.pods import RESTRICTED_LABELS, pod  # noqa: E402


def _stamp(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _print_build_times() -> None:
    versions = Binaries.locate().versions
    binaries = cache_root() / versions["K8S_VERSION"] / "build-times.txt"
    node = (
        "kube-scheduler",
        "kubelet",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
        "pause",
        "bridge",
        "host-local",
        "loopback",
    )
    last: dict[str, str] = {}
    if binaries.exists():
        for line in binaries.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] in node:
                last[parts[1]] = parts[2]
    total = sum(float(v.rstrip("s")) for v in last.values())
    print("node binaries, last build (build-times.txt):")
    for name in node:
        print(f"  {name:<26} {last.get(name, '-')}")
    print(f"  {'total':<26} {total:.0f}s")
    images = cache_dir() / "build-times.txt"
    print("images, last builds:")
    if images.exists():
        for line in images.read_text().splitlines()[-6:]:
            print(f"  {line}")


def _pod_running(cluster: Cluster, namespace: str, name: str, image: str) -> tuple[float, float]:
    began = time.monotonic()
    cluster.apply(
        pod(name, image=image, command=["python3", "-c", "import time; time.sleep(600)"]),
        namespace=namespace,
    )

    def running() -> dict[str, object] | None:
        body: dict[str, object] = cluster.kubectl_json("get", "pod", name, "-n", namespace)
        status = body.get("status", {})
        assert isinstance(status, dict)
        return body if status.get("phase") == "Running" else None

    body = wait_until(running, timeout=300, interval=0.05, message=f"{name} Running")
    wall = time.monotonic() - began
    meta = body["metadata"]
    status = body["status"]
    assert isinstance(meta, dict)
    assert isinstance(status, dict)
    started = status["containerStatuses"][0]["state"]["running"]["startedAt"]
    return wall, _stamp(started) - _stamp(meta["creationTimestamp"])


def _operator_ready(cluster: Cluster, namespace: str, image: str, workdir: Path) -> float:
    repository, tag = image.rsplit(":", 1)
    values = workdir / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
                "watchNamespace": namespace,
                "tolerations": [NODE_TOLERATION],
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
                "probes": {"readiness": {"initialDelaySeconds": 1, "periodSeconds": 1}},
            }
        )
    )
    cluster.install_crds(ROOT / "crds")
    began = time.monotonic()
    cluster.helm(
        "install", "lorenz", str(ROOT / "charts" / "lorenz"), "-n", namespace, "-f", str(values)
    )

    def ready() -> bool:
        items = cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
        return any(
            c["type"] == "Ready" and c["status"] == "True"
            for p in items
            for c in p.get("status", {}).get("conditions", [])
        )

    wait_until(ready, timeout=300, interval=0.1, message="operator Pod Ready")
    took = time.monotonic() - began
    cluster.helm("uninstall", "lorenz", "-n", namespace, "--wait=false", check=False)
    return took


def _summary(label: str, values: list[float]) -> None:
    if not values:
        return
    print(
        f"  {label:<34} min {min(values):6.2f}s  p50 {statistics.median(values):6.2f}s  "
        f"max {max(values):6.2f}s  (n={len(values)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--cold-images", action="store_true", help="rebuild the images into a throwaway cache first"
    )
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}")
    if args.cold_images:
        os.environ["LORENZ_IMAGE_CACHE"] = tempfile.mkdtemp(prefix="lorenz-images-")
    began = time.monotonic()
    image = project_image()
    print(
        f"project image {image.ref}: {time.monotonic() - began:.1f}s "
        f"({'cold' if args.cold_images else 'cached unless the inputs changed'})"
    )
    _print_build_times()

    figures: dict[str, list[float]] = {}
    binaries = Binaries.locate()
    for run in range(args.runs):
        control_plane = ControlPlane(binaries=binaries)
        cluster = control_plane.start()
        node = Node(control_plane=control_plane, binaries=binaries)
        try:
            node.start()
            for key in ("namespaces", "containerd", "ready", "total"):
                figures.setdefault(f"node {key}", []).append(node.timings[key])
            t = time.monotonic()
            node.import_image(image.archive)
            figures.setdefault("image import", []).append(time.monotonic() - t)
            namespace = cluster.create_namespace(labels=RESTRICTED_LABELS)
            wall, kubelet = _pod_running(cluster, namespace, f"bench-{run}", image.ref)
            figures.setdefault("pod create -> Running (wall)", []).append(wall)
            figures.setdefault("pod create -> started (API)", []).append(kubelet)
            with tempfile.TemporaryDirectory() as workdir:
                operator_ns = cluster.create_namespace(labels=RESTRICTED_LABELS)
                figures.setdefault("helm install -> operator Ready", []).append(
                    _operator_ready(cluster, operator_ns, image.ref, Path(workdir))
                )
        finally:
            node.stop()
            control_plane.stop()
        print(f"run {run + 1}/{args.runs} done (load {os.getloadavg()[0]:.1f})", flush=True)

    print("figures:")
    for label, values in figures.items():
        _summary(label, values)


if __name__ == "__main__":
    main()
