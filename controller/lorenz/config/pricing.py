"""Model prices: the shipped default table and the checks every price table passes.

Dollar caps (``budget.max_usd_*``) need a price for the tokens an agent reports. Prices change
more often than code, so the defaults are data (``prices.yaml`` next to this module, loaded with
:mod:`importlib.resources`), and WORKFLOW.md's ``pricing`` section overrides single models. Both
go through :func:`parse_price_table`, so a malformed table is refused the same way wherever it
comes from: with the code ``pricing_invalid`` and the key at fault.

Lookup (:meth:`PriceTable.price_for`): the workflow's own entries first, then the defaults; in
each, the first glob (:func:`fnmatch.fnmatchcase`, case-insensitive on the model name) that
matches wins, so a table lists specific names before family globs.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import importlib.resources
import math
from collections.abc import Mapping
from typing import Any

from lorenz.codes import ErrorCode

PRICING_INVALID = ErrorCode.PRICING_INVALID
"""The code of a price table (``pricing`` in WORKFLOW.md, or the shipped data) that is malformed."""
MODEL_UNPRICED = ErrorCode.MODEL_UNPRICED
"""The code of the warning for a model without a price while a dollar cap is set."""

MAX_PRICE_ENTRIES = 1000
"""A price table with more entries than this is refused (it is outside input: bounded)."""
MAX_PATTERN_CHARS = 200
MAX_USD_PER_MILLION = 100_000.0
"""No model costs this much per million tokens; a larger figure is a typo (cents for dollars)."""

PRICE_KINDS: tuple[str, ...] = ("input", "cached_input", "output")
DEFAULT_TABLE_RESOURCE = "prices.yaml"


class PricingInvalid(ValueError):
    """A price table is malformed; ``key_path`` names the entry at fault."""

    code = PRICING_INVALID

    def __init__(self, message: str, *, key_path: str) -> None:
        super().__init__(message)
        self.message = message
        self.key_path = key_path

    def __str__(self) -> str:
        return f"{self.code} [{self.key_path}]: {self.message}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelPrice:
    """USD per million tokens of one model."""

    input: float
    """A prompt token read fresh (Claude: cache writes too)."""
    cached_input: float
    """A prompt token read from the provider's prompt cache."""
    output: float
    """A generated token (reasoning tokens included)."""

    def to_dict(self) -> dict[str, float]:
        return {"input": self.input, "cached_input": self.cached_input, "output": self.output}


def _price(value: Any, *, key_path: str) -> float:
    # NB: YAML gives bools for yes/no; a price of True must not become $1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PricingInvalid(
            f"must be a number of USD per million tokens, got {value!r}", key_path=key_path
        )
    number = float(value)
    if not math.isfinite(number) or number < 0 or number > MAX_USD_PER_MILLION:
        raise PricingInvalid(
            f"must be between 0 and {MAX_USD_PER_MILLION:g} USD per million tokens, got {value!r}",
            key_path=key_path,
        )
    return number


def parse_model_price(value: Any, *, key_path: str) -> ModelPrice:
    """One ``{input, cached_input?, output}`` entry; raise :class:`PricingInvalid` if malformed."""
    if isinstance(value, ModelPrice):
        return value
    if not isinstance(value, Mapping):
        raise PricingInvalid(
            "must be a map {input: ..., cached_input: ..., output: ...} of USD per million tokens",
            key_path=key_path,
        )
    unknown = sorted(str(key) for key in value if key not in PRICE_KINDS)
    if unknown:
        raise PricingInvalid(
            f"unknown price kind(s) {', '.join(unknown)}; use input, cached_input and output",
            key_path=key_path,
        )
    for needed in ("input", "output"):
        if needed not in value:
            raise PricingInvalid(f"{needed} is missing; give its price", key_path=key_path)
    prompt = _price(value["input"], key_path=f"{key_path}.input")
    cached = value.get("cached_input")
    return ModelPrice(
        input=prompt,
        cached_input=prompt
        if cached is None
        else _price(cached, key_path=f"{key_path}.cached_input"),
        output=_price(value["output"], key_path=f"{key_path}.output"),
    )


def parse_price_table(raw: Any, *, where: str) -> tuple[tuple[str, ModelPrice], ...]:
    """``{glob: price}`` in order, validated; ``where`` prefixes key paths (``pricing``)."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise PricingInvalid("must be a map of model name globs to prices", key_path=where)
    if len(raw) > MAX_PRICE_ENTRIES:
        raise PricingInvalid(
            f"has {len(raw)} entries, more than {MAX_PRICE_ENTRIES}", key_path=where
        )
    entries: list[tuple[str, ModelPrice]] = []
    for pattern, value in raw.items():
        if not isinstance(pattern, str) or not pattern.strip() or len(pattern) > MAX_PATTERN_CHARS:
            raise PricingInvalid(
                f"model name glob {pattern!r} must be a non-empty string of at most "
                f"{MAX_PATTERN_CHARS} characters",
                key_path=where,
            )
        entries.append(
            (pattern.strip(), parse_model_price(value, key_path=f"{where}.{pattern.strip()}"))
        )
    return tuple(entries)


def match_price(
    entries: tuple[tuple[str, ModelPrice], ...], model: str
) -> tuple[str, ModelPrice] | None:
    """The first ``(glob, price)`` whose glob matches ``model`` (case-insensitive)."""
    name = model.strip().lower()
    for pattern, price in entries:
        if fnmatch.fnmatchcase(name, pattern.lower()):
            return pattern, price
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class DefaultPrices:
    """The shipped table and the date its prices were checked."""

    checked: str
    entries: tuple[tuple[str, ModelPrice], ...]


def parse_default_prices(text: str, *, source: str = DEFAULT_TABLE_RESOURCE) -> DefaultPrices:
    """Parse the shipped table's YAML (``checked`` and ``models``)."""
    # NB: imported here, at the first price asked for: the settings import this module, and
    # the launcher and every worker (which never price) should not hold yaml (issue #35).
    import yaml

    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PricingInvalid(f"is not valid YAML: {exc}", key_path=source) from None
    if not isinstance(document, Mapping) or not isinstance(document.get("checked"), str):
        raise PricingInvalid(
            "must be a map with checked (a date) and models (the price table)", key_path=source
        )
    return DefaultPrices(
        checked=document["checked"],
        entries=parse_price_table(document.get("models"), where=f"{source}:models"),
    )


@functools.cache
def default_prices() -> DefaultPrices:
    """The shipped price table (read once per process)."""
    text = (
        importlib.resources.files("lorenz.config")
        .joinpath(DEFAULT_TABLE_RESOURCE)
        .read_text(encoding="utf-8")
    )
    return parse_default_prices(text)


@dataclasses.dataclass(frozen=True, slots=True)
class PriceTable:
    """The workflow's ``pricing`` entries over the shipped defaults."""

    workflow: tuple[tuple[str, ModelPrice], ...] = ()
    defaults: tuple[tuple[str, ModelPrice], ...] = ()

    @classmethod
    def with_defaults(cls, workflow: Mapping[str, ModelPrice]) -> PriceTable:
        return cls(workflow=tuple(workflow.items()), defaults=default_prices().entries)

    def price_for(self, model: str | None) -> ModelPrice | None:
        """The price of ``model`` (``None``: unknown model, or no price for it)."""
        if not model:
            return None
        found = match_price(self.workflow, model) or match_price(self.defaults, model)
        return found[1] if found is not None else None
