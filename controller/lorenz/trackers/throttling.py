"""Bounded waiting when a tracker says "too many requests".

Linear and GitHub both tell a client when its budget is spent (a status, an error code, reset
headers). Lorenz polls on a cadence, so the right answer is rarely "sleep until the reset": a
tick that waits an hour blocks reconciliation and shutdown. The rule here: wait for a short,
known delay (at most ``max_wait_s`` per wait, at most ``max_retries`` times), and otherwise
fail at once with the server's delay attached, so the runtime skips this tick and tries later.

Retrying and its waits are tenacity's; this module only supplies the tracker-specific parts:
reading the hint the server gave, and refusing to wait longer than the policy allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import tenacity
import tenacity.wait

T = TypeVar("T")

Sleep = Callable[[float], Awaitable[None]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RateLimitPolicy:
    """How long one request may wait out rate limits."""

    max_retries: int = 2
    """Retries of one request after a rate-limit refusal (0 = fail on the first refusal)."""
    max_wait_s: float = 10.0
    """Longest single wait; a server asking for more fails the request at once."""
    fallback_wait_s: float = 1.0
    """First wait when the server gave no delay; doubles per retry (capped by max_wait_s)."""
    jitter_s: float = 0.25
    """Random extra wait, so several clients do not retry in lockstep."""


class RateLimitHit(Exception):
    """The server refused one request for rate limiting (internal signal)."""

    def __init__(self, detail: str, *, delay_s: float | None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.delay_s = delay_s
        """How long the server asked us to wait, when it said."""


class RateLimitExhausted(Exception):
    """Waiting did not help (or would take too long); the adapter turns it into its coded error."""

    def __init__(self, detail: str, *, delay_s: float | None, attempts: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.delay_s = delay_s
        self.attempts = attempts

    @property
    def retry_after_ms(self) -> int | None:
        return None if self.delay_s is None else max(0, round(self.delay_s * 1000))


def seconds_until_epoch(value: str | None, *, now: float) -> float | None:
    """A reset header (UTC epoch seconds, or milliseconds when > 1e12) as seconds from now."""
    if value is None:
        return None
    try:
        epoch = float(value.strip())
    except ValueError:
        return None
    # NB: Linear documents seconds but has been seen sending milliseconds; accept both.
    if epoch > 1e12:
        epoch /= 1000.0
    return max(0.0, epoch - now)


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """``Retry-After``: delta seconds or an HTTP date."""
    if value is None:
        return None
    text = value.strip()
    with contextlib.suppress(ValueError):  # not delta seconds: try an HTTP date
        return max(0.0, float(text))
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - now)


class _HintedWait(tenacity.wait.wait_base):
    """Wait what the server asked for; without a hint, exponential from the fallback."""

    def __init__(self, policy: RateLimitPolicy) -> None:
        self._policy = policy
        self._fallback = tenacity.wait_exponential(
            multiplier=policy.fallback_wait_s, max=policy.max_wait_s
        )
        self._jitter = tenacity.wait_random(0, policy.jitter_s)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        hit = outcome.exception() if outcome is not None else None
        hinted = hit.delay_s if isinstance(hit, RateLimitHit) else None
        base = hinted if hinted is not None else self._fallback(retry_state)
        return min(self._policy.max_wait_s, base + self._jitter(retry_state))


class Throttle:
    """Runs requests under a :class:`RateLimitPolicy`; remembers a spent budget between calls."""

    def __init__(
        self,
        *,
        policy: RateLimitPolicy,
        sleep: Sleep = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._sleep = sleep
        self._monotonic = monotonic
        self._blocked_until: float | None = None
        self._blocked_reason = ""

    def budget_spent(self, *, delay_s: float, reason: str) -> None:
        """The last response said the budget is used up for ``delay_s`` more seconds: the next
        request waits (bounded) instead of being refused."""
        until = self._monotonic() + delay_s
        if self._blocked_until is None or until > self._blocked_until:
            self._blocked_until = until
            self._blocked_reason = reason

    async def run(self, request: Callable[[], Awaitable[T]]) -> T:
        """``request()``, retried after :class:`RateLimitHit` within the policy; raises
        :class:`RateLimitExhausted` when the policy gives up."""
        policy = self.policy
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(self._worth_waiting),
            stop=tenacity.stop_after_attempt(policy.max_retries + 1),
            wait=_HintedWait(policy),
            sleep=self._sleep,
            reraise=True,
        )
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    await self._wait_for_budget(attempts=attempts)
                    return await request()
        except RateLimitHit as hit:
            if hit.delay_s:
                # The next call waits (or fails fast) without spending a request on a refusal.
                self.budget_spent(delay_s=hit.delay_s, reason=hit.detail)
            raise RateLimitExhausted(hit.detail, delay_s=hit.delay_s, attempts=attempts) from hit
        raise AssertionError("tenacity ended without an outcome")  # pragma: no cover

    def _worth_waiting(self, exc: BaseException) -> bool:
        if not isinstance(exc, RateLimitHit):
            return False
        return exc.delay_s is None or exc.delay_s <= self.policy.max_wait_s

    async def _wait_for_budget(self, *, attempts: int) -> None:
        if self._blocked_until is None:
            return
        remaining = self._blocked_until - self._monotonic()
        if remaining <= 0:
            self._blocked_until = None
            return
        if remaining > self.policy.max_wait_s:
            # NB: not a RateLimitHit: waiting again cannot help within this call.
            raise RateLimitExhausted(
                f"{self._blocked_reason}; budget resets in {remaining:.1f}s",
                delay_s=remaining,
                attempts=attempts - 1,
            )
        await self._sleep(remaining)
        self._blocked_until = None
