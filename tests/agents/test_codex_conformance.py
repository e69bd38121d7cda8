"""Conformance with the real Codex app-server (the pinned binary of ``openai-codex-cli-bin``).

(a) The binary generates the JSON schema of its own protocol; every message our client sends
    in the fake-agent scenarios is validated against it (and, the other way round, everything
    the fake sends, so the fake stays faithful).
(b) Our client runs the real ``initialize`` / ``initialized`` / ``thread/start`` handshake
    against the real binary, offline (``CODEX_HOME`` in a temp dir; no login needed for that).
(c) Our runner drives the real binary through whole turns — continuation, a dynamic tool
    call, a model error — with a fake OpenAI Responses API on 127.0.0.1 as its model provider.

The binary comes from the optional test extra ``conformance``. Without it these tests FAIL (a
missing install must not look green); they skip only if the binary cannot execute here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aiohttp import web

from lorenz.agents.base import AgentRunError, AgentRunRequest
from lorenz.agents.codex import CodexAppServerRunner, CodexSession
from lorenz.agents.processes import spawn_agent
from lorenz.config import ApprovalMode
from lorenz.model import TokenUsage
from tests.agents.conftest import FakeCodexFactory, RunKit, StaticTools

INSTALL_HINT = (
    "the Codex conformance tests need the pinned Codex binary: install the test extra with "
    "`.venv/bin/pip install -e '.[test,conformance]'` (package openai-codex-cli-bin)"
)

RESPONSE_SCHEMAS = {
    "item/commandExecution/requestApproval": "CommandExecutionRequestApprovalResponse",
    "item/fileChange/requestApproval": "FileChangeRequestApprovalResponse",
    "item/permissions/requestApproval": "PermissionsRequestApprovalResponse",
    "item/tool/call": "DynamicToolCallResponse",
    "item/tool/requestUserInput": "ToolRequestUserInputResponse",
    "mcpServer/elicitation/request": "McpServerElicitationRequestResponse",
    "execCommandApproval": "ExecCommandApprovalResponse",
    "applyPatchApproval": "ApplyPatchApprovalResponse",
}


def codex_binary() -> Path:
    try:
        import codex_cli_bin  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        pytest.fail(INSTALL_HINT)
    path = Path(codex_cli_bin.bundled_codex_path())
    try:
        probe = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as exc:  # e.g. a binary for another architecture
        pytest.skip(f"the pinned Codex binary cannot execute on this machine: {exc}")
    if probe.returncode != 0:
        pytest.skip(f"`codex --version` failed here ({probe.returncode}): {probe.stderr[-300:]}")
    return path


@dataclasses.dataclass(frozen=True)
class Schemas:
    folder: Path

    def load(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.folder / f"{name}.json").read_text())
        return data

    def variant(self, union: str, method: str) -> dict[str, Any]:
        """The member of a ``oneOf`` union (ClientRequest, ServerNotification, ...) for method."""
        root = self.load(union)
        for member in root["oneOf"]:
            if method in member["properties"]["method"].get("enum", ()):
                return {"definitions": root.get("definitions", {}), **member}
        raise AssertionError(f"{method!r} is not a method of {union} in this Codex version")

    def validate(self, instance: Any, schema: Mapping[str, Any], *, what: str) -> None:
        try:
            jsonschema.Draft7Validator(schema).validate(instance)
        except jsonschema.ValidationError as exc:
            raise AssertionError(
                f"{what} does not match the Codex schema: {exc.message}\n"
                f"{json.dumps(instance)[:800]}"
            ) from exc


def generate(binary: Path, out: Path, *, experimental: bool) -> Schemas:
    args = [str(binary), "app-server", "generate-json-schema", "--out", str(out)]
    if experimental:
        args.append("--experimental")
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"generate-json-schema failed: {done.stderr[-500:]}"
    return Schemas(out)


@pytest.fixture(scope="module")
def binary() -> Path:
    return codex_binary()


@pytest.fixture(scope="module")
def schemas(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Schemas:
    # NB: we send experimental fields (dynamicTools) when tools are offered, so the client is
    # held to the experimental schema; the stable one is checked separately below.
    return generate(binary, tmp_path_factory.mktemp("codex-schema-x"), experimental=True)


@pytest.fixture(scope="module")
def stable_schemas(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Schemas:
    return generate(binary, tmp_path_factory.mktemp("codex-schema"), experimental=False)


SCENARIOS: list[tuple[str, dict[str, Any]]] = [
    ("normal", {}),
    ("multi_turn", {"max_turns": 3}),
    ("approvals", {}),
    ("approvals", {"approvals": ApprovalMode.ALLOW}),
    ("tool_call", {"tools": True}),
    ("tool_call", {}),
    ("token_usage", {}),
    ("garbage", {}),
    ("overload", {}),
    ("failed", {}),
    ("user_input", {}),
    (
        "normal",
        {
            "approval_policy": "never",
            "thread_sandbox": "workspace-write",
            "turn_sandbox_policy": {"type": "workspaceWrite", "networkAccess": False},
        },
    ),
    (
        "normal",
        {
            "approval_policy": {
                "granular": {"sandbox_approval": True, "rules": True, "mcp_elicitations": False}
            }
        },
    ),
]


_RECORDINGS: list[list[dict[str, Any]]] = []


async def run_scenarios(kit: RunKit, fake_codex: FakeCodexFactory) -> list[list[dict[str, Any]]]:
    """Run every scenario once per module; the fake's record of each (received and sent)."""
    if not _RECORDINGS:
        _RECORDINGS.extend(await _record_scenarios(kit, fake_codex))
    return _RECORDINGS


