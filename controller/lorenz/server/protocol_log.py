"""Requests the HTTP parser refuses, logged as one short warning now and then, never a traceback.

aiohttp answers a request it cannot parse — a 100 KB request line, an oversized header
(``max_line_size`` / ``max_field_size``, 8190 bytes each), broken framing — with a 400 and
logs the parser's exception with its traceback at ERROR on ``aiohttp.server``
(``RequestHandler.handle_error``), or — for a body whose chunking or Content-Encoding is
broken — as an "Unhandled exception" once the handler returned. Anyone who can connect
could fill the log with those, and the exception's message quotes the offending bytes.

:class:`ProtocolErrorLog` is the logger the server hands to its request handlers instead
(the ``logger`` argument of :class:`aiohttp.web.AppRunner`). Parser errors become one WARNING
line naming the error class and the peer — not the bytes — at most once per
:data:`WARNING_INTERVAL_S`, and the next line says how many were left out. Everything else
goes to ``aiohttp.server`` unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

WARNING_INTERVAL_S = 60.0
"""At most one malformed-request warning per this many seconds (per server)."""

logger = logging.getLogger("lorenz.server")


class ProtocolErrorLog(logging.LoggerAdapter[logging.Logger]):
    """``aiohttp.server`` with parser errors rate-limited into one-line warnings."""

    def __init__(
        self,
        *,
        interval_s: float = WARNING_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        warnings_to: logging.Logger = logger,
    ) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self._interval_s = interval_s
        self._clock = clock
        self._warnings_to = warnings_to
        self._next_warning_at: float | None = None
        self._left_out = 0

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        error = _protocol_error(kwargs.get("exc_info"))
        # NB: aiohttp logs non-HTTP traffic (BadHttpMethod on a first request) at DEBUG on
        # purpose; only what it would log as an error is turned into the warning.
        if error is not None and level >= logging.WARNING:
            self._refused(error, peer=args[0] if args else None)
            return
        super().log(level, msg, *args, **kwargs)

    def _refused(self, error: HttpProcessingError, *, peer: object) -> None:
        now = self._clock()
        if self._next_warning_at is not None and now < self._next_warning_at:
            self._left_out += 1
            return
        self._next_warning_at = now + self._interval_s
        left_out, self._left_out = self._left_out, 0
        self._warnings_to.warning(
            "malformed HTTP request refused error=%s status=%s peer=%s left_out=%d "
            "(at most one such line per %gs)",
            type(error).__name__,
            error.code or 400,
            peer,
            left_out,
            self._interval_s,
        )


def _protocol_error(error: object) -> HttpProcessingError | None:
    """The parser error ``error`` is or was caused by (a body whose gzip is broken surfaces as
    ``RequestPayloadError`` from ``ContentEncodingError``), else ``None``."""
    seen = 0
    while isinstance(error, BaseException) and seen < 5:
        if isinstance(error, HttpProcessingError):
            return error
        error = error.__cause__
        seen += 1
    return None
