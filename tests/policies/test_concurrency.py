"""Per-kind concurrency: choosing an issue's agent kind, the per-kind cap next to the global and
per-state caps, the settings that drive them (validated at load), and host choice for retries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lorenz.config import WorkflowSettings
from lorenz.model import SlotKey
from lorenz.orchestrator import Skipped, SkipReason, Started
from lorenz.policies import (
    CapacityShortage,
    agent_kind_for,
    capacity_shortage,
    kind_limit,
    retry_host,
    select_worker_host,
)
from lorenz.workflow import InvalidWorkflowConfig, load_workflow, settings_from_mapping
from tests.orchestrator.factories import issue, make

KINDS = {
    "claude": {"command": "claude -p", "protocol": "claude-stream-json"},
    "reviewer": {"command": "review-bot", "protocol": "command"},
}


def settings(**agent: Any) -> WorkflowSettings:
    return WorkflowSettings.model_validate({"agents": KINDS, "agent": agent})


# -- choosing the kind ----------------------------------------------------------------------


def test_a_single_agent_workflow_always_runs_its_kind() -> None:
    plain = WorkflowSettings.model_validate({})
    assert agent_kind_for(issue(1, labels=["anything"]), agent=plain.agent) == "codex"
    assert kind_limit("codex", agent=plain.agent) is None
    assert capacity_shortage(
        "todo", occupied=3, occupied_in_state=3, agent=plain.agent, kind="codex",
        occupied_of_kind=3,
    ) is None


def test_a_label_rule_wins_over_a_state_rule_and_the_first_listed_label_wins() -> None:
    agent = settings(
        kind_by_label={"Needs-Claude": "claude", "review": "reviewer"},
        kind_by_state={"In Review": "reviewer", "todo": "claude"},
    ).agent
    assert agent_kind_for(issue(1, labels=[" needs-claude "]), agent=agent) == "claude"
    both = issue(2, labels=["review", "needs-claude"], state="Todo")
    assert agent_kind_for(both, agent=agent) == "claude"  # order of kind_by_label, not labels
    assert agent_kind_for(issue(3, state="In Review"), agent=agent) == "reviewer"
    assert agent_kind_for(issue(4, state="todo", labels=["review"]), agent=agent) == "reviewer"
    assert agent_kind_for(issue(5, state="In Progress"), agent=agent) == "codex"


def test_rule_keys_are_normalized_and_conflicting_duplicates_refused() -> None:
    agent = settings(kind_by_state={" In Review ": "reviewer"}).agent
    assert agent.kind_by_state == {"in review": "reviewer"}
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping(
            {"agents": KINDS, "agent": {"kind_by_label": {"x": "claude", "X ": "reviewer"}}},
            base_dir=Path("/"),
            environ={},
        )
    assert "appears twice" in caught.value.problems()[0].reason


@pytest.mark.parametrize(
    ("agent", "key_path"),
    [
        ({"kind_by_label": {"needs-claude": "claud"}}, "agent.kind_by_label.needs-claude"),
        ({"kind_by_state": {"todo": "nobody"}}, "agent.kind_by_state.todo"),
        ({"concurrency": {"gemini": 1}}, "agent.concurrency.gemini"),
        ({"kind": "gemini"}, "agent.kind"),
    ],
)
def test_an_unknown_kind_anywhere_is_a_coded_error_at_load(
    agent: dict[str, Any], key_path: str
) -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping({"agents": KINDS, "agent": agent}, base_dir=Path("/"), environ={})
    (problem,) = caught.value.problems()
    assert problem.code == "unknown_agent_kind"
    assert problem.key_path == key_path
    assert "claude, codex, reviewer" in problem.reason


def test_an_unknown_kind_fails_loading_the_file(tmp_path: Path) -> None:
    path = tmp_path / "WORKFLOW.md"
    path.write_text("---\nagent:\n  concurrency:\n    claude: 1\n---\nDo it.\n")
    with pytest.raises(InvalidWorkflowConfig) as caught:
        load_workflow(path, environ={})
    assert [p.code for p in caught.value.problems()] == ["unknown_agent_kind"]


def test_a_negative_kind_cap_is_refused() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping(
            {"agents": KINDS, "agent": {"concurrency": {"claude": -1}}},
            base_dir=Path("/"),
            environ={},
        )
    assert caught.value.problems()[0].key_path == "agent.concurrency.claude"


# -- the caps -------------------------------------------------------------------------------


def test_kind_limits_fall_back_to_the_default() -> None:
    agent = settings(concurrency={"claude": 2, "reviewer": 0}, default_concurrency=3).agent
    assert kind_limit("claude", agent=agent) == 2
    assert kind_limit("reviewer", agent=agent) == 0
    assert kind_limit("codex", agent=agent) == 3


def test_cap_order_disabled_then_global_then_state_then_kind() -> None:
    agent = settings(
        max_concurrent_agents=4,
        max_concurrent_agents_by_state={"todo": 2},
        concurrency={"claude": 1, "reviewer": 0},
    ).agent

    def shortage(kind: str, occupied: int, in_state: int, of_kind: int) -> Any:
        return capacity_shortage(
            "todo", occupied=occupied, occupied_in_state=in_state, agent=agent, kind=kind,
            occupied_of_kind=of_kind,
        )

    assert shortage("reviewer", 0, 0, 0) is CapacityShortage.KIND_DISABLED
    assert shortage("reviewer", 4, 2, 0) is CapacityShortage.KIND_DISABLED
    assert shortage("claude", 4, 2, 1) is CapacityShortage.GLOBAL
    assert shortage("claude", 3, 2, 1) is CapacityShortage.STATE
    assert shortage("claude", 1, 1, 1) is CapacityShortage.KIND
    assert shortage("claude", 1, 1, 0) is None
    assert shortage("codex", 3, 1, 3) is None  # no cap for codex


def key(n: int) -> SlotKey:
    return SlotKey(f"i{n}#0")


async def test_the_orchestrator_honours_the_kind_cap_and_records_the_kind() -> None:
    orchestrator, _, _ = make(
        config=settings(
            max_concurrent_agents=10,
            kind_by_label={"claude": "claude"},
            concurrency={"claude": 1},
        )
    )
    c1, c2, c3 = await orchestrator.eligible_issues(
        [issue(1, labels=["claude"], priority=1), issue(2, labels=["claude"], priority=2),
         issue(3, priority=3)]
    )
    first = await orchestrator.claim(c1)
    assert isinstance(first, Started)
    assert first.entry.agent_kind == "claude"
    assert await orchestrator.claim(c2) == Skipped(SkipReason.KIND_CAPACITY)
    third = await orchestrator.claim(c3)
    assert isinstance(third, Started)
    assert third.entry.agent_kind == "codex"
    rows = {row.slot_key: row.to_dict() for row in orchestrator.snapshot().running}
    assert rows[key(1)]["agent_kind"] == "claude"
    assert rows[key(3)]["agent_kind"] == "codex"
    # The claude slot frees up: the waiting claude issue may start.
    await orchestrator.finish(key(1), normal=True)
    [again] = [c for c in await orchestrator.eligible_issues(
        [issue(1, labels=["claude"]), issue(2, labels=["claude"])]
    ) if c.issue.id == "i2"]
    assert isinstance(await orchestrator.claim(again), Started)


async def test_a_disabled_kind_waits_while_other_kinds_run() -> None:
    orchestrator, _, _ = make(
        config=settings(kind_by_state={"todo": "reviewer"}, concurrency={"reviewer": 0})
    )
    todo, doing = await orchestrator.eligible_issues(
        [issue(1, state="Todo", priority=1), issue(2, state="In Progress", priority=2)]
    )
    assert await orchestrator.claim(todo) == Skipped(SkipReason.KIND_DISABLED)
    assert isinstance(await orchestrator.claim(doing), Started)


async def test_a_running_slot_keeps_its_kind_when_its_labels_change() -> None:
    orchestrator, _, _ = make(
        config=settings(kind_by_label={"claude": "claude"}, concurrency={"claude": 1})
    )
    c1, c2 = await orchestrator.eligible_issues(
        [issue(1, labels=["claude"], priority=1), issue(2, labels=["claude"], priority=2)]
    )
    assert isinstance(await orchestrator.claim(c1), Started)
    # The label goes away mid-run: the run is still a claude run and still counts.
    await orchestrator.refresh_running_issue(issue(1, priority=1))
    assert await orchestrator.claim(c2) == Skipped(SkipReason.KIND_CAPACITY)


# -- hosts ----------------------------------------------------------------------------------


def test_least_loaded_host_first_ties_by_order_and_caps() -> None:
    hosts = ["a", "b", "c"]
    assert select_worker_host(hosts, load={}, per_host_cap=None) == "a"
    assert select_worker_host(hosts, load={"a": 2, "b": 1, "c": 1}, per_host_cap=None) == "b"
    assert select_worker_host(hosts, load={"a": 1, "b": 1, "c": 1}, per_host_cap=1) is None
    assert select_worker_host(hosts, load={"a": 1}, per_host_cap=2, preferred="a") == "a"


def test_a_retry_prefers_its_host_unless_the_host_was_unreachable() -> None:
    assert retry_host("a", error_code="agent_exited") == "a"
    assert retry_host("a", error_code=None) == "a"
    assert retry_host("a", error_code="worker_host_unreachable") is None
    assert retry_host(None, error_code=None) is None


async def test_a_retry_after_an_unreachable_host_goes_to_the_least_loaded_host() -> None:
    orchestrator, _, clock = make(
        config=WorkflowSettings.model_validate({"worker": {"ssh_hosts": ["a", "b"]}})
    )
    c1, c2 = await orchestrator.eligible_issues([issue(1, priority=1), issue(2, priority=2)])
    assert (await orchestrator.claim(c1)).entry.host == "a"  # type: ignore[union-attr]
    assert (await orchestrator.claim(c2)).entry.host == "b"  # type: ignore[union-attr]
    await orchestrator.finish(key(1), normal=True)
    await orchestrator.finish(
        key(2),
        normal=False,
        error="worker_host_unreachable: the worker host could not be …",
        failure_code="worker_host_unreachable",
    )
    clock.advance(20_000)
    candidates = await orchestrator.eligible_issues([issue(2)])
    started = await orchestrator.claim(candidates[0])
    assert isinstance(started, Started)
    assert started.entry.host == "a"


async def test_a_retry_keeps_its_host_when_only_the_text_names_an_unreachable_host() -> None:
    """The decision reads the failure's code: a message that merely starts like the
    unreachable-host code (an agent's own output, say) leaves the retry on its host."""
    orchestrator, _, clock = make(
        config=WorkflowSettings.model_validate({"worker": {"ssh_hosts": ["a", "b"]}})
    )
    c1, c2 = await orchestrator.eligible_issues([issue(1, priority=1), issue(2, priority=2)])
    assert (await orchestrator.claim(c1)).entry.host == "a"  # type: ignore[union-attr]
    assert (await orchestrator.claim(c2)).entry.host == "b"  # type: ignore[union-attr]
    await orchestrator.finish(key(1), normal=True)
    await orchestrator.finish(
        key(2),
        normal=False,
        error="worker_host_unreachable: printed by the agent",
        failure_code="agent_exited",
    )
    clock.advance(20_000)
    candidates = await orchestrator.eligible_issues([issue(2)])
    started = await orchestrator.claim(candidates[0])
    assert isinstance(started, Started)
    assert started.entry.host == "b"