async def _record_scenarios(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> list[list[dict[str, Any]]]:
    runner = CodexAppServerRunner(overload_initial_delay_s=0.01, overload_max_delay_s=0.02)
    recordings: list[list[dict[str, Any]]] = []
    for name, options in SCENARIOS:
        options = dict(options)
        tools = StaticTools() if options.pop("tools", False) else None
        max_turns = options.pop("max_turns", 1)
        script = fake_codex(name, record_sent=True)
        request = kit.request(command=script.command, tools=tools, max_turns=max_turns, **options)
        code = await _run_for_code(runner, request)
        assert code in (None, "turn_failed", "input_required"), (name, code)
        assert script.violations() == [], (name, script.violations())
        recordings.append(script.records())
    return recordings


async def _run_for_code(runner: CodexAppServerRunner, request: AgentRunRequest) -> str | None:
    try:
        await runner.run(request)
    except AgentRunError as exc:
        return exc.code
    return None


async def test_every_message_the_client_sends_matches_the_codex_schema(
    kit: RunKit, fake_codex: FakeCodexFactory, schemas: Schemas
) -> None:
    envelope = schemas.load("JSONRPCMessage")
    checked: dict[str, int] = {}
    for records in await run_scenarios(kit, fake_codex):
        asked = {
            r["sent"]["id"]: r["sent"]["method"]
            for r in records
            if "sent" in r and "method" in r["sent"] and "id" in r["sent"]
        }
        for record in records:
            if "received" not in record:
                continue
            message = record["received"]
            schemas.validate(message, envelope, what="the JSON-RPC envelope")
            if "method" in message and "id" in message:
                schema = schemas.variant("ClientRequest", message["method"])
                kind = f"request {message['method']}"
            elif "method" in message:
                schema = schemas.variant("ClientNotification", message["method"])
                kind = f"notification {message['method']}"
            elif "error" in message:
                schema = schemas.load("JSONRPCError")
                kind = "error reply"
            else:
                method = asked[message["id"]]
                schema = schemas.load(RESPONSE_SCHEMAS[method])
                message = message["result"]
                kind = f"answer to {method}"
            schemas.validate(message, schema, what=kind)
            checked[kind] = checked.get(kind, 0) + 1
    # Every kind of message the client can send was exercised at least once.
    for kind in (
        "request initialize",
        "notification initialized",
        "request thread/start",
        "request turn/start",
        "error reply",
        "answer to item/commandExecution/requestApproval",
        "answer to item/fileChange/requestApproval",
        "answer to item/permissions/requestApproval",
        "answer to item/tool/call",
        "answer to execCommandApproval",
    ):
        assert checked.get(kind), f"no {kind} was checked: {sorted(checked)}"


async def test_without_tools_the_client_stays_within_the_stable_schema(
    kit: RunKit, fake_codex: FakeCodexFactory, stable_schemas: Schemas
) -> None:
    script = fake_codex("normal")
    await CodexAppServerRunner().run(kit.request(command=script.command))
    validated: list[str] = []
    for message in script.received():
        if "method" in message and "id" in message:
            schema = stable_schemas.variant("ClientRequest", message["method"])
        elif "method" in message:
            schema = stable_schemas.variant("ClientNotification", message["method"])
        else:
            continue
        stable_schemas.validate(message, schema, what=message["method"])
        validated.append(message["method"])
    # The whole conversation was held to the stable schema, not an empty record.
    assert {"initialize", "initialized", "thread/start", "turn/start"} <= set(validated), validated


async def test_the_fake_agent_speaks_the_real_protocol(
    kit: RunKit, fake_codex: FakeCodexFactory, schemas: Schemas
) -> None:
    seen: set[str] = set()
    for records in await run_scenarios(kit, fake_codex):
        for record in records:
            message = record.get("sent")
            if message is None or "method" not in message:
                continue
            method = message["method"]
            if method == "turn/failed":
                continue  # a legacy spelling some servers used; the fake sends it on purpose
            union = "ServerRequest" if "id" in message else "ServerNotification"
            schemas.validate(message, schemas.variant(union, method), what=f"fake {method}")
            seen.add(method)
    assert {"turn/completed", "item/tool/call", "thread/tokenUsage/updated"} <= seen


def codex_env(home: Path) -> dict[str, str]:
    (home / "codex").mkdir(parents=True, exist_ok=True)
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "CODEX_HOME": str(home / "codex"),
        "LANG": "C.UTF-8",
        "RUST_LOG": "error",
    }


