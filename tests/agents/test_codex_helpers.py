"""The codex runner's pure decisions: approvals, permissions, token totals, summaries."""

from __future__ import annotations

from lorenz.agents.codex import (
    codex_tool_specs,
    decision_for,
    default_turn_sandbox_policy,
    permissions_answer,
    summarize,
    token_usage_from,
)
from lorenz.config import ApprovalMode
from lorenz.model import TokenUsage
from tests.agents.conftest import StaticTools


def test_deny_declines_without_a_list_of_choices() -> None:
    assert decision_for(ApprovalMode.DENY, {}) == {"decision": "decline"}


def test_allow_accepts_for_the_session_without_a_list_of_choices() -> None:
    assert decision_for(ApprovalMode.ALLOW, {}) == {"decision": "acceptForSession"}


def test_offered_decisions_are_preferred() -> None:
    offered = {"availableDecisions": ["accept", "cancel"]}
    assert decision_for(ApprovalMode.ALLOW, offered) == {"decision": "accept"}
    assert decision_for(ApprovalMode.DENY, offered) == {"decision": "cancel"}


def test_deny_still_declines_when_no_refusal_is_offered() -> None:
    offered = {"availableDecisions": ["accept", "acceptForSession"]}
    assert decision_for(ApprovalMode.DENY, offered) == {"decision": "decline"}


def test_allow_takes_an_offered_execpolicy_amendment_when_nothing_simpler_is_offered() -> None:
    amendment = {"acceptWithExecpolicyAmendment": {"execpolicy_amendment": ["npm", "test"]}}
    offered = {"availableDecisions": [amendment, "decline"]}
    assert decision_for(ApprovalMode.ALLOW, offered) == {"decision": amendment}


def test_permissions_are_granted_whole_or_not_at_all() -> None:
    asked = {"permissions": {"network": {"enabled": True}, "fileSystem": {"write": ["/tmp/x"]}}}
    assert permissions_answer(ApprovalMode.ALLOW, asked) == {
        "permissions": {"network": {"enabled": True}, "fileSystem": {"write": ["/tmp/x"]}},
        "scope": "session",
    }
    assert permissions_answer(ApprovalMode.DENY, asked) == {"permissions": {}, "scope": "turn"}


def test_token_usage_is_the_thread_total_not_the_last_increment() -> None:
    params = {
        "tokenUsage": {
            "total": {"inputTokens": 300, "outputTokens": 50, "totalTokens": 350},
            "last": {"inputTokens": 100, "outputTokens": 10, "totalTokens": 110},
        }
    }
    assert token_usage_from(params) == TokenUsage(300, 50, 350)


def test_token_usage_accepts_other_spellings() -> None:
    params = {"tokenUsage": {"total": {"prompt_tokens": "12", "completion_tokens": 8}}}
    assert token_usage_from(params) == TokenUsage(12, 8, 20)


def test_token_usage_without_a_total_is_ignored() -> None:
    assert token_usage_from({"tokenUsage": {"last": {"inputTokens": 5}}}) is None
    assert token_usage_from({"tokenUsage": {"total": {"inputTokens": -1}}}) is None
    assert token_usage_from({"tokenUsage": {"total": {"inputTokens": True}}}) is None
    assert token_usage_from({}) is None


def test_summaries_are_one_short_line() -> None:
    item = {"item": {"type": "commandExecution", "command": "pytest -q\n--lf"}}
    assert summarize("item/started", item) == "commandExecution started: pytest -q --lf"
    assert summarize("item/agentMessage/delta", {"delta": "x" * 2000}).startswith(
        "item/agentMessage/delta: xxx"
    )
    assert len(summarize("item/agentMessage/delta", {"delta": "x" * 2000})) == 500
    assert summarize("error", {"error": {"message": "boom"}}) == "error: boom"
    assert summarize("thread/status/changed", {"status": {"type": "idle"}}) == (
        "thread/status/changed"
    )


def test_tool_specs_get_the_codex_shape() -> None:
    specs = codex_tool_specs(StaticTools())
    assert [s["name"] for s in specs] == ["linear_graphql"]
    assert specs[0]["type"] == "function"
    assert specs[0]["inputSchema"]["type"] == "object"
    assert codex_tool_specs(None) == []


def test_the_default_sandbox_writes_only_the_workspace() -> None:
    assert default_turn_sandbox_policy("/w/ABC-1") == {
        "type": "workspaceWrite",
        "writableRoots": ["/w/ABC-1"],
    }
