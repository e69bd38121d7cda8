"""The ``acp`` runner: drives any Agent Client Protocol agent (Gemini CLI, Claude/Codex adapters).

ACP (v1) is JSON-RPC 2.0 over the agent's stdio, one message per line, with the ``jsonrpc``
member present. A run is one agent process and one ACP session: ``initialize``, then
``session/new`` in the workspace, then one ``session/prompt`` per turn. The agent streams
``session/update`` notifications while it works and may ask us things
(``session/request_permission``); the *response* to ``session/prompt`` ends the turn and says
why (its ``stopReason``).

Why the official SDK (``agent-client-protocol``) is used only for its schema: its generated
pydantic models validate every payload we read (and the fake agent in the tests validates our
payloads against them), but its process helpers trim the child's environment, leave stderr
undrained and read with a 64 KiB line limit, and its connection object, even over a custom
transport, serialises with ``exclude_defaults`` (so ``clientCapabilities`` would vanish from
``initialize`` instead of saying "no fs, no terminal" explicitly), answers ``terminal/*``
requests with ``null`` instead of an error, and logs unknown update kinds as exceptions. The
wire is therefore the shared :class:`~lorenz.agents.jsonrpc.JsonRpcConnection` (with the
``jsonrpc`` member) over :mod:`lorenz.agents.processes`: one process model for every agent
(process groups, 16 MB lines, drained stderr, exact environment) and one ordered reader.

Decisions (also in ``docs/agents.md``):

* Lorenz advertises no client capabilities: ``fs.readTextFile``/``fs.writeTextFile`` and
  ``terminal`` are all ``false``; the agent uses its own file and shell tools in the workspace.
  Any agent-to-client request other than ``session/request_permission`` gets JSON-RPC error
  ``-32601``.
* Stop reasons: ``end_turn``, ``max_tokens`` and ``max_turn_requests`` end the turn normally (the
  work so far stays in the session; the next continuation turn, if the issue is still active,
  picks it up); ``refusal`` fails the run with ``turn_refused``; ``cancelled`` that Lorenz did not
  ask for fails it with ``turn_interrupted``.
* Permissions follow ``agents.<kind>.approvals``: ``allow`` selects an ``allow_once`` option
  (else ``allow_always``), ``deny`` a ``reject_once`` option (else ``reject_always``); when no
  option of the wanted family is offered, or a cancel is under way, the answer is the
  ``cancelled`` outcome. ``ask`` turns a permission request into a *question*: it is answered
  ``cancelled``, the turn is cancelled and the run ends with
  :class:`~lorenz.agents.base.AgentAsked`; the answer's run continues the session with
  ``session/load`` when the agent advertises ``loadSession``, else in a new session whose first
  prompt says what was asked (``docs/questions.md``).
* Usage: ``PromptResponse.usage`` (still unstable in ACP) counts the tokens of *that turn*; the
  runner sums turns into run totals. ``usage_update.cost`` is the session's cumulative cost and
  is reported as is when its currency is USD. ``usage_update.used``/``size`` describe the context
  window, not consumption, and are only shown in the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic
from acp import schema

import lorenz
from lorenz.agents.base import (
    MODEL_EVENT,
    QUESTION_EVENT,
    AgentAsked,
    AgentRunError,
    AgentRunRequest,
    AgentRunResult,
    until_stopped,
)
from lorenz.agents.jsonrpc import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    ConnectionClosed,
    JsonRpcConnection,
    JsonRpcError,
    RequestId,
)
from lorenz.agents.processes import AgentProcess, AgentStdinClosed, spawn_agent
from lorenz.codes import ErrorCode
from lorenz.config import ApprovalMode
from lorenz.model import AgentUpdate, TokenUsage
from lorenz.model.questions import AgentQuestion, new_session_summary, question_of

logger = logging.getLogger(__name__)

ACP_PROTOCOL_VERSION = 1
"""The ACP protocol version Lorenz speaks (v1, the stable one)."""

AUTH_REQUIRED = -32000
"""ACP's "authentication required" error code."""

