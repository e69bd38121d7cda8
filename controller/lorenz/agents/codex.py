r"""The ``codex-app-server`` runner: drives ``codex app-server`` over its stdio JSON-RPC protocol.

One run is one app-server process and one thread: ``initialize`` → ``initialized`` →
``thread/start`` → ``turn/start`` … ``turn/completed``, then further turns on the same thread
while the issue stays active, up to ``agent.max_turns``. The protocol is chatty and two-way:
besides streaming notifications the server asks the client for approvals, for dynamic tool calls
and for user input, and every one of those must be answered or the turn stalls forever.

The choices this module makes where the protocol leaves them to the client (see
``docs/agents.md``):

* approvals follow ``agents.<kind>.approvals``: ``deny`` (default) declines, ``allow`` accepts
  for the session; permission requests get everything requested or nothing;
* a request for user input (``item/tool/requestUserInput``, an MCP elicitation, an
  input-required notification) is a *question*: it is captured (text, options, the thread id),
  the turn is interrupted and the run ends with :class:`~lorenz.agents.base.AgentAsked`
  (``input_required``); the slot waits for an answer, and the next run ``thread/resume``\ s the
  same thread with the answer as its first turn input (see ``docs/questions.md``);
* the default turn sandbox is ``workspaceWrite`` limited to the workspace;
* ``turn_timeout_ms`` is the longest *silence* during a turn, ``read_timeout_ms`` bounds each
  request/response after the first; ``startup_timeout_ms`` bounds the first (``initialize``),
  which also waits for the process to start (a login shell) before it can be read;
* token usage is the thread's cumulative ``tokenUsage.total``, reported as-is (never summed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Final, TypeVar

import tenacity

import lorenz
from lorenz.agents.base import (
    MODEL_EVENT,
    QUESTION_EVENT,
    AgentAsked,
    AgentRunError,
    AgentRunRequest,
    AgentRunResult,
    ToolHandler,
    until_stopped,
)
from lorenz.agents.jsonrpc import (
    METHOD_NOT_FOUND,
    SERVER_OVERLOADED,
    ConnectionClosed,
    JsonRpcConnection,
    JsonRpcError,
    RequestId,
)
from lorenz.agents.processes import AgentProcess, spawn_agent
from lorenz.codes import ErrorCode
from lorenz.config import ApprovalMode
from lorenz.model import AgentUpdate, TokenUsage
from lorenz.model.questions import (
    AgentQuestion,
    new_session_summary,
    question_of,
    question_parts,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

CLIENT_NAME: Final = "lorenz"
CLIENT_TITLE: Final = "Lorenz"

PAYLOAD_LIMIT_BYTES: Final = 16 * 1024
"""Notifications larger than this are reported without their payload (a summary only)."""

MESSAGE_LIMIT_CHARS: Final = 500

INPUT_REQUIRED_REQUESTS: Final = frozenset(
    {"item/tool/requestUserInput", "mcpServer/elicitation/request"}
)
INPUT_REQUIRED_NOTIFICATIONS: Final = frozenset(
    {
        "turn/input_required",
        "turn/needs_input",
        "turn/need_input",
        "turn/request_input",
        "turn/request_response",
        "turn/provide_input",
        "turn/approval_required",
    }
)
TURN_END_NOTIFICATIONS: Final = frozenset({"turn/completed", "turn/failed", "turn/cancelled"})

_COMMAND_APPROVAL = "item/commandExecution/requestApproval"
_FILE_APPROVAL = "item/fileChange/requestApproval"
_PERMISSIONS_APPROVAL = "item/permissions/requestApproval"
_LEGACY_APPROVALS = frozenset({"execCommandApproval", "applyPatchApproval"})
_TOOL_CALL = "item/tool/call"
_APPROVALS = frozenset(
    {_COMMAND_APPROVAL, _FILE_APPROVAL, _PERMISSIONS_APPROVAL, *_LEGACY_APPROVALS}
)


def default_turn_sandbox_policy(workspace: str) -> dict[str, Any]:
    """The ``sandboxPolicy`` sent with every turn unless ``turn_sandbox_policy`` is set."""
    return {"type": "workspaceWrite", "writableRoots": [workspace]}


def codex_tool_specs(tools: ToolHandler | None) -> list[dict[str, Any]]:
    """``ToolHandler.tool_specs()`` in the shape ``thread/start.dynamicTools`` expects."""
    if tools is None:
        return []
    specs: list[dict[str, Any]] = []
    for spec in tools.tool_specs():
        schema = spec.get("inputSchema", spec.get("input_schema", spec.get("parameters")))
        specs.append(
            {
                "type": "function",
                "name": str(spec["name"]),
                "description": str(spec.get("description") or ""),
                "inputSchema": schema if schema is not None else {"type": "object"},
            }
        )
    return specs


class _Overloaded(Exception):
    """A request got -32001; tenacity retries these."""

    def __init__(self, method: str, error: JsonRpcError) -> None:
        super().__init__(f"{method}: {error.message}")
        self.method = method
        self.error = error


class CodexAppServerRunner:
    """:class:`~lorenz.agents.base.AgentRunner` for ``protocol: codex-app-server``."""

    def __init__(
        self,
        *,
        client_version: str = lorenz.__version__,
        overload_attempts: int = 6,
        overload_initial_delay_s: float = 0.2,
        overload_max_delay_s: float = 10.0,
        terminate_grace_s: float = 2.0,
    ) -> None:
        self.client_version = client_version
        self.overload_attempts = overload_attempts
        """How often one request is sent in total while the server answers -32001."""
        self.overload_initial_delay_s = overload_initial_delay_s
        self.overload_max_delay_s = overload_max_delay_s
        self.terminate_grace_s = terminate_grace_s

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        process = await spawn_agent(
            command=request.settings.command,
            cwd=request.workspace,
            env=request.env,
            login_shell=request.settings.login_shell,
        )
        session = CodexSession(request, process, runner=self)
        try:
            return await session.run()
        finally:
            await session.close()


class CodexSession:
    """One app-server process and its thread, for one run. Usable on its own (conformance)."""

    def __init__(
        self, request: AgentRunRequest, process: AgentProcess, *, runner: CodexAppServerRunner
    ) -> None:
        self.request = request
        self.process = process
        self.runner = runner
        self.settings = request.settings
        self.workspace = str(request.workspace)
        self.tool_specs = codex_tool_specs(request.tools)
        self.tool_names = [spec["name"] for spec in self.tool_specs]
        self.thread_id: str | None = None
        self.turn_id: str | None = None
        self.session_id: str | None = None
        self.turns_completed = 0
        self.model: str | None = None
        """The model ``thread/start`` answered with (``None``: not reported)."""
        self.turn = 0
        self.question: AgentQuestion | None = None
        """The question the agent asked in the current turn (the run ends with it)."""
        self.decisions: list[tuple[str, Any]] = []
        """``(method, answer)`` for every approval-type request answered (for tests, logs)."""
        self._loop = asyncio.get_running_loop()
        self._failure: asyncio.Future[None] = self._loop.create_future()
        self._turn_ends: dict[str | None, Mapping[str, Any]] = {}
        self._turn_end_signal = asyncio.Event()
        self._closed = False
        self.connection = JsonRpcConnection(
            process,
            on_notification=self._on_notification,
            on_request=self._on_request,
            on_garbage=self._on_garbage,
        )
        self.connection.start()
        self._emit(AgentUpdate(event="agent_started", pid=process.pid, message="codex app-server"))

    # -- the run --------------------------------------------------------------------------

    async def run(self) -> AgentRunResult:
        await self.initialize()
        request = self.request
        prompt = request.prompt
        answer = request.answer
        if answer is None:
            await self.start_thread()
        elif answer.session_id is not None and await self.resume_thread(answer.session_id):
            prompt = answer.text
        else:
            await self.start_thread()
            prompt = new_session_summary(answer)
        turn = 1
        while True:
            await self.run_turn(prompt, turn=turn)
            if turn >= request.max_turns:
                return self._result("max_turns")
            if not await request.issue_is_active():
                return self._result("issue_inactive")
            turn += 1
            prompt = request.continuation_prompt(turn, request.max_turns)

    def _result(self, reason: str) -> AgentRunResult:
        return AgentRunResult(
            turns=self.turns_completed, session_id=self.session_id, stop_reason=reason
        )

    async def initialize(self) -> Mapping[str, Any]:
        params: dict[str, Any] = {
            "clientInfo": {
                "name": CLIENT_NAME,
                "title": CLIENT_TITLE,
                "version": self.runner.client_version,
            }
        }
        if self._needs_experimental_api():
            params["capabilities"] = {"experimentalApi": True}
        # NB: the request sits in the pipe until the agent reads it, and the login shell before
        # it may take seconds on a loaded machine: start-up gets its own, longer limit.
        result = await self._call("initialize", params, stage="handshake", startup=True)
        await self._guard(self.connection.notify("initialized"), timeout_s=self._read_timeout_s)
        return result if isinstance(result, Mapping) else {}

    async def start_thread(self) -> str:
        params: dict[str, Any] = {"cwd": self.workspace}
        if self.settings.approval_policy is not None:
            params["approvalPolicy"] = self.settings.approval_policy
        if self.settings.thread_sandbox:
            params["sandbox"] = self.settings.thread_sandbox
        if self.tool_specs:
            params["dynamicTools"] = self.tool_specs
        result = await self._call("thread/start", params, stage="handshake")
        thread = result.get("thread") if isinstance(result, Mapping) else None
        thread_id = thread.get("id") if isinstance(thread, Mapping) else None
        if not isinstance(thread_id, str) or not thread_id:
            raise AgentRunError(
                f"thread/start returned no thread id ({_short(result)}); is the command really "
                "a Codex app-server?",
                code=ErrorCode.AGENT_PROTOCOL_ERROR,
            )
        self.thread_id = thread_id
        self._emit(AgentUpdate(event="thread_started", message=f"thread {thread_id}"))
        # NB: the answer names the model the thread runs (top level; older servers put it in
        # the thread): the one spend is priced with.
        model = result.get("model") if isinstance(result, Mapping) else None
        if not isinstance(model, str) or not model:
            model = thread.get("model") if isinstance(thread, Mapping) else None
        if isinstance(model, str) and model:
            self.model = model
            self._emit(
                AgentUpdate(
                    event=MODEL_EVENT,
                    message=f"model {_short(model)}",
                    payload={"model": model, "source": "thread/start"},
                )
            )
        return thread_id

    async def resume_thread(self, thread_id: str) -> bool:
        """``thread/resume`` a saved thread (a question's answer continues it); ``False`` when
        the server refuses (the thread is gone): the caller starts a new one instead."""
        params: dict[str, Any] = {"threadId": thread_id, "cwd": self.workspace}
        if self.settings.approval_policy is not None:
            params["approvalPolicy"] = self.settings.approval_policy
        if self.settings.thread_sandbox:
            params["sandbox"] = self.settings.thread_sandbox
        if self.tool_specs:
            params["dynamicTools"] = self.tool_specs
        try:
            result = await self._call("thread/resume", params, stage="handshake")
        except AgentRunError as exc:
            if exc.code != ErrorCode.HANDSHAKE_FAILED:
                raise
            self._emit(
                AgentUpdate(
                    event="thread_resume_refused", message=exc.message[:MESSAGE_LIMIT_CHARS]
                )
            )
            return False
        thread = result.get("thread") if isinstance(result, Mapping) else None
        resumed = thread.get("id") if isinstance(thread, Mapping) else None
        self.thread_id = resumed if isinstance(resumed, str) and resumed else thread_id
        self._emit(AgentUpdate(event="thread_resumed", message=f"thread {self.thread_id}"))
        return True

    async def run_turn(self, text: str, *, turn: int) -> Mapping[str, Any]:
        assert self.thread_id is not None
        self.turn = turn
        issue = self.request.issue
        params: dict[str, Any] = {
            "threadId": self.thread_id,
            "input": [{"type": "text", "text": text}],
            "cwd": self.workspace,
            "title": f"{issue.identifier}: {issue.title}",
            "sandboxPolicy": self.settings.turn_sandbox_policy
            or default_turn_sandbox_policy(self.workspace),
        }
        if self.settings.approval_policy is not None:
            params["approvalPolicy"] = self.settings.approval_policy
        result = await self._call("turn/start", params, stage="turn")
        turn_obj = result.get("turn") if isinstance(result, Mapping) else None
        turn_id = turn_obj.get("id") if isinstance(turn_obj, Mapping) else None
        if not isinstance(turn_id, str) or not turn_id:
            raise AgentRunError(
                f"turn/start returned no turn id ({_short(result)})",
                code=ErrorCode.AGENT_PROTOCOL_ERROR,
            )
        self.turn_id = turn_id
        self.session_id = f"{self.thread_id}-{turn_id}"
        self._emit(
            AgentUpdate(
                event="session_started",
                session_id=self.session_id,
                pid=self.process.pid,
                message=f"turn {turn} of {self.request.max_turns}",
                payload={"thread_id": self.thread_id, "turn_id": turn_id, "turn": turn},
            )
        )
        ended = await until_stopped(
            self._await_turn_end(turn_id),
            stop=self.request.stop,
            on_stop=self.interrupt_turn,
            grace_s=self.runner.terminate_grace_s,
        )
        if self.question is not None:
            # NB: the agent waits on its question; end the turn before the run ends with it,
            # bounded: the thread is saved either way, and the next run resumes it.
            with contextlib.suppress(TimeoutError, AgentRunError):
                await asyncio.wait_for(self.interrupt_turn(), timeout=self.runner.terminate_grace_s)
            raise AgentAsked(self.question)
        return self._finish_turn(ended, turn=turn)

    async def interrupt_turn(self) -> None:
        """``turn/interrupt`` the running turn and wait, bounded, for the server's answer (the
        caller then fails the run and closing the session ends the process group)."""
        if self.thread_id is None or self.turn_id is None or self.connection.closed.done():
            return
        params = {"threadId": self.thread_id, "turnId": self.turn_id}
        with contextlib.suppress(JsonRpcError, ConnectionClosed, TimeoutError, AgentRunError):
            await self._guard(
                self.connection.request("turn/interrupt", params, timeout_s=None),
                timeout_s=self._read_timeout_s,
            )

    def _finish_turn(self, ended: Mapping[str, Any], *, turn: int) -> Mapping[str, Any]:
        method = ended.get("__method__")
        turn_obj = ended.get("turn")
        turn_obj = turn_obj if isinstance(turn_obj, Mapping) else {}
        status = turn_obj.get("status")
        if method == "turn/failed":
            status = "failed"
        elif method == "turn/cancelled":
            status = "interrupted"
        error = turn_obj.get("error") or ended.get("error")
        detail = error.get("message") if isinstance(error, Mapping) else error
        if status == "completed" or status is None:
            self.turns_completed += 1
            self._emit(AgentUpdate(event="turn_completed", message=f"turn {turn} completed"))
            return turn_obj
        if status == "interrupted":
            raise AgentRunError(
                f"turn {turn} was interrupted{_detail(detail)}", code=ErrorCode.TURN_INTERRUPTED
            )
        raise AgentRunError(
            f"turn {turn} failed{_detail(detail or f'with status {status!r}')}",
            code=ErrorCode.TURN_FAILED,
        )

    async def _await_turn_end(self, turn_id: str) -> Mapping[str, Any]:
        timeout_s = self.settings.turn_timeout_ms / 1000
        while True:
            if self.question is not None:
                return {"__method__": "question"}
            ended = self._turn_ends.pop(turn_id, None) or self._turn_ends.pop(None, None)
            if ended is not None:
                return ended
            silence = self._loop.time() - self.connection.last_activity
            remaining = timeout_s - silence
            if remaining <= 0:
                raise AgentRunError(
                    f"turn timed out: no message from the agent for "
                    f"{self.settings.turn_timeout_ms} ms (agents.<kind>.turn_timeout_ms)",
                    code=ErrorCode.TURN_TIMEOUT,
                )
            self._turn_end_signal.clear()
            with contextlib.suppress(TimeoutError):
                await self._guard(self._turn_end_signal.wait(), timeout_s=remaining)

    # -- requests with timeouts, overload retries and failure racing -------------------

    @property
    def _read_timeout_s(self) -> float:
        return self.settings.read_timeout_ms / 1000

    def _needs_experimental_api(self) -> bool:
        policy = self.settings.approval_policy
        return bool(self.tool_specs) or (isinstance(policy, Mapping) and "granular" in policy)

    async def _call(
        self, method: str, params: Mapping[str, Any], *, stage: str, startup: bool = False
    ) -> Any:
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(_Overloaded),
            wait=tenacity.wait_random_exponential(
                multiplier=self.runner.overload_initial_delay_s,
                max=self.runner.overload_max_delay_s,
            ),
            stop=tenacity.stop_after_attempt(max(self.runner.overload_attempts, 1)),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._call_once(method, params, stage=stage, startup=startup)
        except _Overloaded as exc:
            raise AgentRunError(
                f"{method} was refused as overloaded {self.runner.overload_attempts} times "
                f"({exc.error.message}); the run is retried later",
                code=ErrorCode.AGENT_OVERLOADED,
            ) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def _call_once(
        self, method: str, params: Mapping[str, Any], *, stage: str, startup: bool = False
    ) -> Any:
        request = asyncio.ensure_future(self.connection.request(method, params, timeout_s=None))
        try:
            if startup:
                await asyncio.sleep(0)  # the request's first step writes it
                # NB: start-up (the login shell, the agent's own start) ends when the agent has
                # read the request; read_timeout_ms counts only from there.
                up = await self._guard(
                    self.process.wait_input_read(
                        timeout_s=self.settings.startup_timeout_ms / 1000, until=request
                    ),
                    timeout_s=None,
                )
                if not up:
                    raise AgentRunError(
                        f"the agent did not start reading its input within "
                        f"{self.settings.startup_timeout_ms} ms "
                        "(agents.<kind>.startup_timeout_ms); check that the command starts "
                        "`codex app-server` and how long its login shell takes",
                        code=ErrorCode.STARTUP_TIMEOUT,
                    )
            return await self._guard(request, timeout_s=self._read_timeout_s)
        except TimeoutError:
            raise AgentRunError(
                f"no response to {method} within {self.settings.read_timeout_ms} ms "
                "(agents.<kind>.read_timeout_ms)",
                code=ErrorCode.READ_TIMEOUT,
            ) from None
        except JsonRpcError as exc:
            if exc.code == SERVER_OVERLOADED:
                logger.info("agent overloaded; retrying", extra={"method": method})
                raise _Overloaded(method, exc) from exc
            code = ErrorCode.HANDSHAKE_FAILED if stage == "handshake" else ErrorCode.TURN_FAILED
            raise AgentRunError(
                f"{method} was rejected by the agent: {exc.message} (code {exc.code})", code=code
            ) from exc
        finally:
            if not request.done():
                request.cancel()

    async def _guard(self, awaitable: Awaitable[T], *, timeout_s: float | None) -> T:
        """Await ``awaitable``, but fail at once if the agent exits or a handler failed the run."""
        task = asyncio.ensure_future(awaitable)
        watchers: set[asyncio.Future[Any]] = {task, self._failure, self.connection.closed}
        try:
            done, _ = await asyncio.wait(
                watchers, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            task.cancel()
            raise
        if task in done:
            with contextlib.suppress(ConnectionClosed):
                return task.result()
            # The reader closed while this request was pending: report the exit below.
        else:
            task.cancel()
            # NB: how a cancelled task ended (cancelled or failing) is not ours to report.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._failure.done():
            self._failure.result()
        if self.connection.closed.done():
            raise await self._exit_error()
        raise TimeoutError

    async def _exit_error(self) -> AgentRunError:
        returncode: int | None
        try:
            returncode = await self.process.wait(timeout_s=2.0)
        except TimeoutError:
            returncode = None
        await self.process.stderr_drained(timeout_s=1.0)
        tail = self.process.stderr_tail(max_bytes=1000)
        status = "closed its output" if returncode is None else f"exited with status {returncode}"
        hint = " (command not found: check agents.<kind>.command)" if returncode == 127 else ""
        return AgentRunError(
            f"agent {status}{hint}: {tail or 'no stderr output'}", code=ErrorCode.AGENT_EXITED
        )

    def _fail(self, error: AgentRunError) -> None:
        if not self._failure.done():
            self._failure.set_exception(error)

    # -- inbound traffic --------------------------------------------------------------------

    def _on_notification(self, method: str, params: Mapping[str, Any], size: int) -> None:
        if method in TURN_END_NOTIFICATIONS:
            turn = params.get("turn")
            turn_id = turn.get("id") if isinstance(turn, Mapping) else params.get("turnId")
            self._turn_ends[turn_id if isinstance(turn_id, str) else None] = {
                **params,
                "__method__": method,
            }
            self._turn_end_signal.set()
            return
        if method == "thread/tokenUsage/updated":
            usage = token_usage_from(params)
            if usage is not None:
                cached = cached_input_tokens_from(params)
                self._emit(
                    AgentUpdate(
                        event="token_usage",
                        usage=usage,
                        message=f"{usage.total_tokens} tokens in this thread",
                        payload=None if cached is None else {"cached_input_tokens": cached},
                    )
                )
                return
        if method == "account/rateLimits/updated":
            limits = params.get("rateLimits")
            if isinstance(limits, Mapping):
                self._emit(
                    AgentUpdate(event="rate_limits", rate_limits=limits, message="rate limits")
                )
                return
        if method in INPUT_REQUIRED_NOTIFICATIONS or (
            method.startswith("turn/") and _signals_input_required(params)
        ):
            self._input_required(method, params)
            return
        self._emit(
            AgentUpdate(
                event="notification",
                message=summarize(method, params),
                payload={"method": method, "params": params}
                if size <= PAYLOAD_LIMIT_BYTES
                else {"method": method, "truncated": True, "bytes": size},
            )
        )

    def _on_garbage(self, line: bytes | None, reason: str) -> None:
        preview = "" if line is None else line[:120].decode("utf-8", errors="replace")
        self._emit(
            AgentUpdate(
                event="malformed",
                message=f"skipped line #{self.connection.garbage_lines} ({reason}) {preview}"[
                    :MESSAGE_LIMIT_CHARS
                ],
            )
        )

    def _input_required(self, method: str, params: Mapping[str, Any]) -> None:
        """The agent asked: keep the (first) question and end the turn waiting for it."""
        self._emit(AgentUpdate(event="turn_input_required", message=method))
        if self.question is not None:
            return
        texts, options = question_parts(params)
        if method in _APPROVALS:
            what = params.get("command") or params.get("reason") or params.get("grantRoot")
            texts = [f"May I go ahead ({method}): {_short(what) if what else 'see the thread'}?"]
            options = ["yes", "no"]
        self.question = question_of(
            texts=texts,
            options=options,
            session_id=self.thread_id,
            turn=max(self.turn, 1),
            source=method,
        )
        self._emit(
            AgentUpdate(
                event=QUESTION_EVENT,
                message=f"question: {self.question.text}"[:MESSAGE_LIMIT_CHARS],
                payload={"question": self.question.to_json()},
            )
        )
        self._turn_end_signal.set()

    async def _on_request(
        self, request_id: RequestId, method: str, params: Mapping[str, Any]
    ) -> Any:
        if self.settings.approvals is ApprovalMode.ASK and method in _APPROVALS:
            # NB: ``approvals: ask``: a person decides; the request becomes the question.
            self._input_required(method, params)
            if method == _PERMISSIONS_APPROVAL:
                return permissions_answer(ApprovalMode.DENY, params)
            if method in _LEGACY_APPROVALS:
                return legacy_decision_for(ApprovalMode.DENY)
            return decision_for(ApprovalMode.DENY, params)
        if method in (_COMMAND_APPROVAL, _FILE_APPROVAL):
            return self._decide(method, decision_for(self.settings.approvals, params))
        if method == _PERMISSIONS_APPROVAL:
            return self._decide(method, permissions_answer(self.settings.approvals, params))
        if method in _LEGACY_APPROVALS:
            return self._decide(method, legacy_decision_for(self.settings.approvals))
        if method in INPUT_REQUIRED_REQUESTS:
            self._input_required(method, params)
            if method == "mcpServer/elicitation/request":
                return {"action": "cancel"}
            raise JsonRpcError(
                -32000, "the question was sent to the issue tracker; the answer resumes this thread"
            )
        if method == _TOOL_CALL:
            return await self._call_tool(params)
        self._emit(AgentUpdate(event="unsupported_request", message=method))
        raise JsonRpcError(METHOD_NOT_FOUND, f"method not supported by Lorenz: {method}")

    def _decide(self, method: str, answer: dict[str, Any]) -> dict[str, Any]:
        self.decisions.append((method, answer))
        shown = answer.get("decision", "granted" if answer.get("permissions") else "denied")
        if isinstance(shown, Mapping):
            shown = next(iter(shown), "decision")
        approved = self.settings.approvals is ApprovalMode.ALLOW
        self._emit(
            AgentUpdate(
                event="approval_auto_approved" if approved else "approval_auto_denied",
                message=f"{method}: {shown}"[:MESSAGE_LIMIT_CHARS],
                payload={"method": method, "answer": answer},
            )
        )
        return answer

    async def _call_tool(self, params: Mapping[str, Any]) -> dict[str, Any]:
        raw_name = params.get("tool", params.get("name"))
        name = raw_name.strip() if isinstance(raw_name, str) else ""
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        tools = self.request.tools
        if tools is None or name not in self.tool_names:
            self._emit(AgentUpdate(event="unsupported_tool_call", message=f"tool {name or '?'}"))
            text = json.dumps(
                {
                    "error": {
                        "message": f"Unsupported dynamic tool: {name or '(no name)'}",
                        "supportedTools": self.tool_names,
                    }
                }
            )
            return _tool_result(success=False, text=text)
        try:
            outcome = await tools.call_tool(
                name, arguments if isinstance(arguments, Mapping) else {"input": arguments}
            )
        except Exception as exc:  # NB: the contract says never raise; a bug must not stall.
            logger.exception("tool handler raised", extra={"tool": name})
            outcome = {"success": False, "output": json.dumps({"error": {"message": str(exc)}})}
        success = bool(outcome.get("success"))
        output = outcome.get("output")
        text = output if isinstance(output, str) else json.dumps(outcome, default=str)
        self._emit(
            AgentUpdate(
                event="tool_call_completed" if success else "tool_call_failed",
                message=f"tool {name}",
            )
        )
        return _tool_result(success=success, text=text)

    def _emit(self, update: AgentUpdate) -> None:
        try:
            self.request.on_update(update)
        except Exception:
            logger.exception("on_update raised; update dropped", extra={"event": update.event})

    # -- shutdown -------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the app-server: close its stdin, then terminate its whole process group."""
        if self._closed:
            return
        self._closed = True
        try:
            # NB: end of input is the app-server's cue to shut down; SIGTERM follows at once
            # (terminate), so a server that ignores it costs nothing but the grace period.
            if self.process.returncode is None:
                # NB: a server that no longer reads stdin is terminated next anyway.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.process.close_stdin(), timeout=0.5)
        finally:
            await self.process.terminate(grace_s=self.runner.terminate_grace_s)
            await self.connection.aclose()
            if not self._failure.done():
                self._failure.cancel()
            if self.connection.closed.done() and not self.connection.closed.cancelled():
                self.connection.closed.exception()  # NB: mark retrieved, no "never retrieved".


