"""Run mode as a user meets it: ``--dry-run``, ``--help``, the start-up log lines, imports."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lorenz.cli import main
from lorenz.config import LoggingSettings
from lorenz.daemon import host, logs
from lorenz.daemon.discovery import lease_file_for
from lorenz.daemon.host import HostOptions, run_host
from lorenz.workflow import InvalidWorkflowConfig, load_workflow

LORENZ = Path(sys.executable).with_name("lorenz")
HANG_GUARD_S = 120.0
"""Hang protection for subprocesses only; never asserted as a figure."""

ISSUE = """---
id: id-1
identifier: RUN-1
title: Something to do
state: Todo
---
Do it.
"""


def files_workflow(tmp_path: Path, *, extra: str = "") -> Path:
    issues = tmp_path / "issues"
    issues.mkdir(exist_ok=True)
    (issues / "RUN-1.md").write_text(ISSUE, encoding="utf-8")
    marker = tmp_path / "agent-ran"
    path = tmp_path / "WORKFLOW.md"
    path.write_text(
        "---\n"
        "tracker:\n"
        "  kind: files\n"
        "  path: issues\n"
        f"{extra}"
        "polling:\n"
        "  interval_ms: 100\n"
        "workspace:\n"
        "  root: workspaces\n"
        "agent:\n"
        "  kind: marker\n"
        "agents:\n"
        "  marker:\n"
        "    protocol: command\n"
        f"    command: touch {marker}\n"
        "logging:\n"
        "  log_file: events.jsonl\n"
        "---\n"
        "Work on {{ issue.identifier }}.\n",
        encoding="utf-8",
    )
    return path


def run_lorenz(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LORENZ), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


# ------------------------------------------------------------------ --dry-run


def test_dry_run_is_one_tick_that_dispatches_nothing_and_takes_no_lease(tmp_path: Path) -> None:
    workflow = files_workflow(tmp_path)
    result = run_lorenz(str(workflow), "--dry-run", "--no-tui", "--feature", "daemon",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    kinds = [event["type"] for event in events]
    assert kinds.count("poll_completed") == 1, kinds
    assert "dry_run" in kinds
    assert "run_started" not in kinds
    assert not (tmp_path / "agent-ran").exists()
    assert "state: Todo" in (tmp_path / "issues" / "RUN-1.md").read_text()
    lease = lease_file_for(workflow)
    assert not lease.exists(), "a dry run must not take (or leave) the daemon lease"
    assert "leadership acquired" not in result.stderr


# ------------------------------------------------------------------ workers


def test_once_runs_the_issue_in_a_detached_worker_by_default(tmp_path: Path) -> None:
    workflow = files_workflow(tmp_path)
    result = run_lorenz(str(workflow), "--once", "--no-tui", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "agent-ran").exists()
    # The run went through a worker: its state directory names this workflow and issue.
    root = Path(os.environ["LORENZ_WORKER_STATE"])
    specs = [json.loads(p.read_text()) for p in root.glob("lzw-*/spec.json")]
    mine = [s for s in specs if s["workflow"] == str(workflow)]
    assert [s["issue"]["identifier"] for s in mine] == ["RUN-1"]


def test_a_home_too_long_for_worker_sockets_still_runs_through_a_short_link(
    tmp_path: Path,
) -> None:
    """The default state root ``~/.lorenz/workers`` under a long HOME made every run fail with
    ``worker_socket_path_too_long``; it is now reached through ``/tmp/lorenz-<uid>/<hash>``."""
    from lorenz.workers.states import STATE_ROOT_ENV, reachable_state_root
    from tests.workers.conftest import kill_workers_under

    home = tmp_path / ("h" * 90)
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != STATE_ROOT_ENV}
    env["HOME"] = str(home)
    root = home / ".lorenz" / "workers"
    workflow = files_workflow(tmp_path)
    try:
        result = run_lorenz(str(workflow), "--once", "--no-tui", cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "worker_socket_path_too_long" not in result.stdout + result.stderr
        assert (tmp_path / "agent-ran").exists()
        specs = [json.loads(p.read_text()) for p in root.glob("lzw-*/spec.json")]
        assert [s["issue"]["identifier"] for s in specs] == ["RUN-1"]
    finally:
        kill_workers_under(root)
        link = reachable_state_root(root)
        link.unlink()


def test_worker_detached_false_is_refused_on_a_single_host(tmp_path: Path) -> None:
    workflow = files_workflow(tmp_path, extra="worker:\n  detached: false\n")
    result = run_lorenz(str(workflow), "--once", "--no-tui", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "worker_detached_false" in result.stdout + result.stderr
    assert "delete worker.detached or set it to true" in result.stdout + result.stderr
    assert not (tmp_path / "agent-ran").exists()


# ------------------------------------------------------------------ required_labels


@pytest.mark.parametrize("labels", ['[""]', '["agent", "  "]'])
def test_a_blank_required_label_is_refused(tmp_path: Path, labels: str) -> None:
    workflow = files_workflow(tmp_path, extra=f"  required_labels: {labels}\n")
    with pytest.raises(InvalidWorkflowConfig) as caught:
        load_workflow(workflow, environ={})
    [problem] = caught.value.problems()
    assert problem.key_path == "tracker.required_labels"
    assert "blank" in problem.reason
    result = run_lorenz("validate", str(workflow), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout.startswith("invalid_workflow_config tracker.required_labels: entry ")


def test_required_labels_are_still_trimmed_lowercased_and_deduplicated(tmp_path: Path) -> None:
    workflow = files_workflow(tmp_path, extra='  required_labels: [" Agent ", "agent", "X"]\n')
    assert load_workflow(workflow, environ={}).settings.tracker.required_labels == ("agent", "x")


# ------------------------------------------------------------------ --help


def test_top_level_help_lists_the_run_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--once", "--dry-run", "--port", "--no-tui", "--flag", "--feature"):
        assert option in out, option
    assert "validate" in out


# ------------------------------------------------------------------ logs


def test_httpx_request_lines_are_demoted_unless_the_level_is_debug() -> None:
    try:
        logs.configure_logging(LoggingSettings())
        for name in ("httpx", "httpcore"):
            assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
            assert logging.getLogger(name).isEnabledFor(logging.WARNING), name
        logs.configure_logging(LoggingSettings(level="debug"))
        for name in ("httpx", "httpcore"):
            assert logging.getLogger(name).isEnabledFor(logging.DEBUG), name
    finally:
        setup = logs.active_logging()
        if setup is not None:
            setup.close()


def test_the_operator_demotes_httpx_request_lines_too(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from lorenz.kube.operator.process import configure_logging
    from lorenz.kube.settings import OperatorSettings

    # NB: the operator's set-up changes process-wide loggers; each is restored afterwards.
    for name in ("httpx", "httpcore", "lorenz", "kopf", "aiohttp.access"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    caplog.set_level(logging.INFO)  # the root at INFO, as the operator's basicConfig sets it
    configure_logging(OperatorSettings())
    for name in ("httpx", "httpcore"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
    configure_logging(OperatorSettings(log_level="debug"))
    for name in ("httpx", "httpcore"):
        assert logging.getLogger(name).isEnabledFor(logging.DEBUG), name


async def test_the_hydration_line_prints_counts_not_a_repr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    workflow = files_workflow(tmp_path)
    (tmp_path / "issues" / "RUN-1.md").unlink()
    monkeypatch.setattr(host, "ATTACHMENTS", [])
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="lorenz.daemon"):
        code = await run_host(HostOptions(workflow_path=str(workflow), once=True, environ={}))
    assert code == 0
    [line] = [r.getMessage() for r in caplog.records if "claims hydrated" in r.getMessage()]
    assert "HydrationReport" not in line
    assert line == (
        "claims hydrated backend=memory interrupted=0 adopting=0 restored_retries=0 "
        "taken_over=0 problems=0"
    )


# ------------------------------------------------------------------ start-up imports
# NB: the Kubernetes stack and the validate path: tests/cli/test_import_boundary.py.

PROBE = """
import sys
from lorenz.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
print("HEAVY=" + ",".join(heavy))
sys.exit(code)
"""


def test_a_run_without_a_port_does_not_import_the_http_server_stack(tmp_path: Path) -> None:
    files_workflow(tmp_path)
    probe = PROBE.format(heavy={"aiohttp", "prometheus_client"})
    plain = subprocess.run(
        [sys.executable, "-c", probe, "WORKFLOW.md", "--once", "--no-tui"],
        cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False,
    )
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "HEAVY=\n" in plain.stdout, plain.stdout
    served = subprocess.run(
        [sys.executable, "-c", probe, "WORKFLOW.md", "--once", "--no-tui", "--port", "0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False,
    )
    assert served.returncode == 0, served.stdout + served.stderr
    assert "aiohttp" in served.stdout.split("HEAVY=", 1)[1], served.stdout


# ------------------------------------------------------------------ worker.kind: pod


def test_a_workflow_with_pod_workers_is_refused_outside_the_operator(tmp_path: Path) -> None:
    files_workflow(tmp_path, extra="worker:\n  kind: pod\n")
    result = subprocess.run(
        [str(LORENZ), "WORKFLOW.md", "--once", "--no-tui"],
        cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False,
    )
    assert result.returncode != 0, result.stdout + result.stderr
    assert "worker_kind_unavailable" in result.stdout + result.stderr
    assert "only the Kubernetes operator" in result.stdout + result.stderr
    assert not (tmp_path / "agent-ran").exists()
