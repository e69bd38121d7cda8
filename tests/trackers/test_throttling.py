"""Bounded rate-limit waits shared by the remote trackers."""

from __future__ import annotations

import pytest

from lorenz.trackers.throttling import (
    RateLimitExhausted,
    RateLimitHit,
    RateLimitPolicy,
    Throttle,
    parse_retry_after,
    seconds_until_epoch,
)

NOW = 1_800_000_000.0


def test_reset_headers_in_seconds_or_milliseconds() -> None:
    assert seconds_until_epoch(str(int(NOW) + 30), now=NOW) == 30
    assert seconds_until_epoch(str(int(NOW * 1000) + 1500), now=NOW) == pytest.approx(1.5)
    assert seconds_until_epoch(str(int(NOW) - 5), now=NOW) == 0
    assert seconds_until_epoch("soon", now=NOW) is None
    assert seconds_until_epoch(None, now=NOW) is None


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    assert parse_retry_after("7", now=NOW) == 7
    assert parse_retry_after("Fri, 15 Jan 2027 08:00:10 GMT", now=1_800_000_000.0) is not None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=NOW) == 0
    assert parse_retry_after("whenever", now=NOW) is None


class Script:
    """A request that is refused ``refusals`` times, then answers."""

    def __init__(self, refusals: int, *, delay_s: float | None) -> None:
        self.refusals = refusals
        self.delay_s = delay_s
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.refusals:
            raise RateLimitHit("refused", delay_s=self.delay_s)
        return "ok"


def throttle(sleeps: list[float], **policy: float) -> Throttle:
    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    return Throttle(policy=RateLimitPolicy(**policy), sleep=sleep)  # type: ignore[arg-type]


async def test_waits_what_the_server_asked_then_succeeds() -> None:
    sleeps: list[float] = []
    request = Script(2, delay_s=3.0)
    assert await throttle(sleeps, max_wait_s=5, jitter_s=0.5).run(request) == "ok"
    assert request.calls == 3
    assert len(sleeps) == 2
    assert all(3.0 <= s <= 3.5 for s in sleeps)


async def test_without_a_hint_the_waits_grow_but_never_pass_the_cap() -> None:
    sleeps: list[float] = []
    request = Script(4, delay_s=None)
    policy = dict(max_retries=4, max_wait_s=3.0, fallback_wait_s=1.0, jitter_s=0.0)
    assert await throttle(sleeps, **policy).run(request) == "ok"
    assert sleeps == [1.0, 2.0, 3.0, 3.0]


async def test_gives_up_after_max_retries_with_the_last_delay() -> None:
    sleeps: list[float] = []
    request = Script(10, delay_s=0.5)
    with pytest.raises(RateLimitExhausted) as err:
        await throttle(sleeps, max_retries=2, max_wait_s=1).run(request)
    assert request.calls == 3
    assert len(sleeps) == 2
    assert err.value.retry_after_ms == 500
    assert err.value.attempts == 3


async def test_a_delay_beyond_the_cap_fails_at_once_and_blocks_the_next_call() -> None:
    sleeps: list[float] = []
    gate = throttle(sleeps, max_wait_s=10)
    request = Script(1, delay_s=600.0)
    with pytest.raises(RateLimitExhausted) as err:
        await gate.run(request)
    assert request.calls == 1
    assert sleeps == []
    assert err.value.retry_after_ms == 600_000
    with pytest.raises(RateLimitExhausted):
        await gate.run(request)
    assert request.calls == 1  # refused without asking the server again


async def test_a_short_spent_budget_is_waited_out_before_the_request() -> None:
    sleeps: list[float] = []
    gate = throttle(sleeps, max_wait_s=10)
    gate.budget_spent(delay_s=2.0, reason="spent")
    request = Script(0, delay_s=None)
    assert await gate.run(request) == "ok"
    assert len(sleeps) == 1
    assert 1.9 < sleeps[0] <= 2.0
    assert await gate.run(request) == "ok"
    assert len(sleeps) == 1  # waited once, not on every call


async def test_other_errors_pass_through_untouched() -> None:
    sleeps: list[float] = []

    async def broken() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await throttle(sleeps).run(broken)
    assert sleeps == []
