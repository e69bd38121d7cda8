"""The typed configuration schema (one pydantic model), shared by every layer above it.

NB: the settings are loaded on first use (PEP 562, :mod:`lorenz.lazy_names`): a worker needs
only :mod:`lorenz.config.kinds` (its agent's launch values and the enums), and
``from lorenz.config import AgentProtocol`` imports that alone, not pydantic and the settings
models (~10 MiB of the launcher's image, issue #35). A name of the settings imports
:mod:`lorenz.config.settings` at its first use. Type checkers read the imports under
``TYPE_CHECKING``; ``_LAZY`` says where each lazy name lives at run time
(tests/test_lean_imports.py checks that the two agree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorenz.config.kinds import AgentLaunch, AgentProtocol, ApprovalMode, WorkspaceKind
from lorenz.lazy_names import lazy_attributes

if TYPE_CHECKING:
    from lorenz.config.settings import CODED_CONFIG_ERRORS as CODED_CONFIG_ERRORS
    from lorenz.config.settings import DEFAULT_ACTIVE_STATES as DEFAULT_ACTIVE_STATES
    from lorenz.config.settings import DEFAULT_CODEX_COMMAND as DEFAULT_CODEX_COMMAND
    from lorenz.config.settings import DEFAULT_TERMINAL_STATES as DEFAULT_TERMINAL_STATES
    from lorenz.config.settings import ENV_KEY as ENV_KEY
    from lorenz.config.settings import FLAG_ONLY_SECTIONS as FLAG_ONLY_SECTIONS
    from lorenz.config.settings import PASSTHROUGH_KEY as PASSTHROUGH_KEY
    from lorenz.config.settings import RELOAD_KEY as RELOAD_KEY
    from lorenz.config.settings import TOP_LEVEL_SECTIONS as TOP_LEVEL_SECTIONS
    from lorenz.config.settings import UNKNOWN_AGENT_KIND as UNKNOWN_AGENT_KIND
    from lorenz.config.settings import AgentKindSettings as AgentKindSettings
    from lorenz.config.settings import AgentSettings as AgentSettings
    from lorenz.config.settings import ClaimStoreBackend as ClaimStoreBackend
    from lorenz.config.settings import ClaimStoreSettings as ClaimStoreSettings
    from lorenz.config.settings import CodexSettings as CodexSettings
    from lorenz.config.settings import DaemonSettings as DaemonSettings
    from lorenz.config.settings import HooksSettings as HooksSettings
    from lorenz.config.settings import LogFormat as LogFormat
    from lorenz.config.settings import LoggingSettings as LoggingSettings
    from lorenz.config.settings import PodTemplateSettings as PodTemplateSettings
    from lorenz.config.settings import PollingSettings as PollingSettings
    from lorenz.config.settings import RetryBackoffSettings as RetryBackoffSettings
    from lorenz.config.settings import RetryEscalationSettings as RetryEscalationSettings
    from lorenz.config.settings import RetrySettings as RetrySettings
    from lorenz.config.settings import ServerSettings as ServerSettings
    from lorenz.config.settings import TerminalAction as TerminalAction
    from lorenz.config.settings import TrackerKind as TrackerKind
    from lorenz.config.settings import TrackerSettings as TrackerSettings
    from lorenz.config.settings import WorkerKind as WorkerKind
    from lorenz.config.settings import WorkerPoolSettings as WorkerPoolSettings
    from lorenz.config.settings import WorkerSettings as WorkerSettings
    from lorenz.config.settings import WorkflowSettings as WorkflowSettings
    from lorenz.config.settings import WorkspaceSettings as WorkspaceSettings

_LAZY: dict[str, str] = {
    "CODED_CONFIG_ERRORS": "settings",
    "DEFAULT_ACTIVE_STATES": "settings",
    "DEFAULT_CODEX_COMMAND": "settings",
    "DEFAULT_TERMINAL_STATES": "settings",
    "ENV_KEY": "settings",
    "FLAG_ONLY_SECTIONS": "settings",
    "PASSTHROUGH_KEY": "settings",
    "RELOAD_KEY": "settings",
    "TOP_LEVEL_SECTIONS": "settings",
    "UNKNOWN_AGENT_KIND": "settings",
    "AgentKindSettings": "settings",
    "AgentSettings": "settings",
    "ClaimStoreBackend": "settings",
    "ClaimStoreSettings": "settings",
    "CodexSettings": "settings",
    "DaemonSettings": "settings",
    "HooksSettings": "settings",
    "LogFormat": "settings",
    "LoggingSettings": "settings",
    "PodTemplateSettings": "settings",
    "PollingSettings": "settings",
    "RetryBackoffSettings": "settings",
    "RetryEscalationSettings": "settings",
    "RetrySettings": "settings",
    "ServerSettings": "settings",
    "TerminalAction": "settings",
    "TrackerKind": "settings",
    "TrackerSettings": "settings",
    "WorkerKind": "settings",
    "WorkerPoolSettings": "settings",
    "WorkerSettings": "settings",
    "WorkflowSettings": "settings",
    "WorkspaceSettings": "settings",
}

if not TYPE_CHECKING:
    # NB: hidden from type checkers (lorenz.lazy_names): they read the imports above.
    __getattr__, __dir__ = lazy_attributes(
        package=__name__, homes=_LAZY, namespace=globals()
    )


__all__ = [
    "CODED_CONFIG_ERRORS",
    "DEFAULT_ACTIVE_STATES",
    "DEFAULT_CODEX_COMMAND",
    "DEFAULT_TERMINAL_STATES",
    "ENV_KEY",
    "FLAG_ONLY_SECTIONS",
    "PASSTHROUGH_KEY",
    "RELOAD_KEY",
    "TOP_LEVEL_SECTIONS",
    "UNKNOWN_AGENT_KIND",
    "AgentKindSettings",
    "AgentLaunch",
    "AgentProtocol",
    "AgentSettings",
    "ApprovalMode",
    "ClaimStoreBackend",
    "ClaimStoreSettings",
    "CodexSettings",
    "DaemonSettings",
    "HooksSettings",
    "LogFormat",
    "LoggingSettings",
    "PodTemplateSettings",
    "PollingSettings",
    "RetryBackoffSettings",
    "RetryEscalationSettings",
    "RetrySettings",
    "ServerSettings",
    "TerminalAction",
    "TrackerKind",
    "TrackerSettings",
    "WorkerKind",
    "WorkerPoolSettings",
    "WorkerSettings",
    "WorkflowSettings",
    "WorkspaceKind",
    "WorkspaceSettings",
]