async def real_handshake(
    kit: RunKit, binary: Path, tmp_path: Path, *, tools: StaticTools | None = None
) -> tuple[CodexSession, str, Mapping[str, Any]]:
    env = codex_env(tmp_path / "home")
    request = kit.request(
        command=f"{binary} app-server", env=env, tools=tools, read_timeout_ms=60_000
    )
    process = await spawn_agent(command=request.settings.command, cwd=request.workspace, env=env)
    session = CodexSession(request, process, runner=CodexAppServerRunner())
    try:
        info = await session.initialize()
        thread_id = await session.start_thread()
    except BaseException:
        await session.close()
        raise
    return session, thread_id, info


async def test_the_real_app_server_accepts_our_handshake(
    kit: RunKit, binary: Path, tmp_path: Path
) -> None:
    session, thread_id, info = await real_handshake(kit, binary, tmp_path)
    try:
        assert thread_id
        assert isinstance(info.get("userAgent"), str)
        assert session.thread_id == thread_id
        assert session.connection.garbage_lines == 0
    finally:
        await session.close()
    assert session.process.returncode is not None


async def test_the_real_app_server_accepts_our_dynamic_tools(
    kit: RunKit, binary: Path, tmp_path: Path
) -> None:
    session, thread_id, _ = await real_handshake(kit, binary, tmp_path, tools=StaticTools())
    try:
        assert thread_id
    finally:
        await session.close()


async def test_the_real_app_server_accepts_configured_policies(
    kit: RunKit, workspace: Path, binary: Path, tmp_path: Path
) -> None:
    env = codex_env(tmp_path / "home")
    request = kit.request(
        command=f"{binary} app-server",
        env=env,
        approval_policy="never",
        thread_sandbox="workspace-write",
        read_timeout_ms=60_000,
    )
    process = await spawn_agent(command=request.settings.command, cwd=workspace, env=env)
    session = CodexSession(request, process, runner=CodexAppServerRunner())
    try:
        await asyncio.wait_for(session.initialize(), 60)
        assert await asyncio.wait_for(session.start_thread(), 60)
    finally:
        await session.close()


# -- (c) whole turns: the real binary, a fake model provider on loopback ----------------------


@dataclasses.dataclass
class FakeResponsesApi:
    """A minimal OpenAI Responses API (``POST /v1/responses``, SSE) for the real binary.

    Codex accepts custom model providers (``model_providers.<id>.base_url``), so the pinned
    binary can run whole turns offline against this: each request gets a scripted reply.
    """

    mode: str = "message"
    """``message`` (one assistant message), ``tool`` (call linear_graphql first) or ``fail``."""
    requests: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    port: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.mode == "fail":
            error = {"message": "the fake model refuses", "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=400)
        answered = any(i.get("type") == "function_call_output" for i in body.get("input", []))
        n = len(self.requests)
        if self.mode == "tool" and not answered:
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc-{n}",
                "name": "linear_graphql",
                "arguments": json.dumps({"query": "query { viewer { id } }"}),
                "call_id": f"call-{n}",
            }
        else:
            item = {
                "type": "message",
                "role": "assistant",
                "id": f"msg-{n}",
                "content": [{"type": "output_text", "text": f"reply {n} from the fake model"}],
            }
        usage = {
            "input_tokens": 40,
            "input_tokens_details": None,
            "output_tokens": 8,
            "output_tokens_details": None,
            "total_tokens": 48,
        }
        events = [
            {"type": "response.created", "response": {"id": f"resp-{n}"}},
            {"type": "response.output_item.done", "item": item},
            {"type": "response.completed", "response": {"id": f"resp-{n}", "usage": usage}},
        ]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        await response.write_eof()
        return response

    def texts(self, index: int) -> str:
        """All text of request ``index`` (what the model was shown)."""
        return json.dumps(self.requests[index].get("input", []))


