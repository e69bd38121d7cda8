"""Spend reporting and stopping, per protocol, against the scripted agents that keep spending.

Each test plays the runtime's part: it watches the usage updates a run reports, and once they
cross a cap it asks the run to stop (``TurnStop.request``) from inside ``on_update``, as the
run loop will. The agent must then be stopped the protocol's way (Codex ``turn/interrupt``, ACP
``session/cancel``, Claude Code and ``command``: the process group), the run must fail with
``budget_exhausted``, and every agent process must be gone.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lorenz.agents.acp import AcpRunner
from lorenz.agents.base import (
    BUDGET_EXHAUSTED,
    MODEL_EVENT,
    AgentRunError,
    AgentRunRequest,
    TurnStop,
)
from lorenz.agents.claude import ClaudeStreamRunner
from lorenz.agents.codex import CodexAppServerRunner
from lorenz.agents.command import CommandRunner
from lorenz.agents.usage_file import MAX_LINE_BYTES, UsageFileReader
from lorenz.config import AgentProtocol
from lorenz.model import AgentUpdate
from tests.agents.conftest import FAKES, FakeCodexFactory, RunKit, assert_gone, python_command

# NB: a spending agent reports every INTERVAL_S; a cap crossed at one update is acted on well
# within the next one on any machine, so "at most one update too many" is a real bound here.
INTERVAL_S = 0.5
CAP_UPDATES = 3


@dataclasses.dataclass
class Meter:
    """The runtime's part: count usage as it arrives and stop the run past a cap."""

    stop: TurnStop
    reached: Callable[[AgentUpdate], bool]
    updates: list[AgentUpdate] = dataclasses.field(default_factory=list)
    crossing: int | None = None
    """How many usage updates had arrived when the cap was crossed."""

    def __call__(self, update: AgentUpdate) -> None:
        self.updates.append(update)
        if self.crossing is None and self.reached(update):
            self.crossing = len(self.usage())
            self.stop.request(reason="max_tokens_per_run 3000 reached (3000 tokens)")

    def usage(self) -> list[AgentUpdate]:
        return [u for u in self.updates if u.usage is not None or u.cost_usd is not None]

    def of(self, event: str) -> list[AgentUpdate]:
        return [u for u in self.updates if u.event == event]


def metered(
    request: AgentRunRequest, reached: Callable[[AgentUpdate], bool]
) -> tuple[AgentRunRequest, Meter]:
    meter = Meter(stop=TurnStop(), reached=reached)
    return dataclasses.replace(request, on_update=meter, stop=meter.stop), meter


def tokens_at_least(limit: int) -> Callable[[AgentUpdate], bool]:
    return lambda u: u.usage is not None and u.usage.total_tokens >= limit


def jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def pids_of(meter: Meter) -> list[int]:
    return sorted({u.pid for u in meter.updates if u.pid is not None})


# -- TurnStop itself ------------------------------------------------------------------------


async def test_the_first_stop_request_wins() -> None:
    stop = TurnStop()
    assert not stop.requested
    stop.request(reason="day cap reached")
    stop.request(reason="later", code="something_else")
    assert stop.requested
    error = stop.error()
    assert error.code == BUDGET_EXHAUSTED
    assert error.message == "day cap reached"
    await stop.wait()  # set: returns at once


# -- Codex: turn/interrupt -----------------------------------------------------------------


