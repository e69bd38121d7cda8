"""lorenz.secrets: one set of rules for redacting secret values and stripping child environments."""

from __future__ import annotations

import json

from lorenz.secrets import (
    REDACTED,
    TRACKER_SECRET_ENV,
    Redactor,
    strip_secrets,
    tracker_secrets,
)

TOKEN = 'lin_api_"quoted\\slash\u00e9'
"""A token with characters JSON and repr() escape: the raw form never appears in their output."""


def test_the_raw_value_is_redacted() -> None:
    redactor = Redactor([TOKEN])
    assert redactor.redact(f"bad token {TOKEN}!") == f"bad token {REDACTED}!"


def test_the_json_escaped_forms_are_redacted() -> None:
    redactor = Redactor([TOKEN])
    for body in (json.dumps({"error": TOKEN}), json.dumps({"error": TOKEN}, ensure_ascii=False)):
        assert TOKEN not in json.loads(redactor.redact(body)).get("error", "")
        assert REDACTED in redactor.redact(body)


def test_the_repr_form_is_redacted() -> None:
    redactor = Redactor([TOKEN])
    assert redactor.redact(repr({"key": TOKEN})) == "{'key': '***'}"


def test_nested_values_and_keys_are_walked() -> None:
    redactor = Redactor(["s3cr3t-value"])
    value = {"a": ["x s3cr3t-value", ("s3cr3t-value",)], "s3cr3t-value": {"b": 1}}
    assert redactor.redact_value(value) == {"a": ["x ***", ["***"]], "***": {"b": 1}}


def test_a_longer_secret_containing_a_shorter_one_is_replaced_whole() -> None:
    redactor = Redactor(["abcd", "abcdefgh"])
    assert redactor.redact("abcdefgh") == REDACTED


def test_short_and_empty_values_are_not_secrets() -> None:
    redactor = Redactor(["abc", "", None])
    assert not redactor
    assert redactor.redact("abc") == "abc"


def test_update_replaces_and_add_extends() -> None:
    redactor = Redactor(["first-secret"])
    redactor.update(["second-secret"])
    assert redactor.redact("first-secret second-secret") == f"first-secret {REDACTED}"
    redactor.add(["first-secret"])
    assert redactor.redact("first-secret second-secret") == f"{REDACTED} {REDACTED}"


def test_tracker_secrets_takes_the_key_and_the_well_known_variables() -> None:
    environ = {"LINEAR_API_KEY": "from-env", "GITHUB_TOKEN": "", "PATH": "/bin"}
    assert tracker_secrets(api_key="resolved", environ=environ) == ["resolved", "from-env"]


def test_strip_secrets_drops_by_name_and_by_value_from_base_and_extra() -> None:
    base = {name: f"v-{name}" for name in TRACKER_SECRET_ENV} | {"PATH": "/bin", "MY": "tok-123"}
    env = strip_secrets(base=base, extra={"ALIAS": "tok-123", "KEEP": "1"}, values=["tok-123"])
    assert env == {"PATH": "/bin", "KEEP": "1"}


def test_strip_secrets_ignores_empty_secret_values() -> None:
    assert strip_secrets(base={"EMPTY": "", "PATH": "/bin"}, values=[""]) == {
        "EMPTY": "",
        "PATH": "/bin",
    }
