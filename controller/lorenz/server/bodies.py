"""Request bodies, read within bounds: size (the app's ``client_max_size``) and nesting depth.

A JSON document nested a few thousand levels deep is a few kilobytes, and ``json.loads`` meets
it with ``RecursionError`` — an exception no handler expects, which used to surface as a 500.
So a body's nesting is measured before it is parsed (strings are blanked out first, so
brackets inside them do not count), and anything deeper than :data:`MAX_BODY_DEPTH` is refused
with ``request_body_too_deep`` without ever reaching the parser.
"""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from lorenz.server.errors import INVALID_REQUEST_BODY, REQUEST_BODY_TOO_DEEP, ApiError

MAX_BODY_BYTES = 64 * 1024
"""``client_max_size`` of the app: larger bodies are refused with 413 ``request_rejected``."""
MAX_BODY_DEPTH = 32
"""Deepest nesting of arrays and objects a JSON body may have."""

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting_depth(text: str, *, stop_above: int | None = None) -> int:
    """How deeply arrays and objects nest in ``text`` (brackets inside strings do not count).

    With ``stop_above``, counting stops at the first bracket deeper than that (a bomb is
    refused after ``stop_above + 1`` brackets, not after all of them).
    """
    depth = deepest = 0
    for match in _BRACKETS.finditer(_JSON_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if stop_above is not None and deepest > stop_above:
                break
        else:
            depth = max(depth - 1, 0)
    return deepest


def parse_json_body(raw: bytes, *, route: str, max_depth: int = MAX_BODY_DEPTH) -> Any:
    """The JSON value of ``raw``; coded 400s for text that is not UTF-8 JSON or nests too deep."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid(route, "the body is not UTF-8") from None
    if nesting_depth(text, stop_above=max_depth) > max_depth:
        raise ApiError(
            f"the body of {route} nests deeper than {max_depth} levels; send a flatter document",
            code=REQUEST_BODY_TOO_DEEP,
            status=400,
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        # NB: RecursionError cannot happen below the depth limit; kept so a future limit raise
        # never turns back into a 500.
        raise _invalid(route, "the body is not JSON") from None


async def read_empty_object(request: web.Request) -> None:
    """Accept an empty body or ``{}`` (what refresh and stop take); refuse anything else."""
    route = f"{request.method} {request.path}"
    raw = await request.read()
    if not raw.strip():
        return
    if parse_json_body(raw, route=route) != {}:
        raise _invalid(route, "it takes an empty body or {}")


def _invalid(route: str, why: str) -> ApiError:
    return ApiError(
        f"{route} refused its body: {why}; send nothing or {{}}",
        code=INVALID_REQUEST_BODY,
        status=400,
    )
