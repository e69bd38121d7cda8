"""What a worker holds of its agent kind (:class:`~lorenz.config.kinds.AgentLaunch`) is the
settings' ``AgentKindSettings`` field for field: the two cannot drift apart (issue #35)."""

from __future__ import annotations

import dataclasses

import pytest

from lorenz.config import AgentKindSettings, AgentLaunch, AgentProtocol, ApprovalMode


def test_agent_launch_has_exactly_the_settings_fields_and_defaults() -> None:
    settings = {
        name: (field.get_default(call_default_factory=True) if not field.is_required() else None)
        for name, field in AgentKindSettings.model_fields.items()
    }
    launch = {
        field.name: (
            field.default_factory()
            if field.default_factory is not dataclasses.MISSING
            else None if field.default is dataclasses.MISSING else field.default
        )
        for field in dataclasses.fields(AgentLaunch)
    }
    assert list(launch) == list(settings)
    assert launch == settings
    required = {name for name, field in AgentKindSettings.model_fields.items()
                if field.is_required()}
    assert required == {
        field.name for field in dataclasses.fields(AgentLaunch)
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    }


def test_launch_carries_every_configured_value() -> None:
    kind = AgentKindSettings(
        command="claude -p", login_shell=False, protocol=AgentProtocol.CLAUDE_STREAM_JSON,
        stall_timeout_ms=0, turn_timeout_ms=2, read_timeout_ms=3, startup_timeout_ms=4,
        approvals=ApprovalMode.ALLOW, approval_policy="never", thread_sandbox="read-only",
        turn_sandbox_policy={"type": "readOnly"}, env={"A": "1"},
    )
    launch = kind.launch()
    assert dataclasses.asdict(launch) == kind.model_dump()


def test_a_launch_refuses_a_blank_command_and_an_unknown_protocol() -> None:
    with pytest.raises(ValueError, match="blank"):
        AgentLaunch(command=" ")
    with pytest.raises(ValueError, match="telnet"):
        AgentLaunch(command="x", protocol="telnet")  # type: ignore[arg-type]
