"""What a run needs of its agent kind, without the settings schema (no pydantic).

A worker launches one agent and speaks its protocol; of the whole configuration it needs only
its kind's launch values. Those come here as :class:`AgentLaunch`, a plain frozen dataclass
with exactly :class:`~lorenz.config.settings.AgentKindSettings`' fields and defaults (the
controller makes one with ``AgentKindSettings.launch()``; tests/config checks that the two
never drift apart), beside the enums its fields use. A process that imports only this module
(the launcher, every forked worker) loads neither pydantic nor the ~40 settings models: ~10 MiB
of the launcher's image that every worker shared (issue #35).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any

from lorenz.config.dataclass_json import DataclassJsonError, Gt, MinLen


class WorkspaceKind(enum.StrEnum):
    DIRECTORY = "directory"
    WORKTREE = "worktree"


class AgentProtocol(enum.StrEnum):
    CODEX_APP_SERVER = "codex-app-server"
    ACP = "acp"
    CLAUDE_STREAM_JSON = "claude-stream-json"
    COMMAND = "command"


class ApprovalMode(enum.StrEnum):
    """How Lorenz answers an agent's requests for approval (commands, file changes, ...)."""

    DENY = "deny"
    """Decline every approval request (the default: the agent works inside its sandbox)."""
    ALLOW = "allow"
    """Approve every request: high trust, opt in only for sandboxed hosts."""
    ASK = "ask"
    """Ask a person: the request becomes a question on the issue and the slot waits for the
    answer, which resumes the session (docs/questions.md). Nothing is approved meanwhile."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentLaunch:
    """How one run launches its agent and speaks to it: ``agents.<kind>`` as validated by the
    settings (each field is documented there, on ``AgentKindSettings``)."""

    command: Annotated[str, MinLen(1)]
    login_shell: bool = True
    protocol: AgentProtocol = AgentProtocol.CODEX_APP_SERVER
    stall_timeout_ms: int = 300000
    turn_timeout_ms: Annotated[int, Gt(0)] = 3600000
    read_timeout_ms: Annotated[int, Gt(0)] = 5000
    startup_timeout_ms: Annotated[int, Gt(0)] = 60000
    approvals: ApprovalMode = ApprovalMode.DENY
    approval_policy: Any = None
    thread_sandbox: str | None = None
    turn_sandbox_policy: dict[str, Any] | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # NB: a protocol or mode given by its value (a test, the rehearsal) becomes its member
        object.__setattr__(self, "protocol", AgentProtocol(self.protocol))
        object.__setattr__(self, "approvals", ApprovalMode(self.approvals))
        if not self.command.strip():
            raise DataclassJsonError("must not be blank", path=("command",))
