"""Typed ``tracker.provider`` options, one model per tracker kind.

The shared config schema passes ``tracker.provider`` through unchanged, because only the adapter
knows its keys. The adapter still validates them strictly, so a typo (``page_sise``) is an error
naming its key path rather than a silently ignored setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import pydantic
from pydantic import Field

from lorenz.codes import ErrorCode
from lorenz.trackers.base import TrackerError
from lorenz.trackers.throttling import RateLimitPolicy


class ProviderOptions(pydantic.BaseModel):
    """Base of every tracker's ``tracker.provider`` model: strict, a docstring per field.

    NB: the field docstrings are for readers only. Nothing prints these models' descriptions
    (errors name the key; docs/trackers.md documents the keys), so pydantic is not asked to
    harvest them (``use_attribute_docstrings`` re-tokenized each class's source at import:
    ~30 ms of every start-up for the three models here). Validation builds at first use.
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    timeout_ms: Annotated[int, Field(gt=0)] = 30000
    """Network timeout of one request."""

    rate_limit_retries: Annotated[int, Field(ge=0, le=10)] = 2
    """Retries of one request after a rate-limit refusal."""

    rate_limit_max_wait_ms: Annotated[int, Field(ge=0, le=600000)] = 10000
    """Longest single rate-limit wait; a longer reset fails the request at once (the next tick
    tries again)."""

    def rate_limit_policy(self) -> RateLimitPolicy:
        max_wait_s = self.rate_limit_max_wait_ms / 1000.0
        return RateLimitPolicy(
            max_retries=self.rate_limit_retries,
            max_wait_s=max_wait_s,
            fallback_wait_s=min(1.0, max_wait_s),
            jitter_s=min(0.25, max_wait_s / 10),
        )


OptionsT = TypeVar("OptionsT", bound=ProviderOptions)


def parse_provider_options(
    model: type[OptionsT], provider: Mapping[str, Any], *, kind: str
) -> OptionsT:
    """Validate ``tracker.provider`` for ``kind``; an invalid key or value is
    ``invalid_tracker_config`` naming the key."""
    try:
        return model.model_validate(dict(provider))
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise TrackerError(
            f"{error['msg']} (for tracker kind {kind}); fix or remove this key",
            code=ErrorCode.INVALID_TRACKER_CONFIG,
            key_path=f"tracker.provider.{where}" if where else "tracker.provider",
        ) from None
