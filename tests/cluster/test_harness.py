"""Tests of the cluster harness's own promises, each in a child pytest run.

- Missing binaries make cluster tests fail (an error), never skip.
- The control plane is torn down on Ctrl-C and on SIGTERM (through fixture teardown), and on
  SIGKILL of pytest (through PR_SET_PDEATHSIG): no etcd or kube-apiserver is left running.
- The kind backend's adapter (`cluster_from_kubeconfig`) gives a working `Cluster` for an
  existing admin kubeconfig (checked against the envtest cluster, as kind needs Docker).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cluster.cluster import (
    Cluster,
    WaitAborted,
    cluster_from_kubeconfig,
    sigint_as_at_a_terminal,
    wait_until,
    wait_while_progressing,
)

REPO = Path(__file__).resolve().parents[2]

CHILD_TEST = textwrap.dedent(
    """\
    import os
    import time
    from pathlib import Path


    def test_hold(kube_control_plane):
        kube_control_plane.kubectl("get", "namespaces")
        Path(os.environ["HARNESS_OUT"]).write_text(str(kube_control_plane.log_dir.parent))
        time.sleep(120)
    """
)


def _child_pytest(
    test_file: Path, *, env: dict[str, str], start_new_session: bool = False
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            str(test_file),
            "-p",
            "tests.cluster.fixtures",
            "-p",
            "no:cacheprovider",
            "-q",
            "-c",
            str(REPO / "pyproject.toml"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=start_new_session,
        preexec_fn=sigint_as_at_a_terminal,
    )


def _processes_mentioning(needle: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline:
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def test_missing_binaries_fail_not_skip(tmp_path: Path) -> None:
    test_file = tmp_path / "test_child.py"
    test_file.write_text(CHILD_TEST)
    child = _child_pytest(
        test_file, env={"LORENZ_K8S_BIN": str(tmp_path / "no-bin"), "HARNESS_OUT": "unused"}
    )
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 1, out
    assert "1 error" in out, out
    assert "skipped" not in out, out
    assert "control-plane binaries missing" in out, out
    assert "build.sh" in out, out


@pytest.mark.cluster
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda sig: sig.name
)
def test_control_plane_dies_with_pytest(
    tmp_path: Path, sig: signal.Signals, kube_control_plane: Cluster
) -> None:
    # NB: asks for kube_control_plane only so that missing binaries fail this test the same
    # loud way; the child runs its own control plane.
    test_file = tmp_path / "test_child.py"
    test_file.write_text(CHILD_TEST)
    out_file = tmp_path / "run-dir"
    child = _child_pytest(test_file, env={"HARNESS_OUT": str(out_file)}, start_new_session=True)
    try:
        wait_until(
            lambda: out_file.exists() or child.poll() is not None,
            timeout=90,
            message="child control plane to start",
        )
        assert child.poll() is None, child.communicate()[0]
        run_dir = out_file.read_text()
        assert len(_processes_mentioning(run_dir)) == 3  # etcd, apiserver, controller-manager
        os.kill(child.pid, sig)
        child.wait(timeout=60)
        # NB: after SIGKILL the kernel's PDEATHSIG kills the children asynchronously.
        wait_until(
            lambda: not _processes_mentioning(run_dir),
            timeout=15,
            message=f"control-plane processes of {run_dir} to exit after {sig.name}",
        )
        if sig != signal.SIGKILL:  # teardown ran: data and certificates are gone, logs stay
            assert not (Path(run_dir) / "etcd-data").exists()
            assert not (Path(run_dir) / "pki").exists()
            assert (Path(run_dir) / "logs" / "kube-apiserver.log").is_file()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


@pytest.mark.cluster
def test_kubeconfig_adapter_wraps_an_existing_cluster(
    kube_control_plane: Cluster, tmp_path: Path
) -> None:
    wrapped = cluster_from_kubeconfig(
        backend="kind",
        kubeconfig=kube_control_plane.kubeconfig,
        workdir=tmp_path,
        kubectl_bin=kube_control_plane.kubectl_bin,
        helm_bin=kube_control_plane.helm_bin,
    )
    assert wrapped.server == kube_control_plane.server
    assert wrapped.ca_pem == kube_control_plane.ca_pem
    namespace = wrapped.create_namespace()
    try:
        token_kubeconfig = wrapped.service_account_kubeconfig(namespace=namespace, name="probe")
        assert not wrapped.can_i("get", "pods", namespace=namespace, kubeconfig=token_kubeconfig)
        # Every authenticated identity may ask who it is (system:basic-user).
        assert wrapped.can_i(
            "create", "selfsubjectreviews.authentication.k8s.io", kubeconfig=token_kubeconfig
        )
    finally:
        wrapped.delete_namespace(namespace)


def test_wait_until_retries_a_failing_check_but_not_an_aborted_one() -> None:
    calls = []

    def flaky() -> str | None:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return "up"

    assert wait_until(flaky, timeout=60, interval=0.01, message="flaky") == "up"
    assert len(calls) == 3

    aborted = []

    def exited() -> None:
        aborted.append(1)
        raise WaitAborted("the process exited early")

    with pytest.raises(WaitAborted, match="exited early"):
        wait_until(exited, timeout=30, interval=0.01, message="never")
    assert len(aborted) == 1, "given up at the first abort, not retried until the timeout"


def test_wait_while_progressing_outwaits_slow_work_and_fails_on_a_stall() -> None:
    # Slow but steady: each step takes 30 ms, the whole 300 ms; the stall bound is 200 ms.
    steps = iter(range(11))
    count = [0]

    def steady() -> int:
        count[0] = next(steps, 10)
        return count[0]

    wait_while_progressing(steady, goal=10, stall_timeout=0.2, interval=0.03, message="steady")
    assert count[0] == 10

    with pytest.raises(TimeoutError, match=r"no progress for 0s at 3/10: stuck; left: 7"):
        wait_while_progressing(lambda: 3, goal=10, stall_timeout=0.1, interval=0.01,
                               message="stuck", describe=lambda: "left: 7")