CLIENT_CAPABILITIES: dict[str, Any] = {
    "fs": {"readTextFile": False, "writeTextFile": False},
    "terminal": False,
}
"""What Lorenz tells agents it can do for them: nothing beyond permissions and updates."""

CONTINUING_STOP_REASONS = frozenset({"end_turn", "max_tokens", "max_turn_requests"})
"""Stop reasons after which the run goes on to the next turn (or ends successfully)."""

_MESSAGE_CHARS = 200
_PAYLOAD_CHARS = 1000
_TRANSCRIPT_TAIL_CHARS = 2000


def _clip(text: str, limit: int = _MESSAGE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def choose_permission_option(
    options: Sequence[schema.PermissionOption], *, approvals: ApprovalMode
) -> schema.PermissionOption | None:
    """The option Lorenz selects for a permission request, or ``None`` for "cancelled"."""
    if approvals is ApprovalMode.ALLOW:
        preferred = ("allow_once", "allow_always")
    else:
        preferred = ("reject_once", "reject_always")
    for kind in preferred:
        for option in options:
            if option.kind == kind:
                return option
    return None


class _AcpRun:
    """One run: the process, the session, the turn loop and the running totals."""

    def __init__(self, *, request: AgentRunRequest, process: AgentProcess, grace_s: float) -> None:
        self.request = request
        self.process = process
        self.grace_s = grace_s
        self.connection = JsonRpcConnection(
            process,
            on_notification=self._on_notification,
            on_request=self._on_agent_request,
            on_garbage=self._on_garbage,
            jsonrpc_member=True,
        )
        self.session_id: str | None = None
        self.turn = 0
        self.in_flight: asyncio.Task[Any] | None = None
        self.cancelling = False
        self.tokens = TokenUsage()
        self.tokens_reported = False
        self.cost_usd: float | None = None
        self.model: str | None = None
        """The model of the session, when the agent offers a ``model`` config option."""
        self.transcript = ""
        self.tool_titles: dict[str, str] = {}
        self.question: AgentQuestion | None = None
        """A permission request ``approvals: ask`` turned into a question (the run ends)."""
        self.first_prompt = request.prompt
        self.replaying = False
        """``session/load`` replays the history as updates: they are not this run's output."""
        self._asking: asyncio.Task[None] | None = None

    # -- reporting ------------------------------------------------------------------------

    def emit(
        self,
        event: str,
        *,
        message: str | None = None,
        session_id: str | None = None,
        usage: TokenUsage | None = None,
        cost_usd: float | None = None,
        payload: dict[str, Any] | None = None,
    ) -> None:
        self.request.on_update(
            AgentUpdate(
                event=event,
                message=message,
                session_id=session_id,
                usage=usage,
                cost_usd=cost_usd,
                pid=self.process.pid,
                payload=payload,
            )
        )

    def _on_garbage(self, line: bytes | None, reason: str) -> None:
        if line is None:
            self.emit("malformed", message=reason)
        else:
            self.emit(
                "malformed",
                message=f"ignored a stdout line ({reason}): {_clip(repr(line[:400]))}",
            )

    # -- requests -------------------------------------------------------------------------

    async def call(
        self, method: str, params: dict[str, Any], *, timeout_s: float, startup: bool = False
    ) -> Any:
        request = asyncio.ensure_future(
            self.connection.request(method, params, timeout_s=None)
        )
        try:
            if startup:
                await asyncio.sleep(0)  # the request's first step writes it
                # NB: start-up (the login shell, the agent's own start) ends when the agent has
                # read the request; ``timeout_s`` counts only from there.
                limit_ms = self.request.settings.startup_timeout_ms
                if not await self.process.wait_input_read(
                    timeout_s=limit_ms / 1000, until=request
                ):
                    raise AgentRunError(
                        f"the ACP agent did not start reading its input within "
                        f"startup_timeout_ms={limit_ms}; check that the command starts an ACP "
                        "agent (e.g. `gemini --acp`) and how long its login shell takes: "
                        f"{self.process.stderr_tail(max_bytes=500)}",
                        code=ErrorCode.STARTUP_TIMEOUT,
                    )
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(request)
        except TimeoutError:
            ms = self.request.settings.read_timeout_ms
            raise AgentRunError(
                f"the ACP agent did not answer {method} within read_timeout_ms={ms}; check that "
                "the command starts an ACP agent (e.g. `gemini --acp`) or raise "
                f"read_timeout_ms: {self.process.stderr_tail(max_bytes=500)}",
                code=ErrorCode.READ_TIMEOUT,
            ) from None
        except (ConnectionClosed, AgentStdinClosed):
            raise await self.exited(f"before answering {method}") from None
        finally:
            if not request.done():
                request.cancel()

    async def exited(self, when: str) -> AgentRunError:
        with contextlib.suppress(TimeoutError):
            await self.process.wait(timeout_s=self.grace_s)
        await self.process.stderr_drained(timeout_s=0.5)
        status = self.process.returncode
        tail = self.process.stderr_tail(max_bytes=1000) or "(no stderr output)"
        return AgentRunError(
            f"the ACP agent exited (status {status}) {when}; its stderr ends with: {tail}",
            code=ErrorCode.AGENT_EXITED,
        )

    # -- the run --------------------------------------------------------------------------

    async def drive(self) -> AgentRunResult:
        self.connection.start()
        await self.handshake()
        assert self.session_id is not None
        stop_reason: str | None = None
        max_turns = self.request.max_turns
        for turn in range(1, max_turns + 1):
            if turn > 1 and not await self.request.issue_is_active():
                break
            self.turn = turn
            if turn == 1:
                text = self.first_prompt
            else:
                text = self.request.continuation_prompt(turn, max_turns)
            stop_reason = await self.prompt_turn(text)
        return AgentRunResult(turns=self.turn, session_id=self.session_id, stop_reason=stop_reason)

    async def handshake(self) -> None:
        read_timeout_s = self.request.settings.read_timeout_ms / 1000
        try:
            raw = await self.call(
                "initialize",
                {
                    "protocolVersion": ACP_PROTOCOL_VERSION,
                    "clientCapabilities": CLIENT_CAPABILITIES,
                    "clientInfo": {
                        "name": "lorenz",
                        "title": "Lorenz",
                        "version": lorenz.__version__,
                    },
                },
                timeout_s=read_timeout_s,
                startup=True,
            )
            init = schema.InitializeResponse.model_validate(raw)
        except JsonRpcError as exc:
            raise AgentRunError(
                f"the ACP agent refused initialize ({exc.code}: {exc.message}); check the agent "
                "command and its version",
                code=ErrorCode.HANDSHAKE_FAILED,
            ) from None
        except pydantic.ValidationError as exc:
            raise self.protocol_error("initialize", exc) from None
        if init.protocol_version != ACP_PROTOCOL_VERSION:
            raise AgentRunError(
                f"the ACP agent speaks protocol version {init.protocol_version}, Lorenz speaks "
                f"{ACP_PROTOCOL_VERSION}; use an agent release that supports ACP v1",
                code=ErrorCode.HANDSHAKE_FAILED,
            )
        answer = self.request.answer
        if answer is not None:
            capabilities = init.agent_capabilities
            if (
                answer.session_id is not None
                and capabilities is not None
                and capabilities.load_session
                and await self.load_session(answer.session_id, timeout_s=read_timeout_s)
            ):
                self.first_prompt = answer.text
                agent = init.agent_info
                self.emit(
                    "handshake_completed",
                    message=f"ACP agent {agent.name if agent else 'unknown'} session "
                    f"{answer.session_id} loaded",
                )
                return
            # NB: no loadSession (or the agent refused it): a new session, told what was asked.
            self.first_prompt = new_session_summary(answer)
        try:
            raw = await self.call(
                "session/new",
                {"cwd": str(self.request.workspace.resolve()), "mcpServers": []},
                timeout_s=read_timeout_s,
            )
            session = schema.NewSessionResponse.model_validate(raw)
        except JsonRpcError as exc:
            hint = "check the agent's configuration"
            if exc.code == AUTH_REQUIRED:
                methods = ", ".join(m.id for m in init.auth_methods or []) or "none advertised"
                hint = (
                    "the agent needs to be logged in (auth methods: "
                    f"{methods}); log it in once or pass its API key in agents.<kind>.env"
                )
            raise AgentRunError(
                f"the ACP agent refused session/new ({exc.code}: {exc.message}); {hint}",
                code=ErrorCode.HANDSHAKE_FAILED,
            ) from None
        except pydantic.ValidationError as exc:
            raise self.protocol_error("session/new", exc) from None
        self.session_id = session.session_id
        self.note_model(session.config_options)
        agent = init.agent_info
        self.emit(
            "handshake_completed",
            message=f"ACP agent {agent.name if agent else 'unknown'} "
            f"{agent.version if agent else ''}".strip(),
        )

    async def load_session(self, session_id: str, *, timeout_s: float) -> bool:
        """``session/load`` a saved session (an answered question); ``False`` if refused."""
        self.replaying = True
        try:
            await self.call(
                "session/load",
                {
                    "sessionId": session_id,
                    "cwd": str(self.request.workspace.resolve()),
                    "mcpServers": [],
                },
                timeout_s=timeout_s,
            )
        except JsonRpcError as exc:
            self.emit(
                "session_load_refused",
                message=f"the agent refused session/load ({exc.code}: {_clip(exc.message)})",
            )
            return False
        finally:
            self.replaying = False
        self.session_id = session_id
        return True

    def protocol_error(self, what: str, exc: pydantic.ValidationError) -> AgentRunError:
        errors = exc.errors()
        where, why = ("?", str(exc))
        if errors:
            where = ".".join(str(part) for part in errors[0]["loc"]) or "(top level)"
            why = errors[0]["msg"]
        return AgentRunError(
            f"the ACP agent answered {what} with an invalid payload ({where}: {why}); "
            "it may speak another ACP version",
            code=ErrorCode.AGENT_PROTOCOL_ERROR,
        )

    async def prompt_turn(self, text: str) -> str:
        assert self.session_id is not None
        turn, max_turns = self.turn, self.request.max_turns
        self.transcript = ""
        self.emit(
            "session_started",
            session_id=f"{self.session_id}-{turn}",
            message=f"turn {turn} of at most {max_turns}",
        )
        params = {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]}
        # NB: the prompt request runs as its own task so that a timeout or a cancellation can
        # send session/cancel and still collect the agent's answer during the grace period.
        task = asyncio.create_task(
            self.connection.request("session/prompt", params, timeout_s=None),
            name=f"acp-prompt-{self.process.pid}-{turn}",
        )
        self.in_flight = task
        turn_timeout_s = self.request.settings.turn_timeout_ms / 1000
        try:
            async with asyncio.timeout(turn_timeout_s):
                raw = await until_stopped(
                    asyncio.shield(task),
                    stop=self.request.stop,
                    on_stop=self.cancel_in_flight,
                    grace_s=self.grace_s + 1.0,
                )
        except TimeoutError:
            await self.cancel_in_flight()
            self.emit("turn_failed", message=f"turn {turn} timed out")
            raise AgentRunError(
                f"turn {turn} did not finish within turn_timeout_ms="
                f"{self.request.settings.turn_timeout_ms}; the agent was cancelled — raise "
                "agents.<kind>.turn_timeout_ms if turns legitimately take longer",
                code=ErrorCode.TURN_TIMEOUT,
            ) from None
        except (ConnectionClosed, AgentStdinClosed):
            self.in_flight = None
            raise await self.exited(f"during turn {turn}") from None
        except JsonRpcError as exc:
            self.in_flight = None
            self.emit("turn_failed", message=f"turn {turn} failed: {exc.message}")
            raise AgentRunError(
                f"the ACP agent failed turn {turn} ({exc.code}: {exc.message}); see its logs",
                code=ErrorCode.TURN_FAILED,
            ) from None
        self.in_flight = None
        if self.question is not None:
            self.emit("turn_completed", message=f"turn {turn} ended: a question was asked")
            raise AgentAsked(self.question)
        try:
            response = schema.PromptResponse.model_validate(raw)
        except pydantic.ValidationError as exc:
            raise self.protocol_error("session/prompt", exc) from None
        stop = response.stop_reason
        if response.usage is not None:
            turn_usage = TokenUsage(
                input_tokens=response.usage.input_tokens,
                output_tokens=response.usage.output_tokens,
                total_tokens=response.usage.total_tokens,
            )
            self.tokens = self.tokens + turn_usage
            self.tokens_reported = True
        usage = self.tokens if self.tokens_reported else None
        if stop in CONTINUING_STOP_REASONS:
            self.emit(
                "turn_completed",
                message=f"turn {turn} ended: {stop}",
                usage=usage,
                cost_usd=self.cost_usd,
                payload={"stopReason": stop},
            )
            return stop
        self.emit(
            "turn_failed", message=f"turn {turn} ended: {stop}", usage=usage, cost_usd=self.cost_usd
        )
        if stop == "refusal":
            raise AgentRunError(
                f"the agent refused to continue in turn {turn} (stopReason refusal); rephrase "
                "the issue or the prompt template",
                code=ErrorCode.TURN_REFUSED,
            )
        raise AgentRunError(
            f"turn {turn} was cancelled by the agent (stopReason cancelled) without Lorenz "
            "asking; see the agent's logs",
            code=ErrorCode.TURN_INTERRUPTED,
        )

    def note_model(self, options: Sequence[Any] | None) -> None:
        """Report the session's model when a ``model`` config option names it (ACP gives no
        other way; unstable in ACP, so anything else is ignored)."""
        for option in options or ():
            if getattr(option, "category", None) != "model":
                continue
            value = getattr(option, "current_value", None)
            if isinstance(value, str) and value and value != self.model:
                self.model = value
                self.emit(
                    MODEL_EVENT,
                    message=f"model {_clip(value)}",
                    payload={"model": value, "source": "configOptions"},
                )
            return

    # -- stopping -------------------------------------------------------------------------

    async def cancel_in_flight(self) -> None:
        """``session/cancel`` the running turn and give the agent a grace period to end it."""
        self.cancelling = True
        task = self.in_flight
        if task is None or task.done() or self.session_id is None:
            return
        with contextlib.suppress(AgentRunError, OSError):
            await self.connection.notify("session/cancel", {"sessionId": self.session_id})
        await asyncio.wait({task}, timeout=self.grace_s)

    async def close(self, *, graceful: bool) -> None:
        """End the process and everything it started; close stdin first when all went well."""
        try:
            if graceful and not self.connection.closed.done():
                # NB: an agent that no longer reads stdin is terminated next anyway.
                with contextlib.suppress(Exception):
                    await self.process.close_stdin()
                with contextlib.suppress(TimeoutError):
                    await self.process.wait(timeout_s=self.grace_s)
        finally:
            await self.process.terminate(grace_s=self.grace_s)
            task = self.in_flight
            if task is not None:
                task.cancel()
                # NB: how a cancelled task ended (cancelled or failing) is not ours to report.
                with contextlib.suppress(BaseException):
                    await task
            await self.connection.aclose()
            closed = self.connection.closed
            if closed.done() and not closed.cancelled():
                closed.exception()  # NB: mark retrieved, no "never retrieved" warning

    # -- what the agent sends -------------------------------------------------------------

    async def _on_agent_request(
        self, request_id: RequestId, method: str, params: Mapping[str, Any]
    ) -> Any:
        if method == "session/request_permission":
            return self._answer_permission(params)
        self.emit(
            "unsupported_request",
            message=f"declined the agent's {method} request (Lorenz does not offer it)",
            payload={"method": method},
        )
        raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}", {"method": method})

    def _answer_permission(self, params: Mapping[str, Any]) -> dict[str, Any]:
        try:
            ask = schema.RequestPermissionRequest.model_validate(params)
        except pydantic.ValidationError as exc:
            raise JsonRpcError(
                INVALID_PARAMS, "invalid session/request_permission params", str(exc)
            ) from None
        title = (
            ask.tool_call.title
            or self.tool_titles.get(ask.tool_call.tool_call_id)
            or ask.tool_call.tool_call_id
        )
        approvals = self.request.settings.approvals
        if approvals is ApprovalMode.ASK and not self.cancelling:
            return self._ask_permission(ask, title=title)
        option = (
            None if self.cancelling else choose_permission_option(ask.options, approvals=approvals)
        )
        if option is None:
            why = (
                "a cancel is under way"
                if self.cancelling
                else f"no option fits approvals={approvals.value}"
            )
            self.emit(
                "approval_cancelled",
                message=f"permission for {_clip(title)} answered cancelled ({why})",
                payload={"toolCallId": ask.tool_call.tool_call_id, "outcome": "cancelled"},
            )
            return {"outcome": {"outcome": "cancelled"}}
        approved = option.kind.startswith("allow")
        self.emit(
            "approval_auto_approved" if approved else "approval_auto_denied",
            message=f"{'approved' if approved else 'denied'} {_clip(title)} ({option.kind})",
            payload={
                "toolCallId": ask.tool_call.tool_call_id,
                "optionId": option.option_id,
                "kind": option.kind,
            },
        )
        return {"outcome": {"outcome": "selected", "optionId": option.option_id}}

    def _ask_permission(
        self, ask: schema.RequestPermissionRequest, *, title: str
    ) -> dict[str, Any]:
        """``approvals: ask``: the request becomes the run's question; it is answered
        ``cancelled`` and the turn is cancelled, so the run ends with the question."""
        if self.question is None:
            self.question = question_of(
                texts=[f"May I: {title}?"],
                options=[option.name for option in ask.options],
                session_id=self.session_id,
                turn=max(self.turn, 1),
                source="session/request_permission",
            )
            self.emit(
                QUESTION_EVENT,
                message=_clip(f"question: {self.question.text}"),
                payload={"question": self.question.to_json()},
            )
            self._asking = asyncio.ensure_future(self.cancel_in_flight())
        return {"outcome": {"outcome": "cancelled"}}

    def _on_notification(self, method: str, params: Mapping[str, Any], size: int) -> None:
        if self.replaying:
            return  # NB: session/load's replay of the history, not this run's work.
        if method != "session/update":
            self.emit(
                "notification", message=f"agent notification {method}", payload={"method": method}
            )
            return
        try:
            note = schema.SessionNotification.model_validate(params)
        except pydantic.ValidationError:
            kind = (
                params.get("update", {}).get("sessionUpdate") if isinstance(params, dict) else None
            )
            self.emit(
                "notification",
                message=f"session update {kind or '?'} (not a v1 update Lorenz knows)",
                payload={"sessionUpdate": kind},
            )
            return
        self._on_update(note.update)

    def _on_update(self, update: Any) -> None:
        kind = getattr(update, "session_update", "?")
        if isinstance(update, schema.AgentMessageChunk | schema.AgentThoughtChunk):
            text = _content_text(update.content)
            if isinstance(update, schema.AgentMessageChunk):
                self.transcript = (self.transcript + text)[-_TRANSCRIPT_TAIL_CHARS:]
                message = f"agent: {_clip(self.transcript)}"
            else:
                message = f"thinking: {_clip(text)}"
            self.emit(
                "notification",
                message=message,
                payload={"sessionUpdate": kind, "text": _clip(text, _PAYLOAD_CHARS)},
            )
        elif isinstance(update, schema.ToolCallStart):
            self.tool_titles[update.tool_call_id] = update.title
            self.transcript = ""
            self.emit(
                "notification",
                message=f"tool call: {_clip(update.title)} "
                f"({update.kind or 'other'}, {update.status or 'pending'})",
                payload=_tool_payload(
                    kind, update.tool_call_id, update.title, update.kind, update.status
                ),
            )
        elif isinstance(update, schema.ToolCallProgress):
            if update.title:
                self.tool_titles[update.tool_call_id] = update.title
            title = self.tool_titles.get(update.tool_call_id, update.tool_call_id)
            self.emit(
                "notification",
                message=f"tool call {_clip(title)}: {update.status or 'updated'}",
                payload=_tool_payload(kind, update.tool_call_id, title, update.kind, update.status),
            )
        elif isinstance(update, schema.AgentPlanUpdate):
            done = sum(1 for entry in update.entries if entry.status == "completed")
            current = next((e.content for e in update.entries if e.status == "in_progress"), None)
            message = f"plan: {done}/{len(update.entries)} done"
            if current:
                message += f"; now: {_clip(current, 120)}"
            self.emit("notification", message=message, payload={"sessionUpdate": kind})
        elif isinstance(update, schema.UsageUpdate):
            message = f"context {update.used}/{update.size} tokens"
            cost = update.cost
            if cost is not None:
                message += f", session cost {cost.amount:.4f} {cost.currency}"
                if cost.currency.upper() == "USD":
                    self.cost_usd = cost.amount
            self.emit(
                "usage_updated",
                message=message,
                cost_usd=self.cost_usd,
                usage=self.tokens if self.tokens_reported else None,
                payload={"sessionUpdate": kind, "used": update.used, "size": update.size},
            )
        elif isinstance(update, schema.ConfigOptionUpdate):
            self.note_model(update.config_options)
        elif isinstance(update, schema.CurrentModeUpdate):
            self.emit(
                "notification",
                message=f"mode: {update.current_mode_id}",
                payload={"sessionUpdate": kind},
            )
        elif isinstance(update, schema.SessionInfoUpdate):
            self.emit(
                "notification",
                message=f"session: {_clip(update.title or '')}",
                payload={"sessionUpdate": kind},
            )
        elif isinstance(update, schema.UserMessageChunk):
            return  # the agent echoing our own prompt back
        else:
            self.emit(
                "notification", message=f"session update {kind}", payload={"sessionUpdate": kind}
            )


