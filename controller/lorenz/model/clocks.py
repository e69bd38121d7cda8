"""Injected time, so the scheduling core is exact in tests without sleeping.

Two clocks matter: a monotonic one for deadlines inside one process (retry due times, stall
detection, reservation expiry), and the wall clock for anything that must survive a restart or
be shown to a person (a persisted retry's due time, a run's start).
"""

from __future__ import annotations

import datetime
import time
from typing import Protocol


def utc_now() -> datetime.datetime:
    """The wall clock now, timezone-aware UTC (for code that has no injected :class:`Clock`)."""
    return datetime.datetime.now(datetime.UTC)


def as_utc(value: datetime.datetime) -> datetime.datetime:
    """``value`` with UTC assumed when it carries no timezone (a naive stored or parsed time)."""
    return value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)


def iso_or_none(value: datetime.datetime | None) -> str | None:
    """``value`` in ISO 8601, or ``None``: the form snapshots and stored rows keep times in."""
    return value.isoformat() if value is not None else None


class Clock(Protocol):
    """The two time sources the core reads."""

    def monotonic_ms(self) -> float:
        """Milliseconds on a clock that never goes backwards; only differences mean anything."""
        ...

    def now(self) -> datetime.datetime:
        """The current wall-clock time, timezone-aware UTC."""
        ...


class SystemClock:
    """The real clocks of this process."""

    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000.0

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)


class ManualClock:
    """A clock that moves only when told to: both readings advance together."""

    def __init__(
        self,
        *,
        monotonic_ms: float = 1_000_000.0,
        wall: datetime.datetime | None = None,
    ) -> None:
        self._monotonic_ms = monotonic_ms
        self._wall = wall or datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

    def monotonic_ms(self) -> float:
        return self._monotonic_ms

    def now(self) -> datetime.datetime:
        return self._wall

    def advance(self, ms: float) -> None:
        """Move both clocks forward by ``ms`` milliseconds."""
        if ms < 0:
            raise ValueError("a clock cannot go backwards")
        self._monotonic_ms += ms
        self._wall += datetime.timedelta(milliseconds=ms)
