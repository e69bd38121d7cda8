"""Flags and features: the one way to choose backends and opt into the daemon.

Some settings are not workflow policy but a choice of how *this process* runs (which claim store,
whether to be a long-lived daemon). They live in the flag-only sections of the schema
(``claim_store``, ``daemon``) and are set only as flags, from four sources, highest first:

1. the command line: ``--flag claim_store.backend=sqlite``, ``--feature durable_claims``;
2. WORKFLOW.md front matter: ``flags: {claim_store.backend: sqlite}``, ``features: [daemon]``;
3. the environment: ``LORENZ_FLAG_CLAIM_STORE__BACKEND=sqlite`` (dots become ``__``),
   ``LORENZ_FEATURE_DAEMON=1`` (``1/true/yes/on`` or ``0/false/no/off``);
4. the schema default.

A feature is a named bundle of flag values. It applies at the precedence of the source that
enabled it, and an explicit flag at the same source beats it: ``--feature durable_claims`` with
``--flag claim_store.backend=turso`` gives turso, while front matter ``flags:
{claim_store.backend: turso}`` with ``--feature durable_claims`` gives sqlite (the CLI is
higher). Only the environment can switch a feature *off* (``LORENZ_FEATURE_X=0``), and off just
means "implies nothing".

The known flags are derived from the schema (every field of every flag-only section), so adding a
field there adds a flag. Every resolved value keeps its source, for ``lorenz config``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from lorenz.config import FLAG_ONLY_SECTIONS, ClaimStoreBackend
from lorenz.workflow.errors import (
    ConfigProblem,
    InvalidFeatureValue,
    InvalidFlagSyntax,
    InvalidWorkflowConfig,
    UnknownFeature,
    UnknownFlag,
)
from lorenz.workflow.schema import SettingsField, leaf_fields

ENV_FLAG_PREFIX = "LORENZ_FLAG_"
ENV_FEATURE_PREFIX = "LORENZ_FEATURE_"
TRUTHY = frozenset({"1", "true", "yes", "on"})
FALSY = frozenset({"0", "false", "no", "off"})


class FlagSource(enum.StrEnum):
    """Where a flag or feature value came from, highest precedence first."""

    CLI = "cli"
    FRONT_MATTER = "front-matter"
    ENV = "env"
    DEFAULT = "default"


_LEVELS: tuple[FlagSource, ...] = (FlagSource.CLI, FlagSource.FRONT_MATTER, FlagSource.ENV)


@dataclasses.dataclass(frozen=True, slots=True)
class FlagValue:
    """The effective value of one flag or feature, and its provenance."""

    value: Any
    source: FlagSource
    via: str | None = None
    """How the source set it when not directly: ``feature durable_claims``, or the env variable
    or CLI spelling it was read from."""

    def describe_source(self) -> str:
        return f"{self.source.value} ({self.via})" if self.via else self.source.value


@dataclasses.dataclass(frozen=True, slots=True)
class Feature:
    """A named, opt-in bundle of flag values."""

    name: str
    description: str
    implies: Mapping[str, Any]
    """Flag key → value applied while the feature is on."""


FEATURES: Mapping[str, Feature] = {
    feature.name: feature
    for feature in (
        Feature(
            name="durable_claims",
            description="Keep claims in a durable store: selects claim_store.backend=sqlite.",
            implies={"claim_store.backend": ClaimStoreBackend.SQLITE.value},
        ),
        Feature(
            name="daemon",
            description="Run as the long-lived daemon (leadership lease): daemon.enabled=true.",
            implies={"daemon.enabled": True},
        ),
    )
}
"""Every known feature; all are off by default."""


def _flag_fields() -> dict[str, SettingsField]:
    return {
        field.key_path: field
        for field in leaf_fields()
        if field.key_path.split(".", 1)[0] in FLAG_ONLY_SECTIONS
    }


FLAG_FIELDS: Mapping[str, SettingsField] = _flag_fields()
"""Every known flag key (``claim_store.backend``, ...) → its schema field."""
KNOWN_FLAGS: tuple[str, ...] = tuple(FLAG_FIELDS)
KNOWN_FEATURES: tuple[str, ...] = tuple(FEATURES)

for _feature in FEATURES.values():
    for _key in _feature.implies:
        assert _key in FLAG_FIELDS, f"feature {_feature.name} implies unknown flag {_key}"


def env_flag_name(key: str) -> str:
    """``claim_store.backend`` → ``LORENZ_FLAG_CLAIM_STORE__BACKEND``."""
    return ENV_FLAG_PREFIX + key.replace(".", "__").upper()


def env_feature_name(name: str) -> str:
    """``durable_claims`` → ``LORENZ_FEATURE_DURABLE_CLAIMS``."""
    return ENV_FEATURE_PREFIX + name.upper()


def parse_flag_assignment(text: str) -> tuple[str, str]:
    """``key=value`` → ``(key, value)``; the value may itself contain ``=``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InvalidFlagSyntax(
            f"--flag {text!r} must be key=value, e.g. --flag claim_store.backend=sqlite",
            key_path=f"--flag {text}",
        )
    return key, value


