"""What a run spec refuses, said before a run starts, and what it never holds (a secret).

An issue whose fields cannot go into a spec (a NUL byte, a field over :class:`IssueSpec`'s
limits) must be found by :func:`unpassable_fields` — the check the runtime makes before it
dispatches — rather than by the spec's validation inside a run, where it showed up as a raw
pydantic error and an "agent exited" failure retried until the budget ran out.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from lorenz.agents.environment import agent_environment
from lorenz.config import AgentKindSettings
from lorenz.model import Issue
from lorenz.workers.handles import LocalTransport, launch
from lorenz.workers.spec import IssueSpec, SpecInvalid, encode_spec, unpassable_fields
from tests.workers.conftest import SECRET, Collected, SpecFactory, base_env


def issue(**fields: str) -> Issue:
    values = {"id": "id-1", "identifier": "ABC-1", "title": "Fix it", "state": "Todo"}
    values.update(fields)
    return Issue(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("identifier", "A" * 501),
        ("identifier", "A" * 201),
        ("id", "i" * 501),
        ("title", "t" * 2001),
        ("state", "s" * 201),
        ("identifier", "ABC\x00-1"),
        ("title", "bad\x00title"),
    ],
)
def test_an_issue_the_spec_refuses_is_named_before_any_run(field: str, value: str) -> None:
    bad = issue(**{field: value})
    problems = unpassable_fields(bad)
    assert list(problems) == [field]
    assert problems[field]
    if "\x00" not in value:
        # The spec does refuse it: the check and the spec's limits are the same. (A NUL byte
        # fits a spec; it is the process environment that cannot take it.)
        with pytest.raises(SpecInvalid, match=f"issue.{field}"):
            IssueSpec.from_issue(bad)


def test_an_issue_at_the_limits_passes_and_makes_a_spec() -> None:
    fine = issue(identifier="A" * 200, id="i" * 500, title="t" * 2000, state="s" * 200)
    assert unpassable_fields(fine) == {}
    assert IssueSpec.from_issue(fine).identifier == "A" * 200


def test_the_reason_says_how_long_the_field_is_and_the_limit() -> None:
    problems = unpassable_fields(issue(identifier="A" * 600))
    assert "600" in problems["identifier"]
    assert "200" in problems["identifier"]


async def test_spec_json_on_disk_never_holds_the_tracker_key(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec()
    # The agent kind as configured: its env names the tracker key (resolved from $VAR) and a
    # harmless variable; the controller strips the run's env exactly as the runtime does.
    configured = dataclasses.replace(
        spec.agent, env={"LINEAR_API_KEY": SECRET, "MY_TOKEN_ALIAS": SECRET, "KEEP_ME": "1"}
    )
    env = agent_environment(base=base_env(), extra=configured.env, secret_values=[SECRET])
    assert SECRET not in env.values()
    spec = dataclasses.replace(spec, agent=configured, env=env)
    transport = LocalTransport(state_root=state_root, env=base_env())
    handle, _ = await launch(spec, transport=transport)
    final = await handle.follow(Collected())
    assert final.data["outcome"] == "success"

    state_dir = state_root / spec.handle
    raw = (state_dir / "spec.json").read_bytes()
    assert SECRET.encode() not in raw
    for path in state_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    written = json.loads(raw)
    assert written["agent"]["env"] == {"KEEP_ME": "1"}


def test_a_spec_built_from_settings_objects_drops_stripped_agent_env(
    make_spec: SpecFactory,
) -> None:
    spec, _ = make_spec()
    agent = AgentKindSettings(
        command=spec.agent.command, protocol=spec.agent.protocol, env={"LINEAR_API_KEY": SECRET}
    )
    rebuilt = dataclasses.replace(spec, agent=agent.launch())
    assert rebuilt.agent.env == {}
    assert SECRET.encode() not in encode_spec(rebuilt)


@pytest.mark.parametrize("field", ["identifier", "id", "title"])
async def test_a_worker_runner_refuses_such_an_issue_with_a_code_not_a_raw_error(
    state_root: Path, tmp_path: Path, field: str
) -> None:
    from lorenz.agents import AgentRunError
    from lorenz.workers.runner import WorkerRunner
    from tests.workers.test_runner import Kit

    kit = Kit(tmp_path, [{"message": "never"}])
    request = kit.request(issue=issue(**{field: "X" * 2501}))
    runner = WorkerRunner(
        workflow=str(tmp_path / "WORKFLOW.md"),
        transport=LocalTransport(state_root=state_root, env=base_env()),
    )
    with pytest.raises(AgentRunError) as caught:
        await runner.run(request)
    assert caught.value.code == "issue_field_invalid"
    assert field in caught.value.message
    assert kit.starts() == 0
    assert os.listdir(state_root) == [], "no worker was started"