# -- pure helpers (unit-tested directly) -------------------------------------------------


def decision_for(mode: ApprovalMode, params: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to a command or file-change approval under ``mode``.

    ``availableDecisions``, when the server lists them, wins: ``allow`` takes
    ``acceptForSession`` or else ``accept``; ``deny`` takes ``decline`` or else ``cancel``.
    """
    offered = params.get("availableDecisions")
    choices: Sequence[Any] = offered if isinstance(offered, list) and offered else ()
    preferences = (
        ("acceptForSession", "accept") if mode is ApprovalMode.ALLOW else ("decline", "cancel")
    )
    if choices:
        for wanted in preferences:
            if wanted in choices:
                return {"decision": wanted}
        if mode is ApprovalMode.DENY:
            # NB: nothing that says no was offered; refusing is still the only safe answer.
            return {"decision": "decline"}
        for choice in choices:
            if isinstance(choice, Mapping) and "acceptWithExecpolicyAmendment" in choice:
                return {"decision": choice}
    return {"decision": preferences[0]}


LEGACY_DENIAL_REASON: Final = "Lorenz declines approval requests (agents.<kind>.approvals: deny)"


def legacy_decision_for(mode: ApprovalMode) -> dict[str, Any]:
    """The answer to the v1 ``execCommandApproval`` / ``applyPatchApproval`` requests.

    NB: in the pinned protocol a denial is an object carrying the reason, not a bare string.
    """
    if mode is ApprovalMode.ALLOW:
        return {"decision": "approved_for_session"}
    return {"decision": {"denied": {"rejection": LEGACY_DENIAL_REASON}}}


def permissions_answer(mode: ApprovalMode, params: Mapping[str, Any]) -> dict[str, Any]:
    """``item/permissions/requestApproval``: grant all that was asked (``allow``) or nothing."""
    if mode is ApprovalMode.ALLOW:
        requested = params.get("permissions")
        granted = dict(requested) if isinstance(requested, Mapping) else {}
        return {"permissions": granted, "scope": "session"}
    return {"permissions": {}, "scope": "turn"}


_INPUT_TOKEN_KEYS = ("inputTokens", "input_tokens", "prompt_tokens", "promptTokens", "input")
_OUTPUT_TOKEN_KEYS = (
    "outputTokens",
    "output_tokens",
    "completion_tokens",
    "completionTokens",
    "output",
    "completion",
)
_TOTAL_TOKEN_KEYS = ("totalTokens", "total_tokens", "total")


def token_usage_from(params: Mapping[str, Any]) -> TokenUsage | None:
    """The cumulative thread total from ``thread/tokenUsage/updated`` (never ``last``)."""
    usage = params.get("tokenUsage")
    if not isinstance(usage, Mapping):
        return None
    total = usage.get("total")
    if not isinstance(total, Mapping):
        return None
    input_tokens = _first_count(total, _INPUT_TOKEN_KEYS)
    output_tokens = _first_count(total, _OUTPUT_TOKEN_KEYS)
    total_tokens = _first_count(total, _TOTAL_TOKEN_KEYS)
    if input_tokens is None and output_tokens is None and total_tokens is None:
        return None
    return TokenUsage(
        input_tokens=input_tokens or 0,
        output_tokens=output_tokens or 0,
        total_tokens=total_tokens
        if total_tokens is not None
        else (input_tokens or 0) + (output_tokens or 0),
    )


def cached_input_tokens_from(params: Mapping[str, Any]) -> int | None:
    """Of the thread's input tokens, those read from the prompt cache (for pricing)."""
    usage = params.get("tokenUsage")
    total = usage.get("total") if isinstance(usage, Mapping) else None
    if not isinstance(total, Mapping):
        return None
    return _first_count(total, ("cachedInputTokens", "cached_input_tokens"))


def _first_count(source: Mapping[str, Any], keys: Sequence[str]) -> int | None:
    for key in keys:
        value = source.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and value >= 0:
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value.strip())
    return None


