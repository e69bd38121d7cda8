"""Flags and features: sources, precedence, the feature rule, env parsing, provenance, errors."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from lorenz.config import ClaimStoreBackend
from lorenz.workflow import (
    FEATURES,
    KNOWN_FEATURES,
    KNOWN_FLAGS,
    FlagSource,
    InvalidFeatureValue,
    InvalidFlagSyntax,
    InvalidWorkflowConfig,
    ResolvedSettings,
    UnknownFeature,
    UnknownFlag,
    env_feature_name,
    env_flag_name,
    load_workflow,
    parse_flag_assignment,
    settings_from_mapping,
)
from tests.workflow.conftest import WriteWorkflow


def _resolve(
    *,
    cli: Mapping[str, str] | None = None,
    cli_features: Sequence[str] = (),
    front_matter: Mapping[str, Any] | None = None,
    features: Any = None,
    env: Mapping[str, str] | None = None,
) -> ResolvedSettings:
    data: dict[str, Any] = {}
    if front_matter is not None:
        data["flags"] = dict(front_matter)
    if features is not None:
        data["features"] = features
    return settings_from_mapping(
        data,
        base_dir=Path("/w"),
        cli_flags=cli or {},
        cli_features=cli_features,
        environ=env or {},
    )


# -- the known set is derived from the schema --------------------------------------------------


def test_known_flags_are_every_field_of_the_flag_only_sections() -> None:
    assert set(KNOWN_FLAGS) == {
        "claim_store.backend",
        "claim_store.path",
        "claim_store.owner_stale_ms",
        "claim_store.recovery_interval_ms",
        "daemon.enabled",
        "daemon.heartbeat_ms",
        "daemon.stale_ms",
    }
    assert KNOWN_FEATURES == ("durable_claims", "daemon")


def test_env_names() -> None:
    assert env_flag_name("claim_store.backend") == "LORENZ_FLAG_CLAIM_STORE__BACKEND"
    assert env_flag_name("daemon.stale_ms") == "LORENZ_FLAG_DAEMON__STALE_MS"
    assert env_feature_name("durable_claims") == "LORENZ_FEATURE_DURABLE_CLAIMS"


# -- each source on its own --------------------------------------------------------------------


def test_defaults_when_nothing_is_set() -> None:
    resolved = _resolve()
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.MEMORY
    assert resolved.settings.daemon.enabled is False
    for key in KNOWN_FLAGS:
        assert resolved.flag_sources[key].source is FlagSource.DEFAULT
    for name in KNOWN_FEATURES:
        assert resolved.feature_sources[name].value is False
        assert resolved.feature_sources[name].source is FlagSource.DEFAULT
    assert resolved.flag_sources["daemon.heartbeat_ms"].value == 5000


def test_cli_flag() -> None:
    resolved = _resolve(cli={"claim_store.backend": "turso", "daemon.stale_ms": "45000"})
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.TURSO
    assert resolved.settings.daemon.stale_ms == 45000
    flag = resolved.flag_sources["daemon.stale_ms"]
    assert (flag.value, flag.source) == (45000, FlagSource.CLI)  # typed, not the string


def test_front_matter_flags_dotted_and_nested() -> None:
    resolved = _resolve(
        front_matter={"claim_store.backend": "sqlite", "daemon": {"heartbeat_ms": 1000}}
    )
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.SQLITE
    assert resolved.settings.daemon.heartbeat_ms == 1000
    assert resolved.flag_sources["daemon.heartbeat_ms"].source is FlagSource.FRONT_MATTER


def test_env_flags() -> None:
    resolved = _resolve(
        env={"LORENZ_FLAG_CLAIM_STORE__BACKEND": "sqlite", "LORENZ_FLAG_DAEMON__ENABLED": "true"}
    )
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.SQLITE
    assert resolved.settings.daemon.enabled is True
    flag = resolved.flag_sources["claim_store.backend"]
    assert flag.source is FlagSource.ENV
    assert flag.via == "LORENZ_FLAG_CLAIM_STORE__BACKEND"
    assert flag.describe_source() == "env (LORENZ_FLAG_CLAIM_STORE__BACKEND)"


def test_empty_env_flag_counts_as_unset() -> None:
    resolved = _resolve(env={"LORENZ_FLAG_CLAIM_STORE__BACKEND": ""})
    assert resolved.flag_sources["claim_store.backend"].source is FlagSource.DEFAULT


def test_null_front_matter_flag_counts_as_unset() -> None:
    resolved = _resolve(front_matter={"claim_store.backend": None})
    assert resolved.flag_sources["claim_store.backend"].source is FlagSource.DEFAULT


# -- precedence: every pair of sources ---------------------------------------------------------

_VALUE_BY_SOURCE = {
    FlagSource.CLI: "turso",
    FlagSource.FRONT_MATTER: "sqlite",
    FlagSource.ENV: "memory",
}
_ORDER = [FlagSource.CLI, FlagSource.FRONT_MATTER, FlagSource.ENV, FlagSource.DEFAULT]


@pytest.mark.parametrize(
    "sources",
    [
        combo
        for size in (1, 2, 3)
        for combo in itertools.combinations(
            [FlagSource.CLI, FlagSource.FRONT_MATTER, FlagSource.ENV], size
        )
    ],
    ids=lambda combo: "+".join(s.value for s in combo),
)
def test_flag_precedence_cli_over_front_matter_over_env_over_default(
    sources: tuple[FlagSource, ...],
) -> None:
    key = "claim_store.backend"
    resolved = _resolve(
        cli={key: _VALUE_BY_SOURCE[FlagSource.CLI]} if FlagSource.CLI in sources else None,
        front_matter=(
            {key: _VALUE_BY_SOURCE[FlagSource.FRONT_MATTER]}
            if FlagSource.FRONT_MATTER in sources
            else None
        ),
        env=(
            {env_flag_name(key): _VALUE_BY_SOURCE[FlagSource.ENV]}
            if FlagSource.ENV in sources
            else None
        ),
    )
    winner = min(sources, key=_ORDER.index)
    assert resolved.flag_sources[key].source is winner
    assert resolved.settings.claim_store.backend == _VALUE_BY_SOURCE[winner]


def test_each_source_beats_the_default_value_of_a_differently_typed_flag() -> None:
    key = "claim_store.owner_stale_ms"
    assert _resolve(cli={key: "7"}).settings.claim_store.owner_stale_ms == 7
    assert _resolve(front_matter={key: 7}).settings.claim_store.owner_stale_ms == 7
    assert _resolve(env={env_flag_name(key): "7"}).settings.claim_store.owner_stale_ms == 7


# -- features ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "source"),
    [
        ({"cli_features": ["durable_claims"]}, FlagSource.CLI),
        ({"features": ["durable_claims"]}, FlagSource.FRONT_MATTER),
        ({"env": {"LORENZ_FEATURE_DURABLE_CLAIMS": "1"}}, FlagSource.ENV),
    ],
)
def test_durable_claims_selects_sqlite_from_any_source(
    kwargs: dict[str, Any], source: FlagSource
) -> None:
    resolved = _resolve(**kwargs)
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.SQLITE
    flag = resolved.flag_sources["claim_store.backend"]
    assert flag.source is source
    assert flag.via == "feature durable_claims"
    assert resolved.feature_sources["durable_claims"].value is True
    assert resolved.feature_sources["durable_claims"].source is source


def test_daemon_feature_enables_the_daemon() -> None:
    resolved = _resolve(cli_features=["daemon"])
    assert resolved.settings.daemon.enabled is True
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.MEMORY


def test_an_explicit_flag_at_the_same_source_beats_the_feature() -> None:
    resolved = _resolve(cli={"claim_store.backend": "turso"}, cli_features=["durable_claims"])
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.TURSO
    resolved = _resolve(front_matter={"claim_store.backend": "turso"}, features=["durable_claims"])
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.TURSO


def test_a_feature_from_a_higher_source_beats_a_lower_explicit_flag() -> None:
    resolved = _resolve(
        front_matter={"claim_store.backend": "turso"}, cli_features=["durable_claims"]
    )
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.SQLITE
    resolved = _resolve(
        env={"LORENZ_FLAG_CLAIM_STORE__BACKEND": "turso"}, features=["durable_claims"]
    )
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.SQLITE


def test_a_higher_explicit_flag_beats_a_lower_feature() -> None:
    resolved = _resolve(
        front_matter={"claim_store.backend": "memory"},
        env={"LORENZ_FEATURE_DURABLE_CLAIMS": "yes"},
    )
    assert resolved.settings.claim_store.backend is ClaimStoreBackend.MEMORY
    assert resolved.flag_sources["claim_store.backend"].source is FlagSource.FRONT_MATTER
    assert resolved.feature_sources["durable_claims"].value is True  # on, but outranked


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "yes", "On", " on "])
def test_env_feature_truthy_values(text: str) -> None:
    resolved = _resolve(env={"LORENZ_FEATURE_DAEMON": text})
    assert resolved.settings.daemon.enabled is True


@pytest.mark.parametrize("text", ["0", "false", "No", "OFF"])
def test_env_feature_falsy_values_turn_it_off(text: str) -> None:
    resolved = _resolve(env={"LORENZ_FEATURE_DAEMON": text})
    assert resolved.settings.daemon.enabled is False
    feature = resolved.feature_sources["daemon"]
    assert (feature.value, feature.source) == (False, FlagSource.ENV)


def test_env_feature_off_is_outranked_by_front_matter_and_cli() -> None:
    off = {"LORENZ_FEATURE_DAEMON": "0"}
    assert _resolve(env=off, features=["daemon"]).settings.daemon.enabled is True
    assert _resolve(env=off, cli_features=["daemon"]).settings.daemon.enabled is True


def test_env_feature_with_a_bad_value_is_an_error() -> None:
    with pytest.raises(InvalidFeatureValue) as caught:
        _resolve(env={"LORENZ_FEATURE_DAEMON": "maybe"})
    assert caught.value.code == "invalid_feature_value"
    assert caught.value.key_path == "LORENZ_FEATURE_DAEMON"
    assert "1/true/yes/on" in caught.value.message


def test_empty_env_feature_counts_as_unset() -> None:
    resolved = _resolve(env={"LORENZ_FEATURE_DAEMON": ""})
    assert resolved.feature_sources["daemon"].source is FlagSource.DEFAULT


def test_every_feature_implies_known_flags() -> None:
    for feature in FEATURES.values():
        assert set(feature.implies) <= set(KNOWN_FLAGS)


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "spelling"),
    [
        ({"cli": {"claim_store.bakend": "x"}}, "--flag claim_store.bakend"),
        ({"front_matter": {"server.port": 1}}, "flags.server.port"),
        ({"env": {"LORENZ_FLAG_NOPE": "1"}}, "LORENZ_FLAG_NOPE"),
    ],
)
def test_unknown_flag_lists_the_known_ones(kwargs: dict[str, Any], spelling: str) -> None:
    with pytest.raises(UnknownFlag) as caught:
        _resolve(**kwargs)
    exc = caught.value
    assert exc.code == "unknown_flag"
    assert exc.key_path == spelling
    assert spelling in exc.message
    for key in KNOWN_FLAGS:
        assert key in exc.message


@pytest.mark.parametrize(
    ("kwargs", "spelling"),
    [
        ({"cli_features": ["durable"]}, "--feature durable"),
        ({"features": ["turbo"]}, "features: turbo"),
        ({"env": {"LORENZ_FEATURE_TURBO": "1"}}, "LORENZ_FEATURE_TURBO"),
    ],
)
def test_unknown_feature_lists_the_known_ones(kwargs: dict[str, Any], spelling: str) -> None:
    with pytest.raises(UnknownFeature) as caught:
        _resolve(**kwargs)
    exc = caught.value
    assert exc.code == "unknown_feature"
    assert exc.key_path == spelling
    assert "durable_claims" in exc.message
    assert "daemon" in exc.message


def test_bad_flag_value_names_the_flag_and_its_source() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        _resolve(env={"LORENZ_FLAG_CLAIM_STORE__BACKEND": "postgres"})
    (problem,) = caught.value.problems()
    assert problem.key_path == "flags.claim_store.backend"
    assert problem.code == "invalid_workflow_config"
    assert "'memory', 'sqlite' or 'turso'" in problem.reason
    assert "set by env (LORENZ_FLAG_CLAIM_STORE__BACKEND)" in problem.reason


def test_bad_cli_flag_value_names_the_flag() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        _resolve(cli={"daemon.heartbeat_ms": "soon"})
    (problem,) = caught.value.problems()
    assert problem.key_path == "flags.daemon.heartbeat_ms"
    assert "(set by cli)" in problem.reason


def test_flags_must_be_a_map_and_features_a_list_of_names() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping(
            {"flags": ["claim_store.backend=sqlite"]}, base_dir=Path("/"), environ={}
        )
    assert [p.key_path for p in caught.value.problems()] == ["flags"]
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping({"features": "daemon"}, base_dir=Path("/"), environ={})
    assert [p.key_path for p in caught.value.problems()] == ["features"]
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping({"features": ["daemon", 3]}, base_dir=Path("/"), environ={})
    assert [p.key_path for p in caught.value.problems()] == ["features.1"]


def test_flag_assignment_syntax() -> None:
    assert parse_flag_assignment("claim_store.path=/a=b") == ("claim_store.path", "/a=b")
    assert parse_flag_assignment(" daemon.enabled =true") == ("daemon.enabled", "true")
    assert parse_flag_assignment("claim_store.path=") == ("claim_store.path", "")
    for bad in ("claim_store.backend", "=sqlite", ""):
        with pytest.raises(InvalidFlagSyntax) as caught:
            parse_flag_assignment(bad)
        assert caught.value.code == "invalid_flag_syntax"


def test_flags_and_features_keys_are_not_unknown_top_level_keys(
    write_workflow: WriteWorkflow,
) -> None:
    path = write_workflow("flags:\n  claim_store.backend: sqlite\nfeatures: [daemon]\n")
    loaded = load_workflow(path, environ={})
    assert loaded.warnings == ()
    assert loaded.settings.claim_store.backend is ClaimStoreBackend.SQLITE
    assert loaded.settings.daemon.enabled is True
    assert loaded.flag_sources["daemon.enabled"].via == "feature daemon"


def test_load_workflow_applies_cli_overrides_over_the_file(write_workflow: WriteWorkflow) -> None:
    path = write_workflow("flags:\n  claim_store.backend: sqlite\n")
    loaded = load_workflow(
        path, cli_flags={"claim_store.backend": "turso"}, cli_features=["daemon"], environ={}
    )
    assert loaded.settings.claim_store.backend is ClaimStoreBackend.TURSO
    assert loaded.feature_sources["daemon"].source is FlagSource.CLI
