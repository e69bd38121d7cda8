"""agent_environment: the controller's environment plus the run's, minus tracker secrets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lorenz.agents.environment import TRACKER_SECRET_ENV, agent_environment, make_session_stores
from lorenz.agents.processes import spawn_agent


def test_base_and_extra_are_merged_with_extra_winning() -> None:
    env = agent_environment(
        base={"PATH": "/usr/bin", "HOME": "/home/a", "MODE": "base"},
        extra={"MODE": "extra", "LORENZ_ISSUE_ID": "abc"},
    )
    assert env == {"PATH": "/usr/bin", "HOME": "/home/a", "MODE": "extra", "LORENZ_ISSUE_ID": "abc"}


def test_well_known_tracker_variables_are_removed_by_name() -> None:
    base = {name: f"value-of-{name}" for name in TRACKER_SECRET_ENV}
    base["PATH"] = "/bin"
    env = agent_environment(base=base)
    assert env == {"PATH": "/bin"}
    assert set(TRACKER_SECRET_ENV) >= {"LINEAR_API_KEY", "GITHUB_TOKEN", "GH_TOKEN"}


def test_the_resolved_tracker_key_is_removed_by_value_under_any_name() -> None:
    env = agent_environment(
        base={"MY_LINEAR": "lin_api_secret", "PATH": "/bin"},
        extra={"COPIED_BY_MISTAKE": "lin_api_secret", "OTHER": "fine"},
        secret_values=["lin_api_secret"],
    )
    assert env == {"PATH": "/bin", "OTHER": "fine"}


def test_a_secret_listed_in_the_agent_env_is_still_removed() -> None:
    env = agent_environment(base={}, extra={"LINEAR_API_KEY": "explicit"})
    assert "LINEAR_API_KEY" not in env


def test_custom_secret_names_replace_the_defaults() -> None:
    env = agent_environment(
        base={"LINEAR_API_KEY": "k", "JIRA_TOKEN": "j"}, secret_names=["JIRA_TOKEN"]
    )
    assert env == {"LINEAR_API_KEY": "k"}


def test_empty_secret_values_strip_nothing() -> None:
    env = agent_environment(base={"EMPTY": "", "PATH": "/bin"}, secret_values=["", ""])
    assert env == {"EMPTY": "", "PATH": "/bin"}


def test_inputs_are_not_modified() -> None:
    base = {"LINEAR_API_KEY": "k", "A": "1"}
    extra = {"B": "2"}
    agent_environment(base=base, extra=extra)
    assert base == {"LINEAR_API_KEY": "k", "A": "1"}
    assert extra == {"B": "2"}


async def test_a_spawned_agent_never_sees_the_tracker_token(tmp_path: Path) -> None:
    base = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LINEAR_API_KEY": "lin_api_123",
        "GITHUB_TOKEN": "ghp_456",
    }
    env = agent_environment(
        base=base, extra={"ALIAS": "lin_api_123", "KEEP": "me"}, secret_values=["lin_api_123"]
    )
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    proc = await spawn_agent(
        command=f"{sys.executable} -c {json.dumps(code)}", cwd=tmp_path, env=env
    )
    try:
        line = await proc.read_line(timeout_s=60)
    finally:
        await proc.terminate()
    assert line is not None
    seen = json.loads(line)
    assert seen["KEEP"] == "me"
    assert "lin_api_123" not in seen.values()
    assert "ghp_456" not in seen.values()
    assert not {"LINEAR_API_KEY", "GITHUB_TOKEN", "ALIAS"} & set(seen)


def test_the_session_stores_the_environment_names_are_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    codex = tmp_path / "volume" / ".lorenz-sessions" / "codex"
    claude = tmp_path / "volume" / ".lorenz-sessions" / "claude"
    claude.mkdir(parents=True)
    (claude / "kept.json").write_text("{}")
    make_session_stores(
        {"CODEX_HOME": str(codex), "CLAUDE_CONFIG_DIR": str(claude), "OTHER": str(tmp_path / "x")}
    )
    assert codex.is_dir()
    assert (claude / "kept.json").read_text() == "{}"
    assert not (tmp_path / "x").exists()
    make_session_stores({"CODEX_HOME": "relative/home", "CLAUDE_CONFIG_DIR": ""})
    assert not (tmp_path / "relative").exists()
