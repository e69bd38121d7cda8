"""``lorenz validate``, ``lorenz config`` and the dispatch of subcommands and run mode."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lorenz.cli as cli
from lorenz.cli import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Subcommand, main
from tests.cli import fake_subcommand

LORENZ = Path(sys.executable).with_name("lorenz")

MEMORY_WORKFLOW = """---
tracker:
  kind: memory
agent:
  max_concurrent_agents: 3
---
Work on {{ issue.identifier }}.
"""


@pytest.fixture
def workflow(tmp_path: Path) -> Path:
    path = tmp_path / "WORKFLOW.md"
    path.write_text(MEMORY_WORKFLOW, encoding="utf-8")
    return path


def _write(tmp_path: Path, text: str, name: str = "WORKFLOW.md") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- real console script in a subprocess -------------------------------------------------------


def _run(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LORENZ_")}
    base.pop("LINEAR_API_KEY", None)
    return subprocess.run(
        [str(LORENZ), *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_console_script_validate_ok_in_the_working_directory(workflow: Path) -> None:
    result = _run("validate", cwd=workflow.parent)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"ok {workflow}: ")
    assert "tracker=memory" in line
    assert "agent=codex(codex-app-server)" in line
    assert "max_concurrent_agents=3" in line
    assert "claim_store=memory" in line


def test_console_script_validate_reports_each_error_and_exits_2(tmp_path: Path) -> None:
    path = _write(tmp_path, "---\ntracker:\n  kind: linear\npolling:\n  interval_ms: 0\n---\n")
    result = _run("validate", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout.splitlines() == [
        "invalid_workflow_config polling.interval_ms: Input should be greater than 0"
    ]
    fixed = _write(tmp_path, "---\ntracker:\n  kind: linear\n---\n", name="second.md")
    result = _run("validate", str(fixed), cwd=tmp_path)
    assert result.returncode == 2
    codes = [line.split(" ", 1)[0] for line in result.stdout.splitlines()]
    assert codes == ["missing_tracker_api_key", "missing_tracker_project_slug"]


def test_console_script_config_json_shows_flag_sources(workflow: Path) -> None:
    result = _run(
        "config",
        str(workflow),
        "--json",
        "--feature",
        "durable_claims",
        cwd=workflow.parent,
        env={"LORENZ_FLAG_DAEMON__STALE_MS": "40000"},
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["path"] == str(workflow)
    assert report["settings"]["agent"]["max_concurrent_agents"] == 3
    assert report["flags"]["claim_store.backend"] == {
        "value": "sqlite",
        "source": "cli",
        "via": "feature durable_claims",
    }
    assert report["flags"]["daemon.stale_ms"]["source"] == "env"
    assert report["flags"]["daemon.stale_ms"]["value"] == 40000
    assert report["flags"]["daemon.heartbeat_ms"]["source"] == "default"
    assert report["features"]["durable_claims"]["source"] == "cli"


def test_top_level_cli_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from lorenz.cli import main\n"
        "main(['--help'])\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'pydantic', 'aiohttp', 'kopf', 'kubernetes', 'yaml', 'liquid', 'httpx'})\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "HEAVY []" in result.stdout


# -- validate, in process ----------------------------------------------------------------------


def test_validate_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "absent.md")]) == EXIT_USAGE
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("missing_workflow_file: cannot read workflow file ")


def test_validate_missing_default_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["validate"]) == EXIT_USAGE
    assert str(tmp_path / "WORKFLOW.md") in capsys.readouterr().out


def test_validate_flags_and_features_change_the_summary(
    workflow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["validate", str(workflow), "--flag", "claim_store.backend=turso", "--feature", "daemon"]
    assert main(argv) == EXIT_OK
    line = capsys.readouterr().out.strip()
    assert "claim_store=turso" in line
    assert "daemon=on" in line


def test_validate_unknown_flag_and_feature(
    workflow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(workflow), "--flag", "claim_store.bakend=x"]) == EXIT_USAGE
    out = capsys.readouterr().out
    assert out.startswith("unknown_flag --flag claim_store.bakend: ")
    assert "claim_store.backend" in out
    assert main(["validate", str(workflow), "--feature", "turbo"]) == EXIT_USAGE
    assert capsys.readouterr().out.startswith("unknown_feature --feature turbo: ")


def test_validate_bad_flag_syntax(workflow: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(workflow), "--flag", "daemon.enabled"]) == EXIT_USAGE
    assert capsys.readouterr().out.startswith("invalid_flag_syntax ")


def test_validate_bad_flag_value_names_the_flag(
    workflow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(workflow), "--flag", "daemon.stale_ms=-1"]) == EXIT_USAGE
    out = capsys.readouterr().out
    assert out.startswith("invalid_workflow_config flags.daemon.stale_ms: ")
    assert "(set by cli)" in out


def test_validate_env_flags_apply(
    workflow: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LORENZ_FEATURE_DURABLE_CLAIMS", "on")
    assert main(["validate", str(workflow)]) == EXIT_OK
    assert "claim_store=sqlite" in capsys.readouterr().out


def test_validate_reports_template_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "---\ntracker:\n  kind: memory\n---\n{{ issue.titel }} {{ x | shout }}")
    assert main(["validate", str(path)]) == EXIT_USAGE
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert all(line.startswith("template_render_error prompt: ") for line in lines)
    broken = _write(tmp_path, "---\ntracker:\n  kind: memory\n---\n{% if %}", name="b.md")
    assert main(["validate", str(broken)]) == EXIT_USAGE
    assert capsys.readouterr().out.startswith("template_parse_error prompt: ")


def test_validate_prints_warnings_but_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "---\ntracker:\n  kind: memory\nobservability: {}\n---\n")
    assert main(["validate", str(path)]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "warning: unknown top-level key 'observability' ignored"
    assert lines[1].startswith("ok ")
    assert lines[1].endswith("prompt=default")


def test_validate_flag_only_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "---\ntracker:\n  kind: memory\ndaemon:\n  enabled: true\n---\n")
    assert main(["validate", str(path)]) == EXIT_USAGE
    assert capsys.readouterr().out.startswith("flag_only_section daemon: ")


def test_validate_unsupported_tracker_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "---\ntracker:\n  kind: asana\n---\n")
    assert main(["validate", str(path)]) == EXIT_USAGE
    assert capsys.readouterr().out.startswith("unsupported_tracker_kind tracker.kind: 'asana'")


def test_validate_missing_tracker_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "---\npolling:\n  interval_ms: 10\n---\n")
    assert main(["validate", str(path)]) == EXIT_USAGE
    assert capsys.readouterr().out.startswith("missing_tracker_kind tracker.kind: ")


# -- config, in process ------------------------------------------------------------------------


def test_config_text_shows_settings_flags_and_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        tmp_path,
        "---\ntracker:\n  kind: linear\n  project_slug: p\nflags:\n  daemon.heartbeat_ms: 2000\n"
        "---\n",
    )
    monkeypatch.setenv("LINEAR_API_KEY", "lin_do_not_print")
    monkeypatch.setenv("LORENZ_FEATURE_DAEMON", "1")
    assert main(["config", str(path), "--flag", "claim_store.path=/var/claims.db"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "lin_do_not_print" not in out
    assert "api_key: '***'" in out
    assert "project_slug: p" in out
    assert 'claim_store.path = "/var/claims.db"  <- cli' in out
    assert "daemon.heartbeat_ms = 2000  <- front-matter" in out
    assert "daemon.enabled = true  <- env (feature daemon)" in out
    assert "daemon = on  <- env (LORENZ_FEATURE_DAEMON)" in out
    assert "durable_claims = off  <- default" in out


def test_config_json_redacts_and_includes_the_prompt(
    workflow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", str(workflow), "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["prompt"] == {"default": False, "template": "Work on {{ issue.identifier }}."}
    assert report["warnings"] == []
    assert set(report) == {"path", "settings", "flags", "features", "prompt", "warnings"}


def test_config_errors_go_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "---\n- a\n---\n")
    assert main(["config", str(path)]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("workflow_front_matter_not_a_map: ")


def test_config_works_without_a_tracker_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "")
    assert main(["config", str(path), "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["settings"]["tracker"]["kind"] is None


# -- dispatch: subcommands, run mode, exit codes -----------------------------------------------


@pytest.fixture
def fake_run_mode(monkeypatch: pytest.MonkeyPatch) -> list[argparse.Namespace]:
    fake_subcommand.CALLS.clear()
    monkeypatch.setattr(cli, "RUN_MODE", Subcommand("tests.cli.fake_subcommand", "fake run"))
    return fake_subcommand.CALLS


def test_no_subcommand_means_run_mode_with_the_path(
    fake_run_mode: list[argparse.Namespace],
) -> None:
    assert main(["WORKFLOW.md", "--flag", "daemon.enabled=true"]) == EXIT_OK
    (args,) = fake_subcommand.CALLS
    assert args.workflow == "WORKFLOW.md"
    assert args.flag == ["daemon.enabled=true"]


def test_options_first_still_means_run_mode(fake_run_mode: list[argparse.Namespace]) -> None:
    assert main(["--flag", "daemon.enabled=true", "flow.md"]) == EXIT_OK
    assert fake_subcommand.CALLS[0].workflow == "flow.md"


def test_no_arguments_means_run_mode_with_the_default_path(
    fake_run_mode: list[argparse.Namespace],
) -> None:
    assert main([]) == EXIT_OK
    assert fake_subcommand.CALLS[0].workflow is None


@pytest.mark.parametrize(
    ("behave", "code"),
    [
        ("interrupt", EXIT_INTERRUPTED),
        ("config-error", EXIT_USAGE),
        ("template-error", EXIT_USAGE),
        ("runtime-error", EXIT_FAILURE),
    ],
)
def test_exit_codes(
    fake_run_mode: list[argparse.Namespace],
    behave: str,
    code: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--behave", behave]) == code
    if behave == "runtime-error":
        assert "tracker_down: the tracker went away" in capsys.readouterr().err


def test_unexpected_exceptions_propagate(fake_run_mode: list[argparse.Namespace]) -> None:
    with pytest.raises(RuntimeError, match="bug"):
        main(["--behave", "crash"])


def test_usage_errors_exit_2(
    fake_run_mode: list[argparse.Namespace], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--no-such-option"]) == EXIT_USAGE
    assert "unrecognized arguments" in capsys.readouterr().err
    assert main(["validate", "a.md", "b.md"]) == EXIT_USAGE


def test_subcommand_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "--flag KEY=VALUE" in out
    assert "--feature NAME" in out


def test_a_registered_subcommand_can_be_added_without_touching_main(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_subcommand.CALLS.clear()
    monkeypatch.setitem(cli.SUBCOMMANDS, "fake", Subcommand("tests.cli.fake_subcommand", "x"))
    assert main(["fake", "given.md"]) == EXIT_OK
    assert fake_subcommand.CALLS[0].workflow == "given.md"


def test_a_reserved_but_missing_subcommand_is_not_taken_for_a_path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.SUBCOMMANDS, "later", Subcommand("lorenz.cli.not_written_yet", "x"))
    assert main(["later", "WORKFLOW.md"]) == EXIT_FAILURE
    assert "not available in this build yet" in capsys.readouterr().err


def test_missing_run_mode_module_is_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "RUN_MODE", Subcommand("lorenz.cli.not_written_yet", "x"))
    assert main(["WORKFLOW.md"]) == EXIT_FAILURE
    assert "run mode is not available" in capsys.readouterr().err


def test_top_level_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "usage: lorenz [WORKFLOW.md]" in out
    assert "validate" in out
    assert "config" in out
    assert "130 interrupted" in out
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out.startswith("lorenz ")