@dataclasses.dataclass(frozen=True, slots=True)
class FlagResolution:
    """Every known flag and feature with its effective value and source."""

    flags: Mapping[str, FlagValue]
    features: Mapping[str, FlagValue]

    def section_values(self) -> dict[str, dict[str, Any]]:
        """The non-default flag values grouped by section, as input for the schema."""
        sections: dict[str, dict[str, Any]] = {}
        for key, flag in self.flags.items():
            if flag.source is FlagSource.DEFAULT:
                continue
            section, _, name = key.partition(".")
            sections.setdefault(section, {})[name] = flag.value
        return sections

    def with_values(self, values: Mapping[str, Any]) -> FlagResolution:
        """A copy whose flag values are replaced by ``values`` (the typed, validated ones)."""
        flags = {
            key: dataclasses.replace(flag, value=values[key]) if key in values else flag
            for key, flag in self.flags.items()
        }
        return FlagResolution(flags=flags, features=self.features)


def resolve_flags(
    *,
    cli_flags: Mapping[str, Any],
    cli_features: Sequence[str],
    front_matter_flags: Any,
    front_matter_features: Any,
    environ: Mapping[str, str],
) -> FlagResolution:
    """Merge the four sources by precedence; unknown names and malformed values are errors."""
    explicit: dict[FlagSource, dict[str, tuple[Any, str | None]]] = {
        FlagSource.CLI: {key: (value, None) for key, value in cli_flags.items()},
        FlagSource.FRONT_MATTER: {
            key: (value, None) for key, value in _front_matter_flags(front_matter_flags).items()
        },
        FlagSource.ENV: _env_flags(environ),
    }
    unknown_flags = [
        _flag_spelling(level, key, via)
        for level, values in explicit.items()
        for key, (_, via) in values.items()
        if key not in FLAG_FIELDS
    ]
    if unknown_flags:
        raise UnknownFlag(
            f"unknown flag {', '.join(unknown_flags)}; known flags: {', '.join(KNOWN_FLAGS)}",
            key_path=unknown_flags[0],
        )

    switches: dict[FlagSource, dict[str, tuple[bool, str | None]]] = {
        FlagSource.CLI: {name.strip(): (True, None) for name in cli_features},
        FlagSource.FRONT_MATTER: {
            name: (True, None) for name in _front_matter_features(front_matter_features)
        },
        FlagSource.ENV: _env_features(environ),
    }
    unknown_features = [
        _feature_spelling(level, name, via)
        for level, values in switches.items()
        for name, (_, via) in values.items()
        if name not in FEATURES
    ]
    if unknown_features:
        raise UnknownFeature(
            f"unknown feature {', '.join(unknown_features)}; known features: "
            f"{', '.join(KNOWN_FEATURES)}",
            key_path=unknown_features[0],
        )

    features: dict[str, FlagValue] = {}
    for name in FEATURES:
        features[name] = FlagValue(value=False, source=FlagSource.DEFAULT)
        for level in _LEVELS:
            if name in switches[level]:
                enabled, via = switches[level][name]
                features[name] = FlagValue(value=enabled, source=level, via=via)
                break

    flags: dict[str, FlagValue] = {}
    for key, field in FLAG_FIELDS.items():
        flags[key] = FlagValue(
            value=field.info.get_default(call_default_factory=True), source=FlagSource.DEFAULT
        )
        for level in _LEVELS:
            if key in explicit[level]:
                value, via = explicit[level][key]
                flags[key] = FlagValue(value=value, source=level, via=via)
                break
            implied = _implied_at(level, key, features)
            if implied is not None:
                flags[key] = implied
                break
    return FlagResolution(flags=flags, features=features)


