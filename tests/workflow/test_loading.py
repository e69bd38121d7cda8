"""The load pipeline: path selection, defaults, strict schema errors, warnings, stamps."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest

from lorenz.config import TrackerKind, WorkflowSettings
from lorenz.workflow import (
    ConfigProblem,
    FlagOnlySection,
    InvalidWorkflowConfig,
    LoadedWorkflow,
    MissingWorkflowFile,
    WorkflowStamp,
    load_workflow,
    select_workflow_path,
    settings_from_mapping,
    workflow_stamp,
)
from tests.workflow.conftest import WriteWorkflow


def _problems(exc: InvalidWorkflowConfig) -> dict[str, ConfigProblem]:
    return {p.key_path: p for p in exc.problems()}


# -- path selection --------------------------------------------------------------


def test_explicit_path_is_used(write_workflow: WriteWorkflow, tmp_path: Path) -> None:
    write_workflow("polling:\n  interval_ms: 1111")  # ./WORKFLOW.md, which must NOT be read
    other = write_workflow("polling:\n  interval_ms: 2222", name="custom/flow.md")
    loaded = load_workflow(other, environ={}, cwd=tmp_path)
    assert loaded.path == other
    assert loaded.settings.polling.interval_ms == 2222


def test_relative_explicit_path_resolves_against_cwd(
    write_workflow: WriteWorkflow, tmp_path: Path
) -> None:
    write_workflow("polling:\n  interval_ms: 3333", name="sub/W.md")
    loaded = load_workflow("sub/W.md", environ={}, cwd=tmp_path)
    assert loaded.path == tmp_path / "sub" / "W.md"
    assert loaded.settings.polling.interval_ms == 3333


def test_default_path_is_workflow_md_in_the_working_directory(
    write_workflow: WriteWorkflow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_workflow("polling:\n  interval_ms: 4444")
    monkeypatch.chdir(tmp_path)
    loaded = load_workflow(environ={})
    assert loaded.path == tmp_path / "WORKFLOW.md"
    assert loaded.settings.polling.interval_ms == 4444
    assert select_workflow_path() == tmp_path / "WORKFLOW.md"


# -- missing file -------------------------------------------------------------------------


def test_missing_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(MissingWorkflowFile) as caught:
        load_workflow(tmp_path / "nope.md", environ={})
    assert caught.value.code == "missing_workflow_file"
    assert str(tmp_path / "nope.md") in caught.value.message
    assert "No such file" in caught.value.message
    assert isinstance(caught.value, OSError)  # code guarding file access with OSError sees it


def test_missing_default_file_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MissingWorkflowFile, match=r"WORKFLOW\.md"):
        load_workflow(environ={})


def test_a_directory_is_not_a_workflow_file(tmp_path: Path) -> None:
    (tmp_path / "WORKFLOW.md").mkdir()
    with pytest.raises(MissingWorkflowFile, match="Is a directory"):
        load_workflow(tmp_path / "WORKFLOW.md", environ={})


# -- defaults ---------------------------------------------------------------------------


def test_defaults_apply_when_optional_values_are_missing(write_workflow: WriteWorkflow) -> None:
    loaded = load_workflow(write_workflow(""), environ={})
    settings = loaded.settings
    assert settings.tracker.kind is None
    assert settings.tracker.active_states == ("Todo", "In Progress")
    assert settings.tracker.terminal_states == (
        "Closed",
        "Cancelled",
        "Canceled",
        "Duplicate",
        "Done",
    )
    assert settings.polling.interval_ms == 30000
    assert settings.workspace.root == str(Path(tempfile.gettempdir()) / "lorenz_workspaces")
    assert settings.hooks.timeout_ms == 60000
    assert settings.agent.max_concurrent_agents == 10
    assert settings.agent.max_turns == 20
    assert settings.agent.max_retry_backoff_ms == 300000
    assert settings.agent.max_concurrent_agents_by_state == {}
    assert settings.codex.command == "codex app-server"
    assert settings.agent_kind().stall_timeout_ms == 300000
    assert settings.worker.worker_pool.acquire_timeout_ms == 30000
    assert settings.worker.worker_pool.drain_deadline_ms == 30000
    assert settings.claim_store.backend == "memory"
    assert settings.daemon.enabled is False


def test_null_values_mean_the_default(write_workflow: WriteWorkflow) -> None:
    path = write_workflow(
        "tracker:\n  kind: memory\n  active_states: null\npolling:\n  interval_ms:\nhooks:\n"
        "agent: ~\n"
    )
    settings = load_workflow(path, environ={}).settings
    assert settings.tracker.active_states == ("Todo", "In Progress")
    assert settings.polling.interval_ms == 30000
    assert settings.agent.max_turns == 20


# -- tracker kinds ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [k.value for k in TrackerKind])
def test_every_supported_tracker_kind_is_accepted(kind: str) -> None:
    resolved = settings_from_mapping({"tracker": {"kind": kind}}, base_dir=Path("/"), environ={})
    assert resolved.settings.tracker.kind == kind


def test_an_unsupported_tracker_kind_is_reported_under_its_own_code() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping({"tracker": {"kind": "asana"}}, base_dir=Path("/"), environ={})
    problem = _problems(caught.value)["tracker.kind"]
    assert problem.code == "unsupported_tracker_kind"
    assert "'asana'" in problem.reason
    assert "linear" in problem.reason
    assert problem.format().startswith("unsupported_tracker_kind tracker.kind: ")


# -- commands stay verbatim -------------------------------------------------------------


def test_codex_command_is_kept_as_a_shell_string() -> None:
    command = 'codex --config model="o3" app-server | tee $LOG_FILE ~/x'
    resolved = settings_from_mapping(
        {"codex": {"command": command}, "hooks": {"before_run": "echo $HOME ~"}},
        base_dir=Path("/w"),
        environ={"LOG_FILE": "/tmp/log", "HOME": "/home/u"},
    )
    assert resolved.settings.codex.command == command
    assert resolved.settings.agent_kind().command == command
    assert resolved.settings.hooks.before_run == "echo $HOME ~"


def test_a_whole_value_var_in_a_command_is_not_substituted() -> None:
    resolved = settings_from_mapping(
        {
            "agents": {"mine": {"command": "$AGENT_CMD", "env": {"K": "$SECRET"}}},
            "agent": {"kind": "mine"},
        },
        base_dir=Path("/w"),
        environ={"AGENT_CMD": "rm -rf /", "SECRET": "s"},
    )
    kind = resolved.settings.agent_kind()
    assert kind.command == "$AGENT_CMD"
    assert kind.env == {"K": "$SECRET"}


# -- per-state caps ---------------------------------------------------------------------


def test_per_state_caps_normalize_state_names() -> None:
    resolved = settings_from_mapping(
        {"agent": {"max_concurrent_agents_by_state": {"  In Progress ": 2, "TODO": "3"}}},
        base_dir=Path("/"),
        environ={},
    )
    assert resolved.settings.agent.max_concurrent_agents_by_state == {"in progress": 2, "todo": 3}


@pytest.mark.parametrize("bad", [0, -1, "many", 1.5, True])
def test_per_state_caps_reject_invalid_values_strictly(bad: object) -> None:
    # Strict policy (documented): an invalid cap is an error, never silently dropped.
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping(
            {"agent": {"max_concurrent_agents_by_state": {"todo": bad}}},
            base_dir=Path("/"),
            environ={},
        )
    assert "agent.max_concurrent_agents_by_state.todo" in _problems(caught.value)


def test_per_state_caps_reject_blank_state_names() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping(
            {"agent": {"max_concurrent_agents_by_state": {"  ": 1}}}, base_dir=Path("/"), environ={}
        )
    problem = _problems(caught.value)["agent.max_concurrent_agents_by_state"]
    assert "blank" in problem.reason


# -- strict validation -------------------------------------------------------------------------


def test_every_schema_problem_is_reported_with_its_dotted_key_path() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping(
            {
                "polling": {"interval_ms": 0},
                "agent": {"max_concurrent_agents": "ten", "max_turns": -3},
                "tracker": {"active_states": "Todo, In Progress"},
            },
            base_dir=Path("/"),
            environ={},
        )
    exc = caught.value
    assert exc.code == "invalid_workflow_config"
    problems = _problems(exc)
    assert set(problems) == {
        "polling.interval_ms",
        "agent.max_concurrent_agents",
        "agent.max_turns",
        "tracker.active_states",
    }
    assert problems["polling.interval_ms"].reason == "Input should be greater than 0"
    assert problems["agent.max_concurrent_agents"].reason == "must be an integer"
    assert "YAML list" in problems["tracker.active_states"].reason
    assert all(p.code == "invalid_workflow_config" for p in problems.values())
    assert "polling.interval_ms Input should be greater than 0" in exc.message


def test_integer_strings_are_accepted_but_not_floats_or_booleans() -> None:
    ok = settings_from_mapping({"polling": {"interval_ms": "1500"}}, base_dir=Path("/"), environ={})
    assert ok.settings.polling.interval_ms == 1500
    for bad in (1.0, True, "1.5"):
        with pytest.raises(InvalidWorkflowConfig):
            settings_from_mapping({"polling": {"interval_ms": bad}}, base_dir=Path("/"), environ={})


def test_unknown_key_in_a_known_section_is_an_error_listing_known_keys() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping(
            {
                "tracker": {"kind": "memory", "kidn": "x"},
                "agents": {"a": {"command": "x", "cmd": 1}},
            },
            base_dir=Path("/"),
            environ={},
        )
    problems = _problems(caught.value)
    assert "unknown key" in problems["tracker.kidn"].reason
    assert "active_states" in problems["tracker.kidn"].reason
    assert "protocol" in problems["agents.a.cmd"].reason


def test_an_unknown_key_is_an_error_even_with_a_null_value() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping({"polling": {"intervall_ms": None}}, base_dir=Path("/"), environ={})
    assert "polling.intervall_ms" in _problems(caught.value)


def test_required_key_missing_is_reported() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping({"agents": {"claude": {}}}, base_dir=Path("/"), environ={})
    assert _problems(caught.value)["agents.claude.command"].reason == "is required"


def test_a_section_that_is_not_a_map_is_an_error() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping({"workspace": "/tmp/x"}, base_dir=Path("/"), environ={})
    assert "workspace" in _problems(caught.value)


def test_model_level_problem_has_a_useful_message() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping({"agent": {"kind": "claude"}}, base_dir=Path("/"), environ={})
    (problem,) = caught.value.problems()
    assert "agent.kind 'claude' is not defined" in problem.reason


def test_unknown_top_level_keys_are_ignored_with_a_warning(
    write_workflow: WriteWorkflow, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_workflow(
        "observability:\n  dashboard_enabled: true\n42: x\ntracker:\n  kind: memory"
    )
    with caplog.at_level(logging.WARNING, logger="lorenz.workflow"):
        loaded = load_workflow(path, environ={})
    assert loaded.warnings == (
        "unknown top-level key 'observability' ignored",
        "unknown top-level key '42' ignored",
    )
    assert loaded.settings.tracker.kind == "memory"
    assert any("observability" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("section", ["claim_store", "daemon"])
def test_flag_only_sections_cannot_be_written_directly(section: str) -> None:
    with pytest.raises(FlagOnlySection) as caught:
        settings_from_mapping({section: {"enabled": True}}, base_dir=Path("/"), environ={})
    exc = caught.value
    assert exc.code == "flag_only_section"
    assert exc.key_path == section
    assert "flags:" in exc.message
    assert "features: [" in exc.message


def test_a_null_flag_only_section_is_harmless() -> None:
    resolved = settings_from_mapping({"claim_store": None}, base_dir=Path("/"), environ={})
    assert resolved.settings.claim_store.backend == "memory"


# -- result, stamps ----------------------------------------------------------------------------


def test_loaded_workflow_carries_everything(write_workflow: WriteWorkflow) -> None:
    path = write_workflow("tracker:\n  kind: memory", body="\n\n  Do {{ issue.title }}  \n")
    loaded = load_workflow(path, environ={})
    assert isinstance(loaded, LoadedWorkflow)
    assert isinstance(loaded.settings, WorkflowSettings)
    assert loaded.prompt_template == "Do {{ issue.title }}"
    assert loaded.raw == {"tracker": {"kind": "memory"}}
    assert loaded.warnings == ()
    assert loaded.base_dir == path.parent
    assert loaded.stamp == workflow_stamp(path)


def test_stamp_changes_with_content_even_at_same_size_and_mtime(tmp_path: Path) -> None:
    path = tmp_path / "WORKFLOW.md"
    path.write_text("---\na: 1\n---\nbody-a")
    first = workflow_stamp(path)
    stat = path.stat()
    path.write_text("---\na: 2\n---\nbody-b")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = workflow_stamp(path)
    assert (second.size, second.mtime_ns) == (first.size, first.mtime_ns)
    assert second != first
    assert isinstance(second, WorkflowStamp)
    assert len(second.sha256) == 64


def test_stamp_of_a_missing_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(MissingWorkflowFile):
        workflow_stamp(tmp_path / "gone.md")


def test_canonical_path_resolves_symlinks_but_paths_resolve_against_the_link(
    tmp_path: Path,
) -> None:
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    (real_dir / "WORKFLOW.md").write_text("---\nworkspace:\n  root: ws\n---\n")
    link_dir = tmp_path / "link"
    link_dir.mkdir()
    (link_dir / "WORKFLOW.md").symlink_to(real_dir / "WORKFLOW.md")
    loaded = load_workflow(link_dir / "WORKFLOW.md", environ={})
    assert loaded.canonical_path == real_dir / "WORKFLOW.md"
    assert loaded.settings.workspace.root == str(link_dir / "ws")


def test_settings_from_mapping_needs_no_file() -> None:
    resolved = settings_from_mapping(
        {"tracker": {"kind": "github", "repository": "o/r"}, "workspace": {"root": "ws"}},
        base_dir=Path("/srv/flows"),
        environ={"GITHUB_TOKEN": "ghp_x"},
    )
    assert resolved.settings.tracker.api_key == "ghp_x"
    assert resolved.settings.workspace.root == "/srv/flows/ws"
    assert resolved.flag_sources["claim_store.backend"].source == "default"