@pytest.fixture
async def model_api() -> AsyncIterator[FakeResponsesApi]:
    api = FakeResponsesApi()
    app = web.Application()
    app.router.add_post("/v1/responses", api.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    api.port = server.sockets[0].getsockname()[1]
    try:
        yield api
    finally:
        await runner.cleanup()


def provider_env(home: Path, api: FakeResponsesApi) -> dict[str, str]:
    env = codex_env(home)
    (Path(env["CODEX_HOME"]) / "config.toml").write_text(
        'model = "fake-model"\n'
        'model_provider = "fake"\n'
        "[model_providers.fake]\n"
        'name = "fake"\n'
        f'base_url = "http://127.0.0.1:{api.port}/v1"\n'
        'wire_api = "responses"\n'
    )
    return env


def real_request(kit: RunKit, binary: Path, env: dict[str, str], **options: Any) -> AgentRunRequest:
    return kit.request(
        command=f"{binary} app-server",
        env=env,
        read_timeout_ms=60_000,
        turn_timeout_ms=60_000,
        **options,
    )


async def test_the_real_app_server_runs_a_whole_turn(
    kit: RunKit, binary: Path, tmp_path: Path, model_api: FakeResponsesApi
) -> None:
    env = provider_env(tmp_path / "home", model_api)
    result = await CodexAppServerRunner().run(real_request(kit, binary, env))
    assert result.turns == 1
    assert result.stop_reason == "max_turns"
    assert "Fix the bug described in ABC-1." in model_api.texts(0)
    messages = [u.message or "" for u in kit.recorder.of("notification")]
    assert any("agentMessage completed: reply 1 from the fake model" in m for m in messages)
    assert [u.usage for u in kit.recorder.of("token_usage")] == [TokenUsage(40, 8, 48)]
    assert kit.recorder.of("malformed") == []


async def test_the_real_app_server_continues_on_the_same_thread(
    kit: RunKit, binary: Path, tmp_path: Path, model_api: FakeResponsesApi
) -> None:
    env = provider_env(tmp_path / "home", model_api)
    result = await CodexAppServerRunner().run(real_request(kit, binary, env, max_turns=2))
    assert result.turns == 2
    threads = {(u.payload or {}).get("thread_id") for u in kit.recorder.of("session_started")}
    assert len(threads) == 1
    assert "Continue: turn 2 of 2." in model_api.texts(1)
    assert "reply 1 from the fake model" in model_api.texts(1)  # the thread's history
    # The real server reports cumulative thread totals; they are passed on, not summed.
    totals = [u.usage.total_tokens for u in kit.recorder.of("token_usage") if u.usage]
    assert totals == [48, 96]


async def test_the_real_app_server_calls_our_dynamic_tool(
    kit: RunKit, binary: Path, tmp_path: Path, model_api: FakeResponsesApi
) -> None:
    model_api.mode = "tool"
    tools = StaticTools()
    env = provider_env(tmp_path / "home", model_api)
    result = await CodexAppServerRunner().run(real_request(kit, binary, env, tools=tools))
    assert result.turns == 1
    assert tools.calls == [("linear_graphql", {"query": "query { viewer { id } }"})]
    outputs = [i for i in model_api.requests[1]["input"] if i.get("type") == "function_call_output"]
    assert outputs[0]["call_id"] == "call-1"
    assert "user-1" in json.dumps(outputs[0]["output"])
    assert "tool_call_completed" in kit.recorder.events()


async def test_a_model_error_from_the_real_app_server_fails_the_turn(
    kit: RunKit, binary: Path, tmp_path: Path, model_api: FakeResponsesApi
) -> None:
    model_api.mode = "fail"
    env = provider_env(tmp_path / "home", model_api)
    with pytest.raises(AgentRunError) as caught:
        await CodexAppServerRunner().run(real_request(kit, binary, env))
    assert caught.value.code == "turn_failed"
    assert "the fake model refuses" in caught.value.message
