"""The test node leaves nothing behind: after a normal end, after SIGINT and SIGTERM of pytest,
and — swept at the next start — after SIGKILL.

Each case runs a pytest session of its own (the node is session-scoped) with a Pod running on
its node, waits until that session reports its node, signals it, and then looks for what would
leak: node and container processes, the node's network namespace, mounts, cgroups, data.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cluster import sigint_as_at_a_terminal, wait_until
from tests.cluster.node import node_processes, stale_node_dirs, sweep_stale_nodes

# NB: the first run builds the images (minutes on 2 busy cores) inside a fixture, which the
# suite's 300 s per-test timeout would cut short.
pytestmark = [pytest.mark.node, pytest.mark.cluster, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]

INNER_TEST = textwrap.dedent(
    """\
    import json, os, pathlib, time

    from tests.cluster.images import PAUSE_IMAGE
    from tests.node.pods import pod, wait_for_phase


    def test_hold_a_running_pod(kube_control_plane, kube_node):
        # The sandbox image is always there, and its /pause never exits.
        namespace = kube_control_plane.create_namespace()
        kube_control_plane.apply(
            pod("sleeper", image=PAUSE_IMAGE, command=["/pause"]), namespace=namespace
        )
        wait_for_phase(kube_control_plane, namespace=namespace, name="sleeper",
                       phases=("Running",))
        holder = kube_node.holder_pid
        info = {
            "pytest": os.getpid(),
            "holder": holder,
            "netns": os.readlink(f"/proc/{holder}/ns/net"),
            "node_dir": str(kube_node.dir),
            "cgroups": [str(p) for p in kube_node.container_cgroups()],
        }
        ready = pathlib.Path(os.environ["NODE_READY_FILE"])
        ready.with_suffix(".tmp").write_text(json.dumps(info))
        ready.with_suffix(".tmp").replace(ready)
        # Until the outer test says so (or signals this session).
        release = pathlib.Path(os.environ["NODE_RELEASE_FILE"])
        deadline = time.monotonic() + 600
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    """
)


def _run_inner(tmp_path: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    test_file = tmp_path / "test_inner_node.py"
    test_file.write_text(INNER_TEST)
    ready = tmp_path / "ready.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "NODE_READY_FILE": str(ready),
        "NODE_RELEASE_FILE": str(tmp_path / "release"),
    }
    log = (tmp_path / "inner.log").open("wb")
    inner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.cluster.fixtures",
            "-p",
            "no:cacheprovider",
            f"--rootdir={tmp_path}",
            str(test_file),
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=sigint_as_at_a_terminal,
    )

    def reported() -> dict[str, Any] | None:
        if inner.poll() is not None and not ready.exists():
            raise AssertionError(
                f"inner pytest exited with {inner.returncode}:\n"
                f"{(tmp_path / 'inner.log').read_text(errors='replace')[-4000:]}"
            )
        return json.loads(ready.read_text()) if ready.exists() else None

    info = wait_until(reported, timeout=300, interval=0.5, message="the inner session's node")
    return inner, info


def _processes_in_netns(netns: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.readlink(proc / "ns/net") == netns:
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def _assert_nothing_left(info: dict[str, Any]) -> None:
    assert node_processes(marker_pid=info["pytest"]) == []
    assert _processes_in_netns(info["netns"]) == []
    mounts = Path("/proc/self/mountinfo").read_text()
    assert info["node_dir"] not in mounts
    netns_inode = info["netns"].split("[")[1].rstrip("]")
    assert f"net:[{netns_inode}]" not in mounts
    assert [c for c in info["cgroups"] if Path(c).exists()] == []
    assert not Path(info["node_dir"]).exists()


def test_normal_end_leaves_nothing(tmp_path: Path) -> None:
    inner, info = _run_inner(tmp_path)
    # The checks can see a live node: its processes, its containers' cgroups.
    assert node_processes(marker_pid=info["pytest"]) != []
    assert info["cgroups"] != []
    (tmp_path / "release").touch()
    assert inner.wait(timeout=180) == 0, (tmp_path / "inner.log").read_text()
    _assert_nothing_left(info)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_pytest_leaves_nothing(tmp_path: Path, signum: signal.Signals) -> None:
    inner, info = _run_inner(tmp_path)
    assert node_processes(marker_pid=info["pytest"]) != []
    inner.send_signal(signum)
    inner.wait(timeout=180)
    _assert_nothing_left(info)


def test_sigkilled_pytest_is_swept_at_the_next_start(tmp_path: Path) -> None:
    inner, info = _run_inner(tmp_path)
    inner.kill()
    inner.wait(timeout=60)
    # The kernel ends the processes (PR_SET_PDEATHSIG, then unshare --kill-child and the PID
    # namespace's end); files and cgroups are what a SIGKILL leaves.
    wait_until(
        lambda: node_processes(marker_pid=info["pytest"]) == [],
        timeout=60,
        message="the killed session's node processes to end",
    )
    assert Path(info["node_dir"]) in stale_node_dirs()
    assert [c for c in info["cgroups"] if Path(c).exists()] != []
    sweep_stale_nodes()  # what Node.start() does first
    assert Path(info["node_dir"]) not in stale_node_dirs()
    _assert_nothing_left(info)
