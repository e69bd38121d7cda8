"""budget and pricing settings, the shipped price table, and how validate reports them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pydantic
import pytest

from lorenz.cli import main
from lorenz.config.pricing import (
    MAX_PRICE_ENTRIES,
    PRICING_INVALID,
    ModelPrice,
    PricingInvalid,
    default_prices,
    parse_default_prices,
)
from lorenz.config.settings import TerminalAction, WorkflowSettings, command_model
from lorenz.workflow.errors import InvalidWorkflowConfig
from lorenz.workflow.loading import ResolvedSettings, settings_from_mapping


def _resolve(data: Mapping[str, object]) -> ResolvedSettings:
    return settings_from_mapping(data, base_dir=Path.cwd())


def _error_type(data: dict[str, object]) -> tuple[str, str]:
    with pytest.raises(pydantic.ValidationError) as caught:
        WorkflowSettings.model_validate(data)
    error = caught.value.errors()[0]
    return error["type"], str(error["msg"])


def test_defaults_set_no_cap() -> None:
    budget = WorkflowSettings().budget
    assert (budget.max_tokens_per_run, budget.max_tokens_per_issue) == (0, 0)
    assert (budget.max_usd_per_issue, budget.max_usd_per_day) == (0.0, 0.0)
    assert budget.on_exhausted is TerminalAction.BLOCK
    assert budget.warn_at == 0.8
    assert not budget.caps_usd


def test_budget_section_takes_the_contract_names() -> None:
    settings = WorkflowSettings.model_validate(
        {
            "budget": {
                "max_tokens_per_run": "1000",
                "max_tokens_per_issue": 5000,
                "max_usd_per_issue": 2,
                "max_usd_per_day": 25.5,
                "on_exhausted": "escalate",
                "warn_at": 0.5,
            }
        }
    )
    budget = settings.budget
    assert budget.max_tokens_per_run == 1000
    assert budget.max_usd_per_day == 25.5
    assert budget.on_exhausted is TerminalAction.ESCALATE
    assert budget.caps_usd


@pytest.mark.parametrize(
    "budget",
    [
        {"max_usd_per_day": True},
        {"max_usd_per_day": -1},
        {"max_usd_per_day": math.inf},
        {"max_tokens_per_run": 1.5},
        {"warn_at": 0},
        {"warn_at": 1.5},
        {"on_exhausted": "explode"},
        {"max_usd_per_weekk": 3},
    ],
)
def test_bad_budget_values_are_refused(budget: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        WorkflowSettings.model_validate({"budget": budget})


def test_cancel_on_exhausted_needs_a_cancel_state() -> None:
    kind, message = _error_type({"budget": {"on_exhausted": "cancel"}})
    assert kind == "budget_cancel_state_missing"
    assert "retry.cancel_state" in message
    settings = WorkflowSettings.model_validate(
        {"budget": {"on_exhausted": "cancel"}, "retry": {"cancel_state": "Canceled"}}
    )
    assert settings.budget.on_exhausted is TerminalAction.CANCEL


def test_workflow_pricing_wins_over_the_defaults() -> None:
    settings = WorkflowSettings.model_validate(
        {
            "pricing": {
                "gpt-5*": {"input": 2, "cached_input": 0.5, "output": 20},
                "mine": {"input": 1, "output": 2},
            }
        }
    )
    table = settings.price_table()
    assert table.price_for("gpt-5.1-codex") == ModelPrice(input=2.0, cached_input=0.5, output=20.0)
    # cached_input defaults to input
    assert table.price_for("MINE") == ModelPrice(input=1.0, cached_input=1.0, output=2.0)
    # not overridden: the shipped table
    assert table.price_for("claude-sonnet-4-5-20250929") == ModelPrice(
        input=3.0, cached_input=0.3, output=15.0
    )
    assert table.price_for("no-such-model") is None
    assert table.price_for(None) is None


@pytest.mark.parametrize(
    ("pricing", "key_path"),
    [
        ([1, 2], "pricing"),
        ({"gpt-5*": 3}, "pricing.gpt-5*"),
        ({"gpt-5*": {"input": 1}}, "pricing.gpt-5*"),
        ({"gpt-5*": {"input": 1, "output": "ten"}}, "pricing.gpt-5*.output"),
        ({"gpt-5*": {"input": True, "output": 1}}, "pricing.gpt-5*.input"),
        ({"gpt-5*": {"input": -1, "output": 1}}, "pricing.gpt-5*.input"),
        ({"gpt-5*": {"input": 1, "output": 1, "cache_write": 2}}, "pricing.gpt-5*"),
        ({"gpt-5*": {"input": 1, "output": 1e9}}, "pricing.gpt-5*.output"),
        ({"": {"input": 1, "output": 1}}, "pricing"),
    ],
)
def test_malformed_pricing_is_a_coded_error(pricing: object, key_path: str) -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        _resolve({"pricing": pricing})
    (problem,) = caught.value.config_problems
    assert problem.code == PRICING_INVALID
    assert problem.key_path == key_path


def test_a_huge_price_table_is_refused() -> None:
    table = {f"m{i}": {"input": 1, "output": 1} for i in range(MAX_PRICE_ENTRIES + 1)}
    kind, _ = _error_type({"pricing": table})
    assert kind == PRICING_INVALID


def test_the_shipped_table_is_valid_and_dated() -> None:
    prices = default_prices()
    assert prices.checked == "2026-12-07"
    patterns = [pattern for pattern, _ in prices.entries]
    assert "claude-sonnet-4*" in patterns
    assert "gpt-5*-codex*" in patterns
    for _, price in prices.entries:
        assert 0 <= price.cached_input <= price.input < price.output


def test_a_malformed_shipped_table_is_refused() -> None:
    with pytest.raises(PricingInvalid) as caught:
        parse_default_prices("checked: '2026-12-07'\nmodels: {x: {input: 1}}\n")
    assert caught.value.code == PRICING_INVALID
    assert caught.value.key_path == "prices.yaml:models.x"
    with pytest.raises(PricingInvalid):
        parse_default_prices("models: {}\n")
    with pytest.raises(PricingInvalid):
        parse_default_prices("checked: [\n")


@pytest.mark.parametrize(
    ("command", "model"),
    [
        ("claude -p --model claude-opus-4-5 --verbose", "claude-opus-4-5"),
        ("claude --model=claude-haiku-4-5", "claude-haiku-4-5"),
        ("codex -m gpt-5.1-codex app-server", "gpt-5.1-codex"),
        ("codex -c model=gpt-5-mini app-server", "gpt-5-mini"),
        ("codex -c 'model=\"o3\"' app-server", "o3"),
        ("codex app-server", None),
        ("broken 'quote", None),
    ],
)
def test_configured_model_is_read_from_the_command(command: str, model: str | None) -> None:
    assert command_model(command) == model


def test_unpriced_model_with_a_dollar_cap_is_a_coded_warning() -> None:
    base = {
        "agents": {
            "c": {"command": "claude -p --model mystery-9", "protocol": "claude-stream-json"}
        }
    }
    assert _resolve(base).warnings == ()
    resolved = _resolve({**base, "budget": {"max_usd_per_issue": 1}})
    (warning,) = [w for w in resolved.warnings if w.startswith("model_unpriced:")]
    assert warning.startswith("model_unpriced: agents.c runs model 'mystery-9'")
    priced = _resolve(
        {
            **base,
            "budget": {"max_usd_per_issue": 1},
            "pricing": {"mystery-*": {"input": 1, "output": 1}},
        }
    )
    assert [w for w in priced.warnings if w.startswith("model_unpriced:")] == []


def test_a_set_cap_is_enforced_so_it_warns_of_nothing() -> None:
    """The run loop enforces caps (tests/runtime/test_budget.py): the former
    ``budget_not_enforced`` warning is gone, and a cap alone warns of nothing."""
    assert _resolve({}).warnings == ()
    for budget in ({"max_tokens_per_run": 5}, {"max_tokens_per_issue": 5},
                   {"max_usd_per_issue": 1}, {"max_usd_per_day": 1}):
        assert _resolve({"budget": budget}).warnings == (), budget


def test_validate_prints_the_warning_and_succeeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workflow = tmp_path / "WORKFLOW.md"
    workflow.write_text(
        "---\ntracker: {kind: memory}\nbudget: {max_usd_per_day: 10}\n"
        "agents:\n  c: {command: 'claude -p --model mystery-9', protocol: claude-stream-json}\n"
        "---\nwork\n"
    )
    assert main(["validate", str(workflow)]) == 0
    out = capsys.readouterr().out
    assert "warning: model_unpriced: agents.c runs model 'mystery-9'" in out
