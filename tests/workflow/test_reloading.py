"""Reload on change; keep the last good workflow on a bad one."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lorenz.workflow import MissingTrackerKind, WorkflowParseError, WorkflowReloader

GOOD = "---\ntracker:\n  kind: memory\npolling:\n  interval_ms: {interval}\n---\nPrompt {n}\n"


def _write(path: Path, interval: int, n: int = 1) -> None:
    path.write_text(GOOD.format(interval=interval, n=n), encoding="utf-8")


def test_a_change_is_detected_and_applied(tmp_path: Path) -> None:
    path = tmp_path / "WORKFLOW.md"
    _write(path, 1000)
    reloader = WorkflowReloader(path, environ={})
    assert reloader.check().changed is False
    _write(path, 2000, n=2)
    result = reloader.check()
    assert (result.changed, result.reloaded, result.error) == (True, True, None)
    assert reloader.current.settings.polling.interval_ms == 2000
    assert reloader.current.prompt_template == "Prompt 2"
    assert reloader.check().changed is False


def test_an_invalid_reload_keeps_the_last_good_workflow_and_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "WORKFLOW.md"
    _write(path, 1000)
    reloader = WorkflowReloader(path, environ={})
    good = reloader.current
    path.write_text("---\ntracker: [\n---\n", encoding="utf-8")
    with caplog.at_level(logging.ERROR, logger="lorenz.workflow"):
        first = reloader.check()
        second = reloader.check()  # NB: the stamp is not advanced, so the error repeats
    assert isinstance(first.error, WorkflowParseError)
    assert isinstance(second.error, WorkflowParseError)
    assert (first.changed, first.reloaded) == (True, False)
    assert reloader.current is good
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    assert "keeping last known good" in errors[0].getMessage()
    assert "workflow_parse_error" in errors[0].getMessage()
    _write(path, 3000)
    assert reloader.check().reloaded is True
    assert reloader.current.settings.polling.interval_ms == 3000


def test_a_reload_failing_the_preflight_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "WORKFLOW.md"
    _write(path, 1000)
    reloader = WorkflowReloader(path, environ={})
    path.write_text("---\npolling:\n  interval_ms: 5\n---\n", encoding="utf-8")
    result = reloader.check()
    assert isinstance(result.error, MissingTrackerKind)
    assert reloader.current.settings.polling.interval_ms == 1000


def test_a_deleted_file_keeps_the_last_good_workflow(tmp_path: Path) -> None:
    path = tmp_path / "WORKFLOW.md"
    _write(path, 1000)
    reloader = WorkflowReloader(path, environ={})
    path.unlink()
    result = reloader.check()
    assert result.error is not None
    assert result.error.code == "missing_workflow_file"
    assert reloader.current.settings.polling.interval_ms == 1000


def test_startup_with_an_invalid_workflow_raises(tmp_path: Path) -> None:
    path = tmp_path / "WORKFLOW.md"
    path.write_text("---\npolling:\n  interval_ms: 5\n---\n", encoding="utf-8")
    with pytest.raises(MissingTrackerKind):
        WorkflowReloader(path, environ={})
    assert WorkflowReloader(path, environ={}, check_settings=None).current.path == path


def test_reloads_keep_the_cli_overrides(tmp_path: Path) -> None:
    path = tmp_path / "WORKFLOW.md"
    _write(path, 1000)
    reloader = WorkflowReloader(path, cli_features=["durable_claims"], environ={})
    _write(path, 2000)
    assert reloader.check().reloaded
    assert reloader.current.settings.claim_store.backend == "sqlite"
