"""The ``claude-stream-json`` runner: Claude Code (or a look-alike) in print mode, a process a turn.

``claude -p --output-format stream-json --verbose`` reads a prompt on stdin, works, prints one
JSON event per line (``system``/``init``, ``assistant``, ``user``, ``rate_limit_event``, …) and
ends with a ``result`` event, then exits. There is no request/response protocol to drive, so a
turn is an invocation: turn 1 runs the configured command with the rendered prompt, and each
continuation turn (while the issue stays active, up to ``agent.max_turns``) runs it again with
``--resume <session_id>`` in the *same* workspace — Claude only finds a session's transcript
from the directory it was created in (and under the same ``HOME``).

Decisions (also in ``docs/agents.md``):

* The command is used verbatim, plus ``--max-turns <agent.max_turns>`` unless it already has a
  ``--max-turns``, plus ``--resume <id>`` on continuation turns; both are appended at the end,
  so the command must end with the Claude invocation itself. ``-p``, ``--output-format
  stream-json`` and ``--verbose`` belong in the command.
* A ``result`` with subtype ``error_max_turns`` fails the run with ``max_turns_reached``; any
  other non-``success`` subtype, or ``is_error: true``, with ``turn_failed``. Output that ends
  without a ``result`` is ``agent_exited``.
* ``approvals`` does not apply: print mode never asks. Permissions are whatever the command
  sets (``--permission-mode``, ``--allowedTools``); the tools Claude was refused are reported
  from ``result.permission_denials``.
* A question: print mode cannot ask, so Claude Code's ``AskUserQuestion`` ends up in
  ``result.permission_denials`` (``tool_input.questions[{question, header, options[{label}]}]``).
  Such a turn ends the run with :class:`~lorenz.agents.base.AgentAsked` carrying the questions
  and the session id; the answer's run is ``--resume <session>`` with the rendered answer as
  its prompt (``docs/questions.md``).
* ``read_timeout_ms`` bounds how long a process may linger after its ``result``;
  ``turn_timeout_ms`` bounds each invocation.
* Tokens: input = ``input_tokens`` + ``cache_creation_input_tokens`` +
  ``cache_read_input_tokens`` (every prompt token the model read), output = ``output_tokens``,
  total = their sum. Each invocation's ``result`` is authoritative and invocations add up; while
  one runs, its top-level ``assistant`` messages (deduplicated by ``message.id`` — Claude repeats
  a message's usage on every content block) give running figures, which never go down. Cost is
  the sum of the invocations' ``total_cost_usd``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
from collections.abc import Mapping
from typing import Any

from lorenz.agents.base import (
    MODEL_EVENT,
    QUESTION_EVENT,
    AgentAsked,
    AgentRunError,
    AgentRunRequest,
    AgentRunResult,
    until_stopped,
)
from lorenz.agents.processes import AgentProcess, AgentStdinClosed, LineTooLong, spawn_agent
from lorenz.codes import ErrorCode
from lorenz.model import AgentUpdate, TokenUsage
from lorenz.model.questions import (
    AgentQuestion,
    new_session_summary,
    question_of,
    question_parts,
)

_MESSAGE_CHARS = 200
_PAYLOAD_CHARS = 1000
_VERBOSE_HINT = "requires --verbose"


def _clip(text: str, limit: int = _MESSAGE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _has_option(command: str, name: str) -> bool:
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: bash will complain; just look for the text
        return name in command
    return any(word == name or word.startswith(name + "=") for word in words)


def claude_command(command: str, *, max_turns: int, resume: str | None = None) -> str:
    """The shell command of one invocation: the configured one plus our flags at the end."""
    parts = [command]
    if not _has_option(command, "--max-turns"):
        parts.append(f"--max-turns {max_turns}")
    if resume is not None:
        parts.append(f"--resume {shlex.quote(resume)}")
    return " ".join(parts)


def usage_from_claude(usage: Any) -> TokenUsage:
    """Claude's ``usage`` map as Lorenz token counts (cache reads and writes count as input)."""
    if not isinstance(usage, Mapping):
        return TokenUsage()

    def count(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    prompt = (
        count("input_tokens")
        + count("cache_creation_input_tokens")
        + count("cache_read_input_tokens")
    )
    output = count("output_tokens")
    return TokenUsage(input_tokens=prompt, output_tokens=output, total_tokens=prompt + output)


def _highest(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    return TokenUsage(
        input_tokens=max(a.input_tokens, b.input_tokens),
        output_tokens=max(a.output_tokens, b.output_tokens),
        total_tokens=max(a.total_tokens, b.total_tokens),
    )


class _ClaudeRun:
    """The turns of one run and the totals they add up to."""

    def __init__(self, *, request: AgentRunRequest, grace_s: float) -> None:
        self.request = request
        self.grace_s = grace_s
        self.session_id: str | None = None
        self.turn = 0
        self.pid: int | None = None
        self.finished_tokens = TokenUsage()
        self.finished_cost = 0.0
        self.cost_known = False
        self.reported_tokens = TokenUsage()
        self.message_usage: dict[str, TokenUsage] = {}
        self.model: str | None = None
        """The model of the session, from its ``system``/``init`` event."""
        self.session_announced = False
        self.resuming = False
        """Turn 1 continues a saved session (an answered question) with ``--resume``."""

    def emit(self, event: str, **fields: Any) -> None:
        self.request.on_update(AgentUpdate(event=event, pid=self.pid, **fields))

    def running_tokens(self) -> TokenUsage:
        in_flight = TokenUsage()
        for usage in self.message_usage.values():
            in_flight = in_flight + usage
        self.reported_tokens = _highest(self.reported_tokens, self.finished_tokens + in_flight)
        return self.reported_tokens

    # -- the run --------------------------------------------------------------------------

    async def drive(self) -> AgentRunResult:
        max_turns = self.request.max_turns
        subtype: str | None = None
        first = self.request.prompt
        answer = self.request.answer
        if answer is not None:
            if answer.session_id is not None:
                self.session_id, self.resuming, first = answer.session_id, True, answer.text
            else:
                first = new_session_summary(answer)
        for turn in range(1, max_turns + 1):
            if turn > 1 and not await self.request.issue_is_active():
                break
            self.turn = turn
            text = first if turn == 1 else self.request.continuation_prompt(turn, max_turns)
            subtype = await self.invoke(text)
        return AgentRunResult(turns=self.turn, session_id=self.session_id, stop_reason=subtype)

    async def invoke(self, text: str) -> str:
        """One turn = one process; returns the ``result`` subtype (``success``)."""
        resume = None
        if self.turn > 1 or self.resuming:
            if self.session_id is None:
                raise AgentRunError(
                    "the agent never reported a session_id, so turn "
                    f"{self.turn} cannot --resume it; check that the command prints stream-json",
                    code=ErrorCode.AGENT_PROTOCOL_ERROR,
                )
            resume = self.session_id
        command = claude_command(
            self.request.settings.command, max_turns=self.request.max_turns, resume=resume
        )
        process = await spawn_agent(
            command=command,
            cwd=self.request.workspace,
            env=self.request.env,
            login_shell=self.request.settings.login_shell,
        )
        self.pid = process.pid
        self.message_usage = {}
        self.session_announced = False
        timeout_ms = self.request.settings.turn_timeout_ms
        try:
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    with contextlib.suppress(AgentStdinClosed):
                        # NB: an agent that dies at once (bad flags) closes stdin; its stdout
                        # and stderr still explain why, so read them instead of failing here.
                        await process.write_line(text.encode("utf-8"))
                        await process.close_stdin()
                    result = await until_stopped(
                        self.read_until_result(process),
                        stop=self.request.stop,
                        on_stop=lambda: self.stop_turn(process),
                        grace_s=self.grace_s + 1.0,
                    )
            except TimeoutError:
                self.emit("turn_failed", message=f"turn {self.turn} timed out")
                raise AgentRunError(
                    f"turn {self.turn} did not finish within turn_timeout_ms={timeout_ms}; the "
                    "agent was stopped — raise agents.<kind>.turn_timeout_ms if turns "
                    "legitimately take longer",
                    code=ErrorCode.TURN_TIMEOUT,
                ) from None
            with contextlib.suppress(TimeoutError):
                await process.wait(timeout_s=self.request.settings.read_timeout_ms / 1000)
        finally:
            await process.terminate(grace_s=self.grace_s)
        return self.finish_turn(result)

    async def stop_turn(self, process: AgentProcess) -> None:
        """Stop the current turn at once: Claude Code has no in-band interrupt in print mode,
        so its whole process group is killed (no grace: every second costs tokens)."""
        await process.terminate(grace_s=0.0)

    async def read_until_result(self, process: AgentProcess) -> dict[str, Any]:
        while True:
            try:
                line = await process.read_line()
            except LineTooLong as exc:
                self.emit("malformed", message=exc.message)
                continue
            if line is None:
                raise await self.exited(process)
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                self.emit(
                    "malformed",
                    message=f"ignored a stdout line that is not JSON: {_clip(repr(line[:400]))}",
                )
                continue
            if not isinstance(event, dict):
                self.emit(
                    "malformed",
                    message=f"ignored a JSON value that is not an event: {_clip(repr(line[:400]))}",
                )
                continue
            session_id = event.get("session_id")
            if isinstance(session_id, str) and session_id:
                self.session_id = session_id
            if event.get("type") == "result":
                return event
            self.on_event(event)

    async def exited(self, process: AgentProcess) -> AgentRunError:
        with contextlib.suppress(TimeoutError):
            await process.wait(timeout_s=self.grace_s)
        await process.stderr_drained(timeout_s=0.5)
        tail = process.stderr_tail(max_bytes=1000) or "(no stderr output)"
        hint = ""
        if _VERBOSE_HINT in tail:
            hint = " — add --verbose to the command (stream-json in print mode needs it)"
        return AgentRunError(
            f"the agent exited (status {process.returncode}) in turn {self.turn} without a "
            f"result event{hint}; its stderr ends with: {tail}",
            code=ErrorCode.AGENT_EXITED,
        )

    def announce_session(self, *, message: str, payload: dict[str, Any] | None = None) -> None:
        if self.session_announced or self.session_id is None:
            return
        self.session_announced = True
        self.emit(
            "session_started",
            session_id=f"{self.session_id}-{self.turn}",
            message=message,
            payload=payload,
        )

    # -- events ---------------------------------------------------------------------------

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "system":
            subtype = event.get("subtype")
            if subtype == "init":
                tools = _list(event.get("tools"))
                reported = event.get("model")
                if isinstance(reported, str) and reported and reported != self.model:
                    self.model = reported
                    self.emit(
                        MODEL_EVENT,
                        message=f"model {_clip(reported)}",
                        payload={"model": reported, "source": "system/init"},
                    )
                model = event.get("model") or "unknown model"
                self.announce_session(
                    message=f"turn {self.turn} of at most {self.request.max_turns}: {model}, "
                    f"{len(tools)} tools",
                    payload={
                        "model": model,
                        "tools": [str(t) for t in tools][:100],
                        "permissionMode": event.get("permissionMode"),
                        "cwd": event.get("cwd"),
                    },
                )
            else:
                self.emit(
                    "notification",
                    message=f"system: {subtype}",
                    payload={"type": kind, "subtype": subtype},
                )
        elif kind == "assistant":
            self.on_assistant(event)
        elif kind == "user":
            self.on_user(event)
        elif kind == "rate_limit_event":
            info = event.get("rate_limit_info")
            self.emit(
                "rate_limits",
                message=f"rate limit: {info.get('status') if isinstance(info, dict) else '?'}",
                rate_limits=info if isinstance(info, dict) else None,
            )
        elif kind == "stream_event":
            return  # token deltas (--include-partial-messages): the assistant events follow
        else:
            self.emit("notification", message=f"claude event {kind}", payload={"type": kind})

    def on_assistant(self, event: dict[str, Any]) -> None:
        self.announce_session(message=f"turn {self.turn} of at most {self.request.max_turns}")
        message = _dict(event.get("message"))
        summaries: list[str] = []
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            block_type = block.get("type")
            if block_type == "text":
                summaries.append(f"agent: {_clip(str(block.get('text', '')))}")
            elif block_type == "thinking":
                summaries.append(f"thinking: {_clip(str(block.get('thinking', '')))}")
            elif block_type in ("tool_use", "server_tool_use"):
                arguments = json.dumps(block.get("input"), ensure_ascii=False)
                summaries.append(f"tool call: {block.get('name')} {_clip(arguments, 120)}")
            else:
                summaries.append(f"[{block_type}]")
        usage = None
        message_id = message.get("id")
        # NB: a subagent's messages (parent_tool_use_id set) are not part of the figures the
        # result reports for this invocation; counting them would overshoot it.
        if (
            isinstance(message_id, str)
            and event.get("parent_tool_use_id") is None
            and "usage" in message
        ):
            self.message_usage[message_id] = usage_from_claude(message.get("usage"))
            usage = self.running_tokens()
        text = "; ".join(summaries) or "assistant message"
        self.emit(
            "notification",
            message=_clip(text, _MESSAGE_CHARS + 40),
            usage=usage,
            payload={"type": "assistant", "id": message_id, "summary": _clip(text, _PAYLOAD_CHARS)},
        )

    def on_user(self, event: dict[str, Any]) -> None:
        message = _dict(event.get("message"))
        content = message.get("content")
        if not isinstance(content, list):
            return  # our own prompt echoed back
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                failed = bool(block.get("is_error"))
                self.emit(
                    "notification",
                    message=f"tool result{' (error)' if failed else ''}: "
                    f"{_clip(_result_text(block.get('content')))}",
                    payload={
                        "type": "tool_result",
                        "tool_use_id": block.get("tool_use_id"),
                        "is_error": failed,
                    },
                )

    def finish_turn(self, result: dict[str, Any]) -> str:
        self.announce_session(message=f"turn {self.turn} of at most {self.request.max_turns}")
        self.finished_tokens = self.finished_tokens + usage_from_claude(result.get("usage"))
        self.message_usage = {}
        cost = result.get("total_cost_usd", result.get("cost_usd"))
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            self.finished_cost += float(cost)
            self.cost_known = True
        tokens = self.running_tokens()
        cost_usd = self.finished_cost if self.cost_known else None
        denials = result.get("permission_denials")
        if isinstance(denials, list) and denials:
            names = sorted({str(d.get("tool_name")) for d in denials if isinstance(d, dict)})
            self.emit(
                "notification",
                message=f"{len(denials)} tool use(s) denied by the permission settings: "
                f"{', '.join(names)}",
                payload={"type": "permission_denials", "count": len(denials), "tools": names},
            )
        question = self.question_in(denials)
        subtype = str(result.get("subtype") or "")
        summary = {
            "subtype": subtype,
            "is_error": result.get("is_error"),
            "num_turns": result.get("num_turns"),
            "stop_reason": result.get("stop_reason"),
        }
        if subtype == "success" and not result.get("is_error"):
            self.emit(
                "turn_completed",
                message=f"turn {self.turn} ended: {_clip(str(result.get('result') or subtype))}",
                usage=tokens,
                cost_usd=cost_usd,
                payload=summary,
            )
            if question is not None:
                raise AgentAsked(question)
            return subtype
        if question is not None:
            raise AgentAsked(question)
        self.emit(
            "turn_failed",
            message=f"turn {self.turn} ended: {subtype or 'error'}",
            usage=tokens,
            cost_usd=cost_usd,
            payload=summary,
        )
        if subtype == "error_max_turns":
            raise AgentRunError(
                f"the agent used all its --max-turns ({result.get('num_turns')} agentic turns) in "
                f"turn {self.turn}; raise agent.max_turns or put a larger --max-turns in the "
                "command",
                code=ErrorCode.MAX_TURNS_REACHED,
            )
        detail = result.get("errors") or result.get("result") or "no detail"
        raise AgentRunError(
            f"turn {self.turn} failed ({subtype or 'error'}): {_clip(str(detail), 300)}",
            code=ErrorCode.TURN_FAILED,
        )

    def question_in(self, denials: Any) -> AgentQuestion | None:
        """The question of an ``AskUserQuestion`` the turn's permissions denied, if any."""
        texts: list[str] = []
        options: list[str] = []
        for denial in _list(denials)[:20]:
            if not isinstance(denial, dict) or denial.get("tool_name") != ASK_USER_QUESTION:
                continue
            found_texts, found_options = question_parts(_dict(denial.get("tool_input")))
            texts += found_texts or ["The agent asked a question."]
            options += found_options
        if not texts:
            return None
        question = question_of(
            texts=texts,
            options=options,
            session_id=self.session_id,
            turn=self.turn,
            source=ASK_USER_QUESTION,
        )
        self.emit(
            QUESTION_EVENT,
            message=_clip(f"question: {question.text}"),
            payload={"question": question.to_json()},
        )
        return question


ASK_USER_QUESTION = "AskUserQuestion"
"""Claude Code's question tool; print mode denies it (``result.permission_denials``)."""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return (
            " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            or "[content]"
        )
    return "[content]"


class ClaudeStreamRunner:
    """:class:`~lorenz.agents.base.AgentRunner` for ``protocol: claude-stream-json``.

    ``terminate_grace_s`` is how long an invocation gets between SIGTERM and SIGKILL when it is
    stopped (cancel, timeout, or leftovers after its result).
    """

    def __init__(self, *, terminate_grace_s: float = 2.0) -> None:
        self.terminate_grace_s = terminate_grace_s

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        # NB: each invocation's process is terminated in a finally (also on cancellation), so
        # there is nothing left to clean up here.
        return await _ClaudeRun(request=request, grace_s=self.terminate_grace_s).drive()


ClaudeStreamJsonRunner = ClaudeStreamRunner
"""The name :func:`lorenz.agents.build_runner` looks up for ``claude-stream-json``."""
