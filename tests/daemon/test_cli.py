"""``lorenz status|refresh|stop`` against real daemons, over the unix socket and over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lorenz.daemon.discovery import lease_file_for, read_lease
from tests.daemon.harness import CLI, DaemonProcess, pid_alive, write_daemon_workflow
from tests.waiting import wait_until

SLOW_AGENT = {"AGENT_MIN_S": "5", "AGENT_MAX_S": "5", "AGENT_FAIL_RATE": "0"}


def lorenz(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def start(
    root: Path, env: dict[str, str], daemons: list[DaemonProcess], *extra: str
) -> DaemonProcess:
    workflow = root / "WORKFLOW.md"
    if not workflow.exists():
        write_daemon_workflow(root, issues=("A-1",), agent_env=SLOW_AGENT)
    daemon = DaemonProcess(
        workflow,
        env=env,
        args=["--feature", "daemon", *extra],
        output=root / f"daemon-{len(daemons)}.log",
    )
    daemons.append(daemon.start())
    daemon.wait_ready()
    return daemon


def test_status_refresh_stop_over_the_unix_socket(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], runtime_dir: Path
) -> None:
    daemon = start(root, daemon_env, daemons)
    lease = read_lease(lease_file_for(root / "WORKFLOW.md"))
    assert lease is not None
    assert lease["endpoint"].startswith(f"unix://{runtime_dir}/lorenz/")

    status = lorenz("status", "WORKFLOW.md", env=daemon_env, cwd=root)
    assert status.returncode == 0, status.stderr
    assert f"pid {daemon.pid}" in status.stdout
    assert lease["endpoint"] in status.stdout
    assert "lanes" in status.stdout
    assert "heartbeat" in status.stdout

    as_json = lorenz("status", "--json", env=daemon_env, cwd=root)  # ./WORKFLOW.md by default
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["daemon"]["pid"] == daemon.pid
    assert document["daemon"]["leadership_store"] == "file"
    assert document["daemon"]["workflow_path"] == str((root / "WORKFLOW.md").resolve())
    assert set(document["lanes"]) == {"running", "reserving", "retrying", "blocked"}

    refresh = lorenz("refresh", "WORKFLOW.md", "--json", env=daemon_env, cwd=root)
    assert refresh.returncode == 0, refresh.stderr
    assert json.loads(refresh.stdout)["queued"] is True
    assert "refresh_requested" in _wait_for_log(daemon, "refresh_requested")

    stop = lorenz("stop", "WORKFLOW.md", "--wait", env=daemon_env, cwd=root)
    assert stop.returncode == 0, stop.stderr
    assert f"daemon pid {daemon.pid} stopped" in stop.stdout
    assert daemon.wait() == 0
    assert read_lease(lease_file_for(root / "WORKFLOW.md")) is None
    assert not Path(lease["endpoint"].removeprefix("unix://")).exists()

    after = lorenz("status", "WORKFLOW.md", env=daemon_env, cwd=root)
    assert after.returncode == 1
    assert "daemon_not_running" in after.stderr
    assert "--feature daemon" in after.stderr


def test_status_refresh_stop_over_http(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    daemon = start(root, daemon_env, daemons, "--port", "0")
    lease = read_lease(lease_file_for(root / "WORKFLOW.md"))
    assert lease is not None
    assert lease["endpoint"].startswith("http://127.0.0.1:")
    port = lease["endpoint"].rsplit(":", 1)[1]

    for where in ([], ["--port", port], ["--url", lease["endpoint"]]):
        status = lorenz("status", "WORKFLOW.md", "--json", *where, env=daemon_env, cwd=root)
        assert status.returncode == 0, status.stderr
        document = json.loads(status.stdout)
        assert document["endpoint"] == lease["endpoint"] or where
        # over HTTP the lanes come from /api/v1/state, which carries the daemon block
        assert document["daemon"]["pid"] == daemon.pid
        assert document["poll"]["interval_ms"] == 100

    text = lorenz("status", env=daemon_env, cwd=root)
    assert text.returncode == 0
    assert f"pid {daemon.pid}" in text.stdout

    refresh = lorenz("refresh", "--port", port, env=daemon_env, cwd=root)
    assert refresh.returncode == 0, refresh.stderr
    assert "refresh queued" in refresh.stdout

    stop = lorenz("stop", "--url", lease["endpoint"], "--wait", "--json", env=daemon_env, cwd=root)
    assert stop.returncode == 0, stop.stderr
    assert json.loads(stop.stdout)["stopped"] is True
    assert daemon.wait() == 0
    assert read_lease(lease_file_for(root / "WORKFLOW.md")) is None


def test_no_daemon_is_exit_1_with_a_coded_message(
    tmp_path: Path, daemon_env: dict[str, str]
) -> None:
    (tmp_path / "WORKFLOW.md").write_text("---\n---\n")
    for command in ("status", "refresh", "stop"):
        result = lorenz(command, "WORKFLOW.md", env=daemon_env, cwd=tmp_path)
        assert result.returncode == 1, command
        assert "daemon_not_running" in result.stderr
        assert "lorenz " in result.stderr
        assert "--feature daemon" in result.stderr
    as_json = lorenz("status", "--json", env=daemon_env, cwd=tmp_path)
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["error"]["code"] == "daemon_not_running"


def test_usage_errors_are_exit_2(tmp_path: Path, daemon_env: dict[str, str]) -> None:
    bad_url = lorenz("status", "--url", "ftp://example.com", env=daemon_env, cwd=tmp_path)
    assert bad_url.returncode == 2
    assert "control_url_invalid" in bad_url.stderr
    bad_port = lorenz("status", "--port", "70000", env=daemon_env, cwd=tmp_path)
    assert bad_port.returncode == 2
    both = lorenz("status", "--url", "http://x:1", "--port", "1", env=daemon_env, cwd=tmp_path)
    assert both.returncode == 2
    unknown = lorenz("stop", "--bogus", env=daemon_env, cwd=tmp_path)
    assert unknown.returncode == 2


def test_a_dead_daemon_is_not_running_and_an_unanswering_one_is_unreachable(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    daemon = start(root, daemon_env, daemons)
    daemon.kill9()
    lease_path = lease_file_for(root / "WORKFLOW.md")
    assert read_lease(lease_path) is not None  # kill -9 leaves the lease behind
    dead = lorenz("status", env=daemon_env, cwd=root)
    assert dead.returncode == 1
    assert "daemon_not_running" in dead.stderr
    assert f"pid {daemon.pid}" in dead.stderr

    # A live holder (this test process) whose endpoint does not answer.
    lease = read_lease(lease_path)
    assert lease is not None
    import psutil

    lease.update(
        pid=os.getpid(),
        process_started_at=psutil.Process().create_time(),
        endpoint=f"unix://{root}/nobody.sock",
    )
    lease_path.write_text(json.dumps(lease))
    unreachable = lorenz("status", env=daemon_env, cwd=root)
    assert unreachable.returncode == 1
    assert "daemon_unreachable" in unreachable.stderr
    assert pid_alive(os.getpid())

    lease.update(endpoint=None)
    lease_path.write_text(json.dumps(lease))
    starting = lorenz("refresh", env=daemon_env, cwd=root)
    assert starting.returncode == 1
    assert "daemon_unreachable" in starting.stderr
    assert "endpoint" in starting.stderr

    lease_path.write_text("{not json")
    garbled = lorenz("status", env=daemon_env, cwd=root)
    assert garbled.returncode == 1
    assert "daemon_lock_unreadable" in garbled.stderr


def _wait_for_log(daemon: DaemonProcess, needle: str) -> str:
    def logged() -> str | None:
        text = daemon.log()
        return text if needle in text else None

    return wait_until(
        logged,
        timeout=30,
        what=lambda: f"{needle!r} to be logged:\n{daemon.log()[-3000:]}",
    )


def test_cli_module_imports_stay_light() -> None:
    """No pydantic, aiohttp, asyncio or psutil on the success path of `lorenz status`."""
    code = (
        "import sys\n"
        "import lorenz.cli, lorenz.cli.status, lorenz.daemon.attach\n"
        "heavy = [m for m in ('pydantic', 'aiohttp', 'asyncio', 'psutil', 'httpx', 'kopf',"
        " 'lorenz.model', 'lorenz.leadership') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_status_shows_the_reload_error_in_force_until_it_is_fixed(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    daemon = start(root, daemon_env, daemons)
    workflow = root / "WORKFLOW.md"
    good = workflow.read_text(encoding="utf-8")
    workflow.write_text("---\ntracker: [unclosed\n---\nprompt\n", encoding="utf-8")

    def status_json() -> dict[str, object]:
        reply = lorenz("status", "WORKFLOW.md", "--json", env=daemon_env, cwd=root)
        assert reply.returncode == 0, reply.stderr
        document: dict[str, object] = json.loads(reply.stdout)
        return document

    deadline = time.monotonic() + 120
    while status_json().get("config_error") is None:
        assert time.monotonic() < deadline, "the daemon never reported the broken reload"
        time.sleep(0.2)
    error = status_json()["config_error"]
    assert isinstance(error, dict)
    assert error["code"]
    text = lorenz("status", "WORKFLOW.md", env=daemon_env, cwd=root)
    assert f"reload refused: {error['code']}" in text.stdout
    assert "running the last good workflow" in text.stdout
    assert daemon.alive()

    workflow.write_text(good, encoding="utf-8")
    while status_json().get("config_error") is not None:
        assert time.monotonic() < deadline, "the fixed workflow never cleared the error"
        time.sleep(0.2)
    assert "reload refused" not in lorenz("status", env=daemon_env, cwd=root).stdout
