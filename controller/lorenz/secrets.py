"""The one place that knows what a secret is and how to keep it out of output and processes.

Agents run code chosen by a model and echo what they saw; trackers echo what they were sent. A
tracker token can therefore reach an error message, an agent update, an event, a log line or a
child process's environment by many roads. Every road goes through this module:

* :class:`Redactor` replaces known secret values with ``***`` in text and in nested values
  (mappings, lists, tuples), including the forms a value takes after ``json.dumps`` or
  ``repr()`` (escaped quotes, backslashes, non-ASCII);
* :func:`strip_secrets` builds a child environment without the well-known credential variables
  and without any variable whose value equals a secret (however the user named it);
* :class:`SecretRedactor` applies a :class:`Redactor` to every log record on a handler;
* :func:`hide_process_environment` keeps processes of the same uid (agents) from reading the
  controller's or the operator's own environment and memory through ``/proc``.

It sits at the bottom of the layers so that the runtime, the daemon's log filter, the agent and
hook launchers and the operator all apply the same rules.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Collection, Iterable, Mapping
from types import MappingProxyType
from typing import Any

REDACTED = "***"
"""What a secret value is replaced with."""

MIN_SECRET_CHARS = 4
"""Shorter values are not treated as secrets: redacting them would mangle ordinary words."""

WEBHOOK_SECRET_ENV: tuple[str, ...] = (
    "LORENZ_WEBHOOK_SECRET",
    "LINEAR_WEBHOOK_SECRET",
    "GITHUB_WEBHOOK_SECRET",
    "GITLAB_WEBHOOK_SECRET",
    "JIRA_WEBHOOK_SECRET",
)
"""The documented homes of ``tracker.webhook_secret``: whoever holds the secret can forge
deliveries, so these are tracker credentials too."""

TRACKER_SECRET_ENV: tuple[str, ...] = (
    "LINEAR_API_KEY",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "JIRA_API_TOKEN",
    "LORENZ_TRACKER_API_KEY",
    "GITLAB_TOKEN",
    *WEBHOOK_SECRET_ENV,
)
"""Variables that hold tracker credentials: never passed to an agent or a hook, always redacted."""

_NOTHING: Mapping[str, str] = MappingProxyType({})


def secret_variants(value: str) -> set[str]:
    """``value`` and the forms it takes once it has been through JSON or ``repr()``.

    NB: a JSON-encoded error body (``{"error": "bad token \\"abc\\""}``) carries the escaped form,
    not the raw one; matching only the raw form would let such a body through.
    """
    return {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
    }


class Redactor:
    """Replaces known secret values with ``***``; thread-safe, updatable after a reload."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self._lock = threading.Lock()
        self._raw: tuple[str, ...] = ()
        self._needles: tuple[str, ...] = ()
        self.update(secrets)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret values themselves (without their escaped variants)."""
        return self._raw

    def update(self, secrets: Iterable[str | None]) -> None:
        """Replace the set of secrets (e.g. after a reload changed ``tracker.api_key``)."""
        raw = {value for value in secrets if value and len(value) >= MIN_SECRET_CHARS}
        needles: set[str] = set()
        for value in raw:
            needles |= secret_variants(value)
        with self._lock:
            self._raw = tuple(sorted(raw))
            # NB: longest first, so a secret that contains another is replaced whole.
            self._needles = tuple(sorted(needles, key=len, reverse=True))

    def add(self, secrets: Iterable[str | None]) -> None:
        """Add secrets to the ones already known."""
        self.update([*self._raw, *secrets])

    def __bool__(self) -> bool:
        return bool(self._needles)

    def redact(self, text: str) -> str:
        """``text`` with every known secret (in any of its variants) as ``***``."""
        for needle in self._needles:
            if needle in text:
                text = text.replace(needle, REDACTED)
        return text

    def redact_value(self, value: Any) -> Any:
        """``value`` with every string inside it redacted (mappings, lists and tuples walked).

        Mapping keys are redacted too: a secret used as a key is as visible as a value.
        """
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, Mapping):
            return {
                (self.redact(key) if isinstance(key, str) else key): self.redact_value(item)
                for key, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.redact_value(item) for item in value]
        return value


def tracker_secrets(
    *, api_key: str | None, environ: Mapping[str, str], names: Collection[str] = TRACKER_SECRET_ENV
) -> list[str]:
    """The values never to show: the resolved ``tracker.api_key`` and the well-known variables."""
    values = [api_key] if api_key else []
    values.extend(environ[name] for name in names if environ.get(name))
    return values


def strip_secrets(
    *,
    base: Mapping[str, str],
    extra: Mapping[str, str] = _NOTHING,
    names: Collection[str] = TRACKER_SECRET_ENV,
    values: Collection[str] = (),
) -> dict[str, str]:
    """``base`` overlaid with ``extra``, without any variable named or valued like a secret.

    Empty secret values are ignored (they would strip every empty variable and protect
    nothing). ``extra`` is filtered too: a secret listed in ``agents.<kind>.env`` by mistake
    does not reach the child either.
    """
    strip_names = frozenset(names)
    strip_values = frozenset(value for value in values if value)
    merged = {**base, **extra}
    return {
        name: value
        for name, value in merged.items()
        if name not in strip_names and value not in strip_values
    }


_RECORD_ATTRIBUTES = frozenset(
    {*logging.LogRecord("", 0, "", 0, "", None, None).__dict__, "message", "asctime", "taskName"}
)
"""What every log record has; anything else on a record came from ``extra=``."""


class SecretRedactor(logging.Filter):
    """Replaces known secret values with ``***`` in everything a record will print.

    The rules (which values, which escaped forms, nested fields) are :class:`Redactor`'s; this
    filter applies them to a log record: its message (arguments merged in), every field that
    came from ``extra=``, the traceback and the stack. Both composition roots put one on their
    log handler (the single-host logging setup and the operator's).
    """

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        super().__init__()
        self._redactor = Redactor(secrets)

    @property
    def secrets(self) -> tuple[str, ...]:
        return self._redactor.secrets

    def update(self, secrets: Iterable[str | None]) -> None:
        """Replace the set of secrets (e.g. after a reload changed ``tracker.api_key``)."""
        self._redactor.update(secrets)

    def add(self, secrets: Iterable[str | None]) -> None:
        self._redactor.add(secrets)

    def redact(self, text: str) -> str:
        return self._redactor.redact(text)

    def redact_value(self, value: Any) -> Any:
        """``value`` with every string inside it redacted (dicts, lists and tuples walked)."""
        return self._redactor.redact_value(value)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._redactor:
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not lose the line
            message = f"{record.msg!r} {record.args!r}"
        record.msg = self.redact(message)
        record.args = None
        for key, value in list(record.__dict__.items()):
            if key not in _RECORD_ATTRIBUTES:
                setattr(record, key, self.redact_value(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


_PR_SET_DUMPABLE = 4
"""``prctl``'s option number (``linux/prctl.h``)."""


def hide_process_environment() -> bool:
    """Make this process non-dumpable; ``True`` if it was done here.

    NB: agents run as the uid of the process that runs them — the single host's ``lorenz``, or
    the operator in ``local`` mode — and a process of the same uid may read
    ``/proc/<pid>/environ`` of any other: the tracker key a user exported for ``$VAR``, every
    credential set through the chart's ``operator.env``. A non-dumpable process's ``/proc``
    entries belong to root, so a process of the same (non-root) uid can read neither its
    environment nor its memory. Children get their own ``execve``: the worker launcher, agents
    and hooks stay dumpable themselves (and hold no tracker secret). Root (or
    ``CAP_SYS_PTRACE``) still reads everything.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    result: int = prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    return result == 0
