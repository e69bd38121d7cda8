"""An agent's start-up is not its answer time: a slow login shell must not be a read_timeout.

The agent command runs under ``bash -lc``; profiles, version managers and a loaded machine can
take seconds before the agent reads its first line. ``read_timeout_ms`` (5 s by default) once
covered that start-up too, and 8 of 200 runs under load failed with ``read_timeout`` for agents
that answered at once when up. Start-up is now bounded by ``startup_timeout_ms`` (until the
agent has read the request from its stdin), and ``read_timeout_ms`` counts from there.

The scripts below sleep before ``exec``-ing the real fake agent, as a slow profile would.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import psutil
import pytest

from lorenz.agents.acp import AcpRunner
from lorenz.agents.base import AgentRunError
from lorenz.agents.codex import CodexAppServerRunner
from tests.agents.conftest import FakeCodexFactory, RunKit, assert_gone
from tests.agents.test_acp import Harness

FAST = CodexAppServerRunner(overload_initial_delay_s=0.01, overload_max_delay_s=0.05)

READ_TIMEOUT_MS = 300
SLOW_START_S = 1.5
"""Five times the read timeout: the old rule failed every one of these runs."""


_never = itertools.count(1)


def slow_start(command: str, *, seconds: float | str) -> str:
    return f"sleep {seconds}; exec {command}"


def never_start(command: str) -> tuple[str, str]:
    """A command that sleeps for ever before the agent, and the ``sleep`` argument to find it."""
    seconds = f"600.{next(_never):04d}{psutil.Process().pid}"
    return slow_start(command, seconds=seconds), seconds


def assert_no_sleeper(seconds: str) -> None:
    """The start-up's process group was killed: no ``sleep <seconds>`` is left running."""
    left = [
        proc.pid
        for proc in psutil.process_iter(["cmdline", "status"])
        if proc.info["cmdline"] == ["sleep", seconds]
        and proc.info["status"] != psutil.STATUS_ZOMBIE
    ]
    assert left == []


async def test_a_codex_agent_that_starts_slowly_is_not_a_read_timeout(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("normal")
    request = kit.request(
        command=slow_start(script.command, seconds=SLOW_START_S), read_timeout_ms=READ_TIMEOUT_MS
    )
    result = await FAST.run(request)
    assert result.turns == 1
    assert [m["method"] for m in script.received() if "method" in m][:1] == ["initialize"]


async def test_a_codex_agent_that_never_starts_is_a_startup_timeout(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("normal")
    command, seconds = never_start(script.command)
    request = kit.request(
        command=command, read_timeout_ms=READ_TIMEOUT_MS, startup_timeout_ms=1000
    )
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(request)
    assert caught.value.code == "startup_timeout"
    assert "startup_timeout_ms" in caught.value.message
    assert_gone([u.pid for u in kit.recorder.of("agent_started") if u.pid is not None])
    assert_no_sleeper(seconds)


async def test_a_codex_agent_that_reads_and_never_answers_is_still_a_read_timeout(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    # Up at once, then silent: start-up ended when it read initialize; read_timeout_ms applies.
    script = fake_codex("normal", initialize={"no_response": True})
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command, read_timeout_ms=READ_TIMEOUT_MS))
    assert caught.value.code == "read_timeout"


async def test_an_acp_agent_that_starts_slowly_is_not_a_read_timeout(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_normal.json")
    request = harness.request(
        command=slow_start(harness.command, seconds=SLOW_START_S),
        read_timeout_ms=READ_TIMEOUT_MS,
    )
    result = await AcpRunner().run(request)
    assert result.session_id == "sess-normal"


async def test_an_acp_agent_that_never_starts_is_a_startup_timeout(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_normal.json")
    command, seconds = never_start(harness.command)
    request = harness.request(command=command, read_timeout_ms=READ_TIMEOUT_MS)
    request = dataclasses.replace(
        request, settings=dataclasses.replace(request.settings, startup_timeout_ms=1000)
    )
    with pytest.raises(AgentRunError) as caught:
        await AcpRunner(terminate_grace_s=0.2).run(request)
    assert caught.value.code == "startup_timeout"
    assert_no_sleeper(seconds)
