"""The run spec read from JSON and written back without pydantic (issue #35).

What the worker reads must be refused exactly as strictly as the pydantic model did: a JSON
type that does not fit (a bool is not an integer), a value past a field's limit, an unknown
key, a version it does not know — each with the path of the field, which
``worker_spec_invalid``'s message names.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from lorenz.codes import ErrorCode
from lorenz.config import AgentLaunch, AgentProtocol, ApprovalMode
from lorenz.workers.spec import (
    SPEC_VERSION,
    HookSpec,
    IssueSpec,
    RunSpec,
    SpecInvalid,
    decode_spec,
    encode_spec,
)
from lorenz.workers.states import SPEC_NAME, WorkerStateError
from lorenz.workers.worker import load_spec


def full_spec() -> RunSpec:
    """A spec with every field away from its default."""
    return RunSpec(
        workflow="/srv/team/WORKFLOW.md",
        issue=IssueSpec(id="id-1", identifier="ABC-1", title="Fix it", state="Todo",
                        url="https://example.test/ABC-1"),
        slot_index=2,
        attempt=3,
        generation=4,
        run=5,
        prompt="Fix the bug. ✓",
        agent=AgentLaunch(
            command="codex app-server", login_shell=False, protocol=AgentProtocol.ACP,
            stall_timeout_ms=-1, turn_timeout_ms=7, read_timeout_ms=8, startup_timeout_ms=9,
            approvals=ApprovalMode.ASK, approval_policy={"granular": ["a"]},
            thread_sandbox="read-only", turn_sandbox_policy={"type": "readOnly"},
            env={"KEEP": "1"},
        ),
        max_turns=3,
        continuation_prompts=["again", "and again"],
        workspace="/srv/ws/ABC-1",
        create_workspace=True,
        hooks=HookSpec(after_create="make", before_run="true", after_run="false",
                       timeout_ms=10, env={"LORENZ_ISSUE": "ABC-1"}),
        env={"KEEP": "1", "PATH": "/bin"},
        inherit_env=True,
        host="builder@host",
        answer={"session_id": "s-1", "text": "yes"},
        tools=[{"name": "linear_graphql", "inputSchema": {"type": "object"}}],
        controller_wait_ms=11,
        linger_ms=0,
        journal_max_bytes=2**25,
    )


def document(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(encode_spec(full_spec()))
    data.update(changes)
    return data


def refused(data: dict[str, Any]) -> SpecInvalid:
    with pytest.raises(SpecInvalid) as caught:
        decode_spec(json.dumps(data))
    return caught.value


def test_a_full_spec_round_trips() -> None:
    spec = full_spec()
    raw = encode_spec(spec)
    assert decode_spec(raw) == spec
    assert json.loads(raw)["agent"]["protocol"] == "acp"  # enums as their values


def test_missing_fields_take_their_defaults() -> None:
    minimal = {
        "workflow": "/w", "issue": {"id": "i", "identifier": "A-1"}, "prompt": "p",
        "agent": {"command": "true"}, "max_turns": 1, "workspace": "/ws",
    }
    spec = decode_spec(json.dumps(minimal))
    assert spec.version == SPEC_VERSION
    assert spec.hooks == HookSpec()
    assert spec.agent == AgentLaunch(command="true")
    assert spec.attempt is None


@pytest.mark.parametrize(
    ("changes", "where", "said"),
    [
        ({"surprise": 1}, "surprise", "unknown field"),
        ({"issue": {"id": "i", "identifier": "A", "extra": 1}}, "issue.extra", "unknown field"),
        ({"agent": {"command": "true", "model": "x"}}, "agent.model", "unknown field"),
        ({"slot_index": True}, "slot_index", "must be an integer"),
        ({"slot_index": "2"}, "slot_index", "must be an integer"),
        ({"slot_index": 1.5}, "slot_index", "must be an integer"),
        ({"prompt": 7}, "prompt", "must be a string"),
        ({"inherit_env": 1}, "inherit_env", "must be a boolean"),
        ({"env": {"A": 1}}, "env.A", "must be a string"),
        ({"env": ["A"]}, "env", "must be an object"),
        ({"continuation_prompts": "x"}, "continuation_prompts", "must be a list"),
        ({"continuation_prompts": ["a", 2]}, "continuation_prompts.1", "must be a string"),
        ({"hooks": None}, "hooks", "must be an object"),
        ({"agent": {"command": "true", "protocol": "telnet"}}, "agent.protocol", "one of"),
        ({"attempt": False}, "attempt", "must be an integer"),
        ({"issue": {"identifier": "A"}}, "issue.id", "field required"),
        ({"issue": {"id": "", "identifier": "A"}}, "issue.id", "at least 1"),
        ({"issue": {"id": "i", "identifier": "A" * 201}}, "issue.identifier", "at most 200"),
        ({"max_turns": 0, "continuation_prompts": []}, "max_turns", "greater than 0"),
        ({"max_turns": 1001}, "max_turns", "less than or equal to 1000"),
        ({"attempt": -1}, "attempt", "greater than or equal to 0"),
        ({"journal_max_bytes": 1}, "journal_max_bytes", "greater than or equal to"),
        ({"agent": {"command": "true", "turn_timeout_ms": 0}}, "agent.turn_timeout_ms",
         "greater than 0"),
        ({"agent": {"command": "  "}}, "agent.command", "must not be blank"),
        ({"workspace": "relative/ws"}, "workspace", "absolute path"),
        ({"continuation_prompts": ["only one"]}, "continuation_prompts", "one prompt for each"),
        ({"version": SPEC_VERSION + 1}, "version", "is not the version"),
    ],
)
def test_the_reader_refuses_with_the_fields_path(
    changes: dict[str, Any], where: str, said: str
) -> None:
    problem = refused(document(**changes))
    assert problem.where == where
    assert said in problem.message


def test_a_document_that_is_not_an_object_is_refused_at_its_root() -> None:
    with pytest.raises(SpecInvalid) as caught:
        decode_spec(b"[1, 2]")
    assert caught.value.where == "(root)"
    with pytest.raises(SpecInvalid):
        decode_spec(b"{not json")


def test_the_worker_names_the_field_of_a_bad_spec_file(tmp_path: Path) -> None:
    (tmp_path / SPEC_NAME).write_text(json.dumps(document(issue={"id": "", "identifier": "A"})))
    with pytest.raises(WorkerStateError) as caught:
        load_spec(tmp_path)
    assert caught.value.code == ErrorCode.WORKER_SPEC_INVALID
    assert f"the run spec {tmp_path / SPEC_NAME} is invalid at issue.id: " in caught.value.message


def test_a_spec_built_in_code_is_held_to_the_same_limits() -> None:
    """The controller must never write a spec its worker refuses."""
    spec = full_spec()
    with pytest.raises(SpecInvalid) as caught:
        dataclasses.replace(spec, prompt="p" * 1_000_001)
    assert caught.value.where == "prompt"
    with pytest.raises(SpecInvalid) as caught:
        IssueSpec(id="i", identifier="")
    assert caught.value.where == "identifier"
    with pytest.raises(SpecInvalid) as caught:
        HookSpec(timeout_ms=0)
    assert caught.value.where == "timeout_ms"
