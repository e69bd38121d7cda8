"""The environment an agent process gets: the controller's, plus the run's, minus the secrets.

Agents run arbitrary code chosen by a model. The tracker token Lorenz polls with must never
reach them: a prompt-injected agent could otherwise rewrite any issue the token can see. The
token is removed by name (the well-known variables) and by value (whatever variable the user
resolved ``tracker.api_key`` from, even one they listed in ``agents.<kind>.env`` by mistake).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

from lorenz.secrets import TRACKER_SECRET_ENV, strip_secrets

__all__ = [
    "SESSION_STORE_ENV",
    "TRACKER_SECRET_ENV",
    "agent_environment",
    "make_session_stores",
]

SESSION_STORE_ENV: Final = {"CODEX_HOME": "codex", "CLAUDE_CONFIG_DIR": "claude"}
"""The variables naming where an agent keeps its sessions (Codex its threads, Claude Code its
sessions), each with the folder a Pod run's persistent workspace volume gives it."""

_NOTHING: Mapping[str, str] = MappingProxyType({})


def agent_environment(
    *,
    base: Mapping[str, str],
    extra: Mapping[str, str] = _NOTHING,
    secret_names: Collection[str] = TRACKER_SECRET_ENV,
    secret_values: Collection[str] = (),
) -> dict[str, str]:
    """``base`` overlaid with ``extra``, without any variable named or valued like a secret.

    ``base`` is usually ``os.environ``; ``extra`` holds ``agents.<kind>.env`` and the run's
    ``LORENZ_*`` variables. The rules are :func:`lorenz.secrets.strip_secrets`'.
    """
    return strip_secrets(base=base, extra=extra, names=secret_names, values=secret_values)


def make_session_stores(env: Mapping[str, str]) -> None:
    """Create the session stores ``env`` names (:data:`SESSION_STORE_ENV`) that do not exist.

    NB: Codex refuses to start when ``CODEX_HOME`` names a missing folder; a Pod run's store on
    its workspace volume is missing until its first run makes it.
    """
    for name in SESSION_STORE_ENV:
        folder = env.get(name)
        if folder and os.path.isabs(folder):
            Path(folder).mkdir(parents=True, exist_ok=True)
