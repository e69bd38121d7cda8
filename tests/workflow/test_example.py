"""The shipped sample examples/WORKFLOW.md loads, validates and renders."""

from __future__ import annotations

import datetime
from pathlib import Path

from lorenz.model import BlockerRef, Issue, RetryKind
from lorenz.workflow import dispatch_problems, load_workflow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "WORKFLOW.md"


def test_sample_loads_without_warnings_and_passes_every_check() -> None:
    loaded = load_workflow(EXAMPLE, environ={"LINEAR_API_KEY": "lin_test"})
    assert loaded.warnings == ()
    assert dispatch_problems(loaded.settings) == []
    assert loaded.prompt.problems() == []
    assert loaded.settings.tracker.api_key == "lin_test"
    assert loaded.settings.workspace.root == str(EXAMPLE.parent / ".lorenz-workspaces")
    assert loaded.settings.agent.max_concurrent_agents_by_state == {"in progress": 3}
    assert loaded.flag_sources["claim_store.owner_stale_ms"].value == 60000


def test_sample_renders_a_first_run_and_a_retry() -> None:
    loaded = load_workflow(EXAMPLE, environ={})
    issue = Issue(
        id="1",
        identifier="LOR-7",
        title="Make it faster",
        state="In Progress",
        labels=("agent-ok", "perf"),
        blocked_by=(BlockerRef(id="0", identifier="LOR-6", state="Done"),),
        created_at=datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC),
    )
    first = loaded.render_prompt(issue=issue)
    assert "LOR-7: Make it faster" in first
    assert "No description provided." in first
    assert "- LOR-6 (Done)" in first
    assert "This is attempt" not in first
    retry = loaded.render_prompt(issue=issue, attempt=2, retry_kind=RetryKind.FAILURE)
    assert "This is attempt 2, after the previous run failed" in retry
