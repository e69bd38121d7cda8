"""The environment an agent process gets: the controller's, plus the run's, minus the secrets.

Agents run arbitrary code chosen by a model. The tracker token Lorenz polls with must never
reach them: a prompt-injected agent could otherwise rewrite any issue the token can see. The
token is removed by name (the well-known variables) and by value (whatever variable the user
resolved ``tracker.api_key`` from, even one they listed in ``agents.<kind>.env`` by mistake).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType

TRACKER_SECRET_ENV: tuple[str, ...] = (
    "LINEAR_API_KEY",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "LORENZ_TRACKER_API_KEY",
)
"""Variables that hold tracker credentials and are never passed to an agent."""

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
    ``LORENZ_*`` variables. Empty secret values are ignored (they would strip every empty
    variable and protect nothing).
    """
    names = frozenset(secret_names)
    values = frozenset(value for value in secret_values if value)
    merged = {**base, **extra}
    return {
        name: value for name, value in merged.items() if name not in names and value not in values
    }
