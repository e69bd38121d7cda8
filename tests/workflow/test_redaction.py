"""Effective configuration as data: secrets redacted, flag provenance JSON-ready."""

from __future__ import annotations

import json
from pathlib import Path

from lorenz.workflow import REDACTED, flag_report, redacted_settings, settings_from_mapping


def test_secrets_and_agent_env_values_are_redacted() -> None:
    resolved = settings_from_mapping(
        {
            "tracker": {"kind": "linear", "api_key": "$TOKEN", "assignee": "user-7"},
            "agents": {"mine": {"command": "run", "env": {"OPENAI_API_KEY": "sk-live"}}},
        },
        base_dir=Path("/w"),
        environ={"TOKEN": "lin_secret_value"},
    )
    data = redacted_settings(resolved.settings)
    dumped = json.dumps(data)
    assert "lin_secret_value" not in dumped
    assert "sk-live" not in dumped
    assert data["tracker"]["api_key"] == REDACTED
    assert data["tracker"]["assignee"] == REDACTED
    assert data["agents"]["mine"]["env"] == {"OPENAI_API_KEY": REDACTED}
    assert data["agents"]["mine"]["command"] == "run"
    # The settings themselves are untouched.
    assert resolved.settings.tracker.api_key == "lin_secret_value"


def test_unset_secrets_stay_null() -> None:
    resolved = settings_from_mapping({}, base_dir=Path("/w"), environ={})
    assert redacted_settings(resolved.settings)["tracker"]["api_key"] is None


def test_flag_report_is_json_ready() -> None:
    resolved = settings_from_mapping(
        {"features": ["durable_claims"]}, base_dir=Path("/w"), environ={}
    )
    report = flag_report(resolved.flag_sources)
    assert report["claim_store.backend"] == {
        "value": "sqlite",
        "source": "front-matter",
        "via": "feature durable_claims",
    }
    assert type(report["claim_store.backend"]["value"]) is str
    assert report["daemon.enabled"] == {"value": False, "source": "default", "via": None}
    json.dumps(report)