def _signals_input_required(params: Mapping[str, Any]) -> bool:
    for key in ("requiresInput", "needsInput", "input_required", "inputRequired"):
        if params.get(key) is True:
            return True
    return params.get("type") in ("input_required", "needs_input")


def summarize(method: str, params: Mapping[str, Any]) -> str:
    """A one-line, human-readable summary of a notification for the dashboard."""
    text: str = method
    item = params.get("item")
    if isinstance(item, Mapping):
        kind = item.get("type", "item")
        what = item.get("command") or item.get("text") or item.get("tool") or ""
        phase = method.rsplit("/", 1)[-1]
        text = f"{kind} {phase}" + (f": {what}" if isinstance(what, str) and what else "")
    elif isinstance(params.get("delta"), str):
        text = f"{method}: {params['delta']}"
    elif isinstance(params.get("error"), Mapping):
        text = f"{method}: {params['error'].get('message', '')}"
    elif isinstance(params.get("message"), str):
        text = f"{method}: {params['message']}"
    return " ".join(text.split())[:MESSAGE_LIMIT_CHARS]


def _tool_result(*, success: bool, text: str) -> dict[str, Any]:
    return {"contentItems": [{"type": "inputText", "text": text}], "success": success}


def _detail(detail: Any) -> str:
    return f": {detail}" if detail else ""


def _short(value: Any) -> str:
    return json.dumps(value, default=str)[:200]
