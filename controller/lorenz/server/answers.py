"""``POST /api/v1/issues/<identifier>/answer``: a person answers a waiting agent's question.

Authenticated like every state-changing route (the request guard: Host, same origin, JSON, the
bearer token over TCP; the unix socket's file mode otherwise), so ``lorenz answer`` and the
dashboard's answer box use it as they use refresh. The body is ``{"text": "..."}`` (plus
``"source": "cli"`` or ``"dashboard"`` from those two, for the ``input_answered`` event); the answer
goes to every waiting slot of the issue (:meth:`lorenz.runtime.LorenzRuntime.answer`), whose
next run resumes the agent's session with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from lorenz.codes import ErrorCode
from lorenz.runtime import LorenzRuntime
from lorenz.runtime.questions import AnswerRefused
from lorenz.server.bodies import parse_json_body
from lorenz.server.errors import INVALID_REQUEST_BODY, ORCHESTRATOR_UNAVAILABLE, ApiError
from lorenz.workflow.errors import TemplateRenderError

ANSWER_PATH = "/api/v1/issues/{identifier:.+}/answer"

_SOURCES = frozenset({"cli", "dashboard", "api"})
"""What ``source`` may say (``api`` when absent)."""


def answer_routes(runtime: LorenzRuntime) -> list[web.RouteDef]:
    """The answer route, bound to ``runtime``."""
    return [web.post(ANSWER_PATH, answer_handler(lambda request: runtime))]


def answer_handler(
    runtime_of: Callable[[web.Request], LorenzRuntime],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The answer route's handler, for the runtime ``runtime_of`` picks for a request (the
    operator serves one per Workflow it leads; ``runtime_of`` raises the API error if none)."""

    async def post_answer(request: web.Request) -> web.StreamResponse:
        identifier = request.match_info["identifier"]
        route = f"{request.method} {request.path}"
        body = parse_json_body(await request.read(), route=route)
        source = body.get("source", "api") if isinstance(body, Mapping) else None
        if (
            not isinstance(body, Mapping)
            or "text" not in body
            or not set(body) <= {"text", "source"}
            or source not in _SOURCES
        ):
            raise ApiError(
                f'{route} takes {{"text": "<the answer>"}} (and an optional "source": '
                '"cli" | "dashboard" | "api") and nothing else',
                code=INVALID_REQUEST_BODY,
                status=400,
            )
        runtime = runtime_of(request)
        if runtime.stopped:
            raise ApiError(
                "the runtime has stopped and takes no more requests; restart lorenz to resume",
                code=ORCHESTRATOR_UNAVAILABLE,
                status=503,
            )
        try:
            receipt = await runtime.answer(identifier, text=body["text"], source=str(source))
        except AnswerRefused as exc:
            status = 400 if exc.code == ErrorCode.ANSWER_INVALID else 404
            raise ApiError(exc.message, code=exc.code, status=status) from None
        except TemplateRenderError as exc:
            raise ApiError(exc.message, code=exc.code, status=422) from None
        return web.json_response(receipt.to_dict(), status=202)

    return post_answer
