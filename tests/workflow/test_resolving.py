"""``$VAR`` indirection and path resolution."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from lorenz.config import WorkflowSettings
from lorenz.workflow import default_workspace_root, settings_from_mapping
from lorenz.workflow.resolving import var_reference

BASE = Path("/srv/project")


def _settings(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> WorkflowSettings:
    return settings_from_mapping(data, base_dir=BASE, environ=env or {}).settings


def _linear(api_key: object = ..., **extra: Any) -> dict[str, Any]:
    tracker: dict[str, Any] = {"kind": "linear", "project_slug": "p", **extra}
    if api_key is not ...:
        tracker["api_key"] = api_key
    return {"tracker": tracker}


# -- what counts as a reference --------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("$TOKEN", "TOKEN"),
        ("$_x1", "_x1"),
        ("${TOKEN}", None),
        ("$TOKEN/x", None),
        ("prefix$TOKEN", None),
        (" $TOKEN", None),
        ("$1ABC", None),
        ("env:TOKEN", None),
        ("$", None),
    ],
)
def test_only_a_whole_value_dollar_name_is_a_reference(value: str, name: str | None) -> None:
    assert var_reference(value) == name


def test_non_whole_value_references_stay_literal() -> None:
    env = {"TOKEN": "secret"}
    assert _settings(_linear("${TOKEN}"), env).tracker.api_key == "${TOKEN}"
    assert _settings(_linear("x$TOKEN"), env).tracker.api_key == "x$TOKEN"
    # The old `env:` prefix is not supported either.
    assert _settings(_linear("env:TOKEN"), env).tracker.api_key == "env:TOKEN"


# -- secrets -----------------------------------------------------------


def test_api_key_literal() -> None:
    assert _settings(_linear("lin_literal"), {"LINEAR_API_KEY": "other"}).tracker.api_key == (
        "lin_literal"
    )


def test_api_key_through_var() -> None:
    env = {"MY_TOKEN": "from-var", "LINEAR_API_KEY": "fallback"}
    assert _settings(_linear("$MY_TOKEN"), env).tracker.api_key == "from-var"


def test_api_key_absent_reads_the_canonical_variable() -> None:
    assert _settings(_linear(), {"LINEAR_API_KEY": "canon"}).tracker.api_key == "canon"


def test_api_key_var_unset_falls_back_to_the_canonical_variable() -> None:
    assert _settings(_linear("$UNSET_ONE"), {"LINEAR_API_KEY": "canon"}).tracker.api_key == "canon"


def test_api_key_var_set_but_empty_is_missing_without_fallback() -> None:
    env = {"MY_TOKEN": "", "LINEAR_API_KEY": "canon"}
    assert _settings(_linear("$MY_TOKEN"), env).tracker.api_key is None


def test_api_key_literal_empty_is_missing() -> None:
    assert _settings(_linear(""), {"LINEAR_API_KEY": "canon"}).tracker.api_key is None
    assert _settings(_linear("   "), {}).tracker.api_key is None


def test_api_key_null_means_absent_so_the_fallback_applies() -> None:
    assert _settings(_linear(None), {"LINEAR_API_KEY": "canon"}).tracker.api_key == "canon"


def test_api_key_absent_and_fallback_empty_is_missing() -> None:
    assert _settings(_linear(), {"LINEAR_API_KEY": ""}).tracker.api_key is None
    assert _settings(_linear(), {}).tracker.api_key is None


def test_github_falls_back_to_github_token_not_linear() -> None:
    data = {"tracker": {"kind": "github", "repository": "o/r"}}
    env = {"GITHUB_TOKEN": "ghp", "LINEAR_API_KEY": "lin"}
    assert _settings(data, env).tracker.api_key == "ghp"


def test_other_kinds_have_no_fallback() -> None:
    data = {"tracker": {"kind": "files", "path": "issues"}}
    env = {"GITHUB_TOKEN": "ghp", "LINEAR_API_KEY": "lin"}
    assert _settings(data, env).tracker.api_key is None


def test_linear_assignee_works_the_same_way() -> None:
    env = {"LINEAR_ASSIGNEE": "me", "WHO": "user-1", "EMPTY": ""}
    assert _settings(_linear(), env).tracker.assignee == "me"
    assert _settings(_linear(assignee="$WHO"), env).tracker.assignee == "user-1"
    assert _settings(_linear(assignee="$NOPE"), env).tracker.assignee == "me"
    assert _settings(_linear(assignee="$EMPTY"), env).tracker.assignee is None


def test_secret_var_without_fallback_unset_is_missing() -> None:
    data = {"tracker": {"kind": "github", "repository": "o/r", "assignee": "$NOBODY"}}
    assert _settings(data, {}).tracker.assignee is None


def test_environment_is_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORENZ_TEST_TOKEN", "from-os")
    resolved = settings_from_mapping(_linear("$LORENZ_TEST_TOKEN"), base_dir=BASE)
    assert resolved.settings.tracker.api_key == "from-os"


# -- paths -------------------------------------------------------------


def test_relative_paths_resolve_against_the_workflow_folder() -> None:
    s = _settings({"workspace": {"root": "ws/../spaces"}, "tracker": {"path": "issues"}})
    assert s.workspace.root == "/srv/project/spaces"
    assert s.tracker.path == "/srv/project/issues"


def test_bare_names_resolve_too() -> None:
    assert _settings({"logging": {"log_file": "events.jsonl"}}).logging.log_file == (
        "/srv/project/events.jsonl"
    )


def test_absolute_paths_are_kept() -> None:
    assert _settings({"workspace": {"root": "/var/lorenz"}}).workspace.root == "/var/lorenz"


def test_tilde_expands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/tester")
    s = _settings({"workspace": {"root": "~/spaces"}, "logging": {"log_file": "~"}})
    assert s.workspace.root == "/home/tester/spaces"
    assert s.logging.log_file == "/home/tester"


def test_path_var_is_substituted_then_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/tester")
    env = {"WS": "~/from-env", "REL": "relative/dir", "ABS": "/abs"}
    s = _settings(
        {
            "workspace": {"root": "$WS", "kind": "worktree", "repo": "$REL"},
            "logging": {"log_file": "$ABS"},
        },
        env,
    )
    assert s.workspace.root == "/home/tester/from-env"
    assert s.workspace.repo == "/srv/project/relative/dir"
    assert s.logging.log_file == "/abs"


def test_a_var_inside_a_longer_path_is_literal() -> None:
    assert _settings({"workspace": {"root": "$HOME/ws"}}, {"HOME": "/h"}).workspace.root == (
        "/srv/project/$HOME/ws"
    )


@pytest.mark.parametrize("env", [{}, {"WS": ""}, {"WS": "  "}])
def test_workspace_root_var_unset_or_empty_falls_back_to_the_default(env: dict[str, str]) -> None:
    assert _settings({"workspace": {"root": "$WS"}}, env).workspace.root == default_workspace_root()


def test_default_workspace_root_is_absolute_under_the_system_temp() -> None:
    root = _settings({}).workspace.root
    assert root == os.path.join(tempfile.gettempdir(), "lorenz_workspaces")
    assert root is not None
    assert os.path.isabs(root)


def test_other_path_var_unset_is_missing() -> None:
    assert _settings({"tracker": {"kind": "files", "path": "$NOPE"}}).tracker.path is None


def test_non_string_path_is_a_schema_error_not_a_crash() -> None:
    from lorenz.workflow import InvalidWorkflowConfig

    with pytest.raises(InvalidWorkflowConfig) as caught:
        _settings({"workspace": {"root": 42}})
    assert [p.key_path for p in caught.value.problems()] == ["workspace.root"]


# -- URIs and strings that are not paths -------------------------------------------------------


def test_endpoint_urls_are_never_rewritten() -> None:
    s = _settings(_linear("k", endpoint="http://127.0.0.1:9/graphql"))
    assert s.tracker.endpoint == "http://127.0.0.1:9/graphql"


# -- keys to strings, nulls dropped, pass-through kept ---------------------------------


def test_map_keys_become_strings() -> None:
    s = _settings({"agent": {"max_concurrent_agents_by_state": {404: 2}}})
    assert s.agent.max_concurrent_agents_by_state == {"404": 2}


def test_pass_through_values_keep_their_nulls_and_shape() -> None:
    provider = {"team": None, "nested": {"a": None, "b": [1, None]}, 7: "seven"}
    s = _settings({"tracker": {"kind": "memory", "provider": provider}})
    assert s.tracker.provider == {"team": None, "nested": {"a": None, "b": [1, None]}, "7": "seven"}


def test_null_map_entries_are_dropped_outside_pass_through() -> None:
    s = _settings({"agent": {"max_concurrent_agents_by_state": {"todo": None, "doing": 1}}})
    assert s.agent.max_concurrent_agents_by_state == {"doing": 1}
