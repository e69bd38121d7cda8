"""The HTTP client of one remote tracker instance, built on first use and closed with it.

Every remote tracker (Linear, GitHub, GitLab, Jira) either borrows a client its caller shares
(never closed by the tracker) or opens one of its own on the first request, and refuses every
request once it was closed, so that a reload never talks through a retired instance. That
life is the same for all of them, so it lives here once.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from lorenz.codes import ErrorCode
from lorenz.trackers.base import TrackerError


class TrackerConnection:
    """A tracker's httpx client: the shared one it was given, or its own, made when asked."""

    def __init__(
        self,
        *,
        shared: httpx.AsyncClient | None,
        tracker: str,
        timeout_ms: float,
        headers: Mapping[str, str],
    ) -> None:
        self._client = shared
        self._owned = shared is None
        """Whether :meth:`close` closes the client (one it made, not one it was given)."""
        self._tracker = tracker
        """The tracker's name as users know it, for the closed error (``GitHub``)."""
        self._timeout_ms = timeout_ms
        self._headers = dict(headers)
        self._closed = False

    def client(self) -> httpx.AsyncClient:
        """The client to send with; ``tracker_closed`` after :meth:`close`."""
        if self._closed:
            raise TrackerError(
                f"this {self._tracker} tracker was closed; build a new one from the settings",
                code=ErrorCode.TRACKER_CLOSED,
            )
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self._timeout_ms / 1000.0), headers=self._headers
            )
        return self._client

    async def close(self) -> None:
        """Refuse further requests; close the client if it is this tracker's own."""
        self._closed = True
        if self._client is not None and self._owned:
            await self._client.aclose()
        self._client = None