async def test_codex_reports_its_model_and_is_interrupted_at_the_cap(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex(
        model="gpt-5.1-codex",
        turns=[
            {
                "steps": [
                    {
                        "spend": {
                            "input": 900,
                            "cached": 300,
                            "output": 100,
                            "interval_s": INTERVAL_S,
                        }
                    }
                ]
            }
        ],
    )
    request, meter = metered(kit.request(command=script.command), tokens_at_least(3000))

    with pytest.raises(AgentRunError) as caught:
        await CodexAppServerRunner(terminate_grace_s=1.0).run(request)

    assert caught.value.code == BUDGET_EXHAUSTED
    (model,) = meter.of(MODEL_EVENT)
    assert model.payload == {"model": "gpt-5.1-codex", "source": "thread/start"}
    assert meter.crossing == CAP_UPDATES
    usage = meter.usage()
    crossing = usage[CAP_UPDATES - 1]
    assert crossing.usage is not None
    assert crossing.usage.total_tokens == 3000
    assert crossing.payload == {"cached_input_tokens": 900}
    records = script.records()
    interrupts = [
        r["received"] for r in records if r.get("received", {}).get("method") == "turn/interrupt"
    ]
    assert [m["params"] for m in interrupts] == [{"threadId": "thr-1", "turnId": "turn-1"}]
    (stopped,) = [r["interrupted_after"] for r in records if "interrupted_after" in r]
    assert CAP_UPDATES <= stopped <= CAP_UPDATES + 1
    assert script.violations() == []
    assert len(meter.of("agent_started")) == 1
    assert_gone(pids_of(meter))


async def test_codex_without_a_stop_request_runs_as_before(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex(turns=[{"steps": [{"token_usage": {"input": 10, "output": 5}}]}])
    request, meter = metered(kit.request(command=script.command), lambda _: False)
    result = await CodexAppServerRunner().run(request)
    assert result.turns == 1
    assert meter.of(MODEL_EVENT) == []  # the server named no model
    assert meter.stop.requested is False


# -- ACP: session/cancel ---------------------------------------------------------------------


SWITCH_MODEL = {
    "sessionUpdate": "config_option_update",
    "configOptions": [
        {
            "type": "select",
            "id": "model",
            "name": "Model",
            "category": "model",
            "currentValue": "claude-opus-4-5",
            "options": [{"value": "claude-opus-4-5", "name": "Opus"}],
        }
    ],
}


def acp_command(tmp_path: Path, scenario: dict[str, Any]) -> str:
    path = tmp_path / "acp-scenario.json"
    path.write_text(json.dumps(scenario))
    return " ".join(
        shlex.quote(p) for p in (sys.executable, str(FAKES / "acp_agent.py"), str(path))
    )


async def test_acp_reports_its_model_and_is_cancelled_at_the_cap(
    kit: RunKit, tmp_path: Path
) -> None:
    command = acp_command(
        tmp_path,
        {
            "session": {"sessionId": "sess-1", "model": "claude-sonnet-4-5"},
            "turns": [
                {
                    "steps": [
                        {"update": SWITCH_MODEL},
                        {"spend": {"cost": 0.25, "interval_s": INTERVAL_S}},
                    ]
                }
            ],
        },
    )
    request, meter = metered(
        kit.request(command=command, protocol=AgentProtocol.ACP),
        lambda u: u.cost_usd is not None and u.cost_usd >= 0.75,
    )

    with pytest.raises(AgentRunError) as caught:
        await AcpRunner(terminate_grace_s=1.0).run(request)

    assert caught.value.code == BUDGET_EXHAUSTED
    assert [u.payload for u in meter.of(MODEL_EVENT)] == [
        {"model": "claude-sonnet-4-5", "source": "configOptions"},
        {"model": "claude-opus-4-5", "source": "configOptions"},  # switched mid-session
    ]
    assert meter.crossing == CAP_UPDATES
    received = jsonl(kit.workspace / "acp_received.jsonl")
    cancels = [m for m in received if m.get("method") == "session/cancel"]
    assert [m["params"] for m in cancels] == [{"sessionId": "sess-1"}]
    spent = jsonl(kit.workspace / "acp_spend.jsonl")
    (stopped,) = [r["cancelled_after"] for r in spent if "cancelled_after" in r]
    assert CAP_UPDATES <= stopped <= CAP_UPDATES + 1
    assert_gone(pids_of(meter))


# -- Claude Code: the process group ----------------------------------------------------------


async def test_claude_reports_its_model_and_is_killed_at_the_cap(
    kit: RunKit, tmp_path: Path
) -> None:
    scenario = tmp_path / "claude-scenario.json"
    scenario.write_text(
        json.dumps(
            {
                "session_id": "11111111-2222-4333-8444-555555555555",
                "invocations": [
                    {
                        "events": [
                            {
                                "type": "system",
                                "subtype": "init",
                                "model": "claude-opus-4-5",
                                "tools": [],
                            },
                            {"_spawn_child": True},
                            {"_spend": {"input": 900, "output": 100, "interval_s": INTERVAL_S}},
                        ]
                    }
                ],
            }
        )
    )
    command = (
        python_command(FAKES / "claude_agent.py", str(scenario)) + " -p --verbose "
        "--output-format stream-json"
    )
    request, meter = metered(
        kit.request(command=command, protocol=AgentProtocol.CLAUDE_STREAM_JSON),
        tokens_at_least(3000),
    )

    with pytest.raises(AgentRunError) as caught:
        await ClaudeStreamRunner(terminate_grace_s=1.0).run(request)

    assert caught.value.code == BUDGET_EXHAUSTED
    (model,) = meter.of(MODEL_EVENT)
    assert model.payload == {"model": "claude-opus-4-5", "source": "system/init"}
    assert meter.crossing == CAP_UPDATES
    written = jsonl(kit.workspace / "claude_spend.jsonl")
    assert CAP_UPDATES <= len(written) <= CAP_UPDATES + 1
    child = int((kit.workspace / "claude_child.pid").read_text())
    assert_gone([*pids_of(meter), child])


# -- command: LORENZ_USAGE_FILE and the process group ----------------------------------------

SPENDING_COMMAND = """\
import json, os, subprocess, time
child = subprocess.Popen(['sleep', '300'])
print(child.pid, flush=True)
path = os.environ['LORENZ_USAGE_FILE']
with open(path, 'a') as usage:
    usage.write(json.dumps({'model': 'gpt-5-mini'}) + '\\n')
    usage.flush()
    n = 0
    while True:
        n += 1
        line = json.dumps({'input_tokens': 900 * n, 'cached_input_tokens': 100 * n,
                           'output_tokens': 100 * n, 'cost_usd': 0.01 * n})
        # a line written in two pieces is read whole
        usage.write(line[:10]); usage.flush(); time.sleep(0.01)
        usage.write(line[10:] + '\\n'); usage.flush()
        with open('written.txt', 'w') as out:
            out.write(str(n))
        time.sleep(%s)
"""


async def test_a_command_reports_usage_through_its_usage_file_and_is_killed_at_the_cap(
    kit: RunKit, tmp_path: Path
) -> None:
    script = tmp_path / "spender.py"
    script.write_text(SPENDING_COMMAND % INTERVAL_S)
    request, meter = metered(
        kit.request(command=python_command(script), protocol=AgentProtocol.COMMAND),
        tokens_at_least(3000),
    )

    with pytest.raises(AgentRunError) as caught:
        await CommandRunner(terminate_grace_s=1.0).run(request)

    assert caught.value.code == BUDGET_EXHAUSTED
    (model,) = meter.of(MODEL_EVENT)
    assert model.payload == {"model": "gpt-5-mini", "source": "LORENZ_USAGE_FILE"}
    usage = meter.usage()
    assert meter.crossing == CAP_UPDATES
    third = usage[CAP_UPDATES - 1]
    assert third.usage is not None
    assert (third.usage.input_tokens, third.usage.output_tokens) == (2700, 300)
    assert third.cost_usd == pytest.approx(0.03)
    assert third.payload == {"cached_input_tokens": 300}
    written = int((kit.workspace / "written.txt").read_text())
    assert CAP_UPDATES <= written <= CAP_UPDATES + 1
    child = int(meter.of("output")[0].message or "0")
    assert_gone([*pids_of(meter), child])


async def test_a_command_that_reports_nothing_runs_as_before(kit: RunKit, tmp_path: Path) -> None:
    script = tmp_path / "quiet.py"
    script.write_text("print('done')\n")
    request, meter = metered(
        kit.request(command=python_command(script), protocol=AgentProtocol.COMMAND),
        tokens_at_least(1),
    )
    result = await CommandRunner().run(request)
    assert result.turns == 1
    assert meter.usage() == []
    assert not meter.stop.requested


# -- the usage file reader, alone ------------------------------------------------------------


def test_the_usage_file_reader_is_bounded_and_skips_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    path.write_bytes(b"")
    seen: list[AgentUpdate] = []
    reader = UsageFileReader(path, emit=seen.append)
    reader.poll()
    assert seen == []
    with path.open("ab") as handle:
        handle.write(b"not json\n[1, 2]\n")
        handle.write(b'{"input_tokens": -1}\n{"cost_usd": true}\n{"cost_usd": "NaN"}\n')
        handle.write(b"x" * (MAX_LINE_BYTES + 10))  # an overlong line, not yet ended
    reader.poll()
    with path.open("ab") as handle:
        handle.write(b"tail of the long line\n")
        handle.write(b'{"input_tokens": 5, "output_tokens": 2}\n{"output_tokens": 9')
    reader.poll()
    events = [u.event for u in seen]
    assert events.count("malformed") == 6
    (usage,) = [u for u in seen if u.event == "token_usage"]
    assert usage.usage is not None
    assert (usage.usage.input_tokens, usage.usage.output_tokens, usage.usage.total_tokens) == (
        5,
        2,
        7,
    )
    assert usage.cost_usd is None
    with path.open("ab") as handle:
        handle.write(b"}\n")
    reader.poll()
    assert seen[-1].usage is not None
    assert seen[-1].usage.output_tokens == 9
    assert reader.updates == 2
