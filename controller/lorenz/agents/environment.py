"""The environment an agent process gets: the controller's, plus the run's, minus the secrets.

Agents run arbitrary code chosen by a model. The tracker token Lorenz polls with must never
reach them: a prompt-injected agent could otherwise rewrite any issue the token can see. The
token is removed by name (the well-known variables) and by value (whatever variable the user
resolved ``tracker.api_key`` from, even one they listed in ``agents.<kind>.env`` by mistake).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType

from lorenz.secrets import TRACKER_SECRET_ENV, strip_secrets

__all__ = ["TRACKER_SECRET_ENV", "agent_environment"]

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