def _content_text(content: Any) -> str:
    if isinstance(content, schema.TextContentBlock):
        return content.text
    return f"[{getattr(content, 'type', 'content')}]"


def _tool_payload(
    kind: str, tool_call_id: str, title: str, tool_kind: str | None, status: str | None
) -> dict[str, Any]:
    return {
        "sessionUpdate": kind,
        "toolCallId": tool_call_id,
        "title": _clip(title, _PAYLOAD_CHARS),
        "kind": tool_kind,
        "status": status,
    }


class AcpRunner:
    """:class:`~lorenz.agents.base.AgentRunner` for ``protocol: acp``.

    ``terminate_grace_s`` is how long an agent gets to wind down after ``session/cancel`` (or after
    its stdin closes at the end of a run) before its process group is killed.
    """

    def __init__(self, *, terminate_grace_s: float = 2.0) -> None:
        self.terminate_grace_s = terminate_grace_s

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        process = await spawn_agent(
            command=request.settings.command,
            cwd=request.workspace,
            env=request.env,
            login_shell=request.settings.login_shell,
        )
        run = _AcpRun(request=request, process=process, grace_s=self.terminate_grace_s)
        graceful = False
        try:
            result = await run.drive()
            graceful = True
            return result
        except asyncio.CancelledError:
            # NB: the run's task was cancelled (reconciliation, shutdown): tell the agent, give it
            # the grace period, then the finally below kills the group; re-raise either way.
            await run.cancel_in_flight()
            raise
        finally:
            await run.close(graceful=graceful)
