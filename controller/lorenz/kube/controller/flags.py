"""The small events a Workflow's controller and its status publisher wake each other with."""

from __future__ import annotations

import asyncio
from typing import Any


class Flag(asyncio.Event):
    """An :class:`asyncio.Event` without the waiter deque it allocates up front.

    NB: a replica has a controller for every Workflow it leads, each with five events that
    are nearly always waited on by nobody or one or two tasks; the deque (a 64-slot block) was
    ~0.6 KiB each, 3 KiB per Workflow. A list does the same job here.
    """

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[asyncio.Future[Any]] = []  # type: ignore[assignment]