def _implied_at(level: FlagSource, key: str, features: Mapping[str, FlagValue]) -> FlagValue | None:
    for name, state in features.items():
        feature = FEATURES[name]
        if state.value and state.source is level and key in feature.implies:
            return FlagValue(value=feature.implies[key], source=level, via=f"feature {name}")
    return None


def _front_matter_flags(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidWorkflowConfig(
            [
                ConfigProblem(
                    "flags",
                    "must be a map of flag keys to values, e.g. {claim_store.backend: sqlite}",
                )
            ]
        )
    flat: dict[str, Any] = {}

    def flatten(prefix: str, mapping: Mapping[Any, Any]) -> None:
        for raw_key, item in mapping.items():
            key = f"{prefix}{raw_key}"
            if isinstance(item, Mapping):
                flatten(f"{key}.", item)
            elif item is not None:  # NB: `key: null` means "not set" (as everywhere else)
                flat[key] = item

    flatten("", value)
    return flat


def _front_matter_features(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidWorkflowConfig(
            [ConfigProblem("features", "must be a YAML list of feature names, e.g. [daemon]")]
        )
    problems = [
        ConfigProblem(f"features.{index}", "must be a feature name (a string)")
        for index, item in enumerate(value)
        if not isinstance(item, str)
    ]
    if problems:
        raise InvalidWorkflowConfig(problems)
    return [item.strip() for item in value]


def _env_flags(environ: Mapping[str, str]) -> dict[str, tuple[Any, str | None]]:
    out: dict[str, tuple[Any, str | None]] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_FLAG_PREFIX) or not value.strip():
            continue  # NB: an empty variable is treated as unset
        key = name[len(ENV_FLAG_PREFIX) :].lower().replace("__", ".")
        out[key] = (value, name)
    return out


def _env_features(environ: Mapping[str, str]) -> dict[str, tuple[bool, str | None]]:
    out: dict[str, tuple[bool, str | None]] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_FEATURE_PREFIX):
            continue
        text = value.strip().lower()
        if not text:
            continue
        feature = name[len(ENV_FEATURE_PREFIX) :].lower()
        if text in TRUTHY:
            out[feature] = (True, name)
        elif text in FALSY:
            out[feature] = (False, name)
        else:
            raise InvalidFeatureValue(
                f"{name}={value!r} is not a switch; use 1/true/yes/on or 0/false/no/off",
                key_path=name,
            )
    return out


def _flag_spelling(level: FlagSource, key: str, via: str | None) -> str:
    if level is FlagSource.CLI:
        return f"--flag {key}"
    if level is FlagSource.FRONT_MATTER:
        return f"flags.{key}"
    return via or env_flag_name(key)


def _feature_spelling(level: FlagSource, name: str, via: str | None) -> str:
    if level is FlagSource.CLI:
        return f"--feature {name}"
    if level is FlagSource.FRONT_MATTER:
        return f"features: {name}"
    return via or env_feature_name(name)
