"""The ``command`` runner: any program that reads a prompt and exits is an agent.

This is the smallest useful contract, for scripts, wrappers around other CLIs, and the bundled
demo: the rendered prompt goes to the command's stdin (which is then closed) and into a file
named by ``LORENZ_PROMPT_FILE``; every stdout line is a progress event (it keeps the run from
looking stalled); exit status 0 is success, anything else a failure with the stderr tail. Token
usage and cost, for budgets, go as JSON lines into the file named by ``LORENZ_USAGE_FILE`` (see
:mod:`lorenz.agents.usage_file`).

A command run is one turn: ``agent.max_turns`` does not apply (a command that wants to loop does
so itself; continuation across runs comes from the orchestrator's 1 s continuation retry).
``turn_timeout_ms`` bounds the whole run.

The prompt file is a private (0600) temporary file *outside* the workspace, so it can never be
committed by accident, and is removed when the run ends; in a worker it lives in the worker's
state directory (``AgentRunRequest.scratch_dir``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import uuid
from pathlib import Path

from lorenz.agents.base import AgentRunError, AgentRunRequest, AgentRunResult, until_stopped
from lorenz.agents.processes import AgentProcess, AgentStdinClosed, LineTooLong, spawn_agent
from lorenz.agents.usage_file import POLL_INTERVAL_S, USAGE_FILE_ENV, UsageFileReader
from lorenz.codes import ErrorCode
from lorenz.model import AgentUpdate

logger = logging.getLogger(__name__)

PROMPT_FILE_ENV = "LORENZ_PROMPT_FILE"
OUTPUT_MESSAGE_CHARS = 500
EXIT_DRAIN_S = 1.0
"""After the command exits, how long output still held open by its children is read."""


class CommandRunner:
    """:class:`~lorenz.agents.base.AgentRunner` for ``protocol: command``."""

    def __init__(self, *, terminate_grace_s: float = 2.0) -> None:
        self.terminate_grace_s = terminate_grace_s

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        # NB: one private file (mkstemp: 0600, a name nobody can guess), not a directory per
        # run: making and removing a directory costs the event loop's thread about four times
        # as much as one file (rmdir is slow on overlay file systems).
        # NB: in the worker's state directory when there is one: a worker killed mid-run (a
        # recovery sweep, kill -9) cannot remove it, and a file in /tmp would be left there.
        fd, prompt_name = tempfile.mkstemp(
            prefix="lorenz-prompt-", suffix=".md", dir=request.scratch_dir
        )
        usage_fd, usage_name = tempfile.mkstemp(
            prefix="lorenz-usage-", suffix=".jsonl", dir=request.scratch_dir
        )
        os.close(usage_fd)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(request.prompt)
            env = {**request.env, PROMPT_FILE_ENV: prompt_name, USAGE_FILE_ENV: usage_name}
            process = await spawn_agent(
                command=request.settings.command,
                cwd=request.workspace,
                env=env,
                login_shell=request.settings.login_shell,
            )
            usage = UsageFileReader(Path(usage_name), emit=lambda u: _emit(request, u))
            try:
                return await self._drive(request, process, usage)
            finally:
                await process.terminate(grace_s=self.terminate_grace_s)
                usage.poll()  # NB: what the agent wrote just before it ended still counts
        finally:
            for name in (prompt_name, usage_name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)

    async def _drive(
        self, request: AgentRunRequest, process: AgentProcess, usage: UsageFileReader
    ) -> AgentRunResult:
        session_id = f"command-{uuid.uuid4().hex[:12]}"
        _emit(
            request,
            AgentUpdate(
                event="session_started",
                session_id=session_id,
                pid=process.pid,
                message=f"command started (pid {process.pid})",
            ),
        )
        feeder = asyncio.create_task(_feed_prompt(process, request.prompt))
        tailer = asyncio.create_task(_tail_usage(usage))
        timeout_ms = request.settings.turn_timeout_ms
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                returncode = await until_stopped(
                    self._pump_and_wait(request, process),
                    stop=request.stop,
                    # NB: no in-band way to stop a command: its process group goes at once.
                    on_stop=lambda: process.terminate(grace_s=0.0),
                    grace_s=self.terminate_grace_s + 1.0,
                )
        except TimeoutError:
            raise AgentRunError(
                f"the command did not finish within {timeout_ms} ms "
                "(agents.<kind>.turn_timeout_ms)",
                code=ErrorCode.TURN_TIMEOUT,
            ) from None
        finally:
            for task in (feeder, tailer):
                task.cancel()
                # NB: how a cancelled task ended (cancelled or failing) is not ours to report.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        usage.poll()
        if returncode != 0:
            await process.stderr_drained(timeout_s=1.0)
            tail = process.stderr_tail(max_bytes=1000) or "no stderr output"
            hint = " (command not found: check agents.<kind>.command)" if returncode == 127 else ""
            raise AgentRunError(
                f"agent exited with status {returncode}{hint}: {tail}", code=ErrorCode.AGENT_EXITED
            )
        _emit(request, AgentUpdate(event="turn_completed", message="command exited with 0"))
        return AgentRunResult(turns=1, session_id=session_id, stop_reason="exited")

    async def _pump_and_wait(self, request: AgentRunRequest, process: AgentProcess) -> int:
        await self._pump_output(request, process)
        return await process.wait()

    async def _pump_output(self, request: AgentRunRequest, process: AgentProcess) -> None:
        """Turn stdout lines into updates until stdout ends (or shortly after the exit)."""
        exited = asyncio.create_task(process.wait())
        try:
            while True:
                if exited.done():
                    # NB: a background child may keep stdout open forever; once the command
                    # itself is gone, only what is already buffered or arrives soon counts.
                    try:
                        line = await process.read_line(timeout_s=EXIT_DRAIN_S)
                    except TimeoutError:
                        return
                else:
                    reader = asyncio.ensure_future(process.read_line())
                    done, _ = await asyncio.wait(
                        {reader, exited}, return_when=asyncio.FIRST_COMPLETED
                    )
                    if reader not in done:
                        reader.cancel()
                        with contextlib.suppress(asyncio.CancelledError, LineTooLong):
                            await reader
                        continue
                    try:
                        line = reader.result()
                    except LineTooLong as exc:
                        _emit(request, AgentUpdate(event="output", message=exc.message[:200]))
                        continue
                if line is None:
                    return
                text = line.decode("utf-8", errors="replace").rstrip("\r")
                _emit(request, AgentUpdate(event="output", message=text[:OUTPUT_MESSAGE_CHARS]))
        finally:
            if not exited.done():
                exited.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await exited


async def _feed_prompt(process: AgentProcess, prompt: str) -> None:
    # NB: written from its own task: a command that prints a lot before reading stdin must not
    # deadlock against a prompt larger than the pipe buffer.
    try:
        data = prompt.encode("utf-8")
        if data:
            stdin = data[:-1] if data.endswith(b"\n") else data
            await process.write_line(stdin)
    except AgentStdinClosed:
        logger.debug("command did not read its prompt from stdin", extra={"pid": process.pid})
    finally:
        # NB: the command exited or closed stdin itself: nothing to close.
        with contextlib.suppress(Exception):
            await process.close_stdin()


_IDLE_POLL_INTERVAL_S = 0.5
"""The slowest the usage file is read while nothing is appended to it."""


async def _tail_usage(usage: UsageFileReader) -> None:
    # NB: every POLL_INTERVAL_S while the agent reports, backing off (doubling) to
    # _IDLE_POLL_INTERVAL_S while it does not: most agents report rarely or never, and a poll
    # every 50 ms for a whole run was most of an idle worker's wake-ups. The latency of a
    # report after a quiet spell is at most half a second; the final poll reads the rest.
    interval = POLL_INTERVAL_S
    while True:
        before = usage.offset
        usage.poll()
        if usage.offset != before:
            interval = POLL_INTERVAL_S
        else:
            interval = min(interval * 2, _IDLE_POLL_INTERVAL_S)
        await asyncio.sleep(interval)


def _emit(request: AgentRunRequest, update: AgentUpdate) -> None:
    try:
        request.on_update(update)
    except Exception:
        logger.exception("on_update raised; update dropped", extra={"event": update.event})


__all__ = ["PROMPT_FILE_ENV", "USAGE_FILE_ENV", "CommandRunner"]
