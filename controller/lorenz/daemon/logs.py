"""Process logging for a single-host run: structured lines, run context, secrets scrubbed.

Lorenz logs like a Kubernetes component: a short message and the objects it concerns as
``key=value`` pairs (text) or as top-level keys of one JSON object per line (``logging.format:
json``, for log shippers). The runtime passes its event dict as ``extra={"lorenz": {...}}``;
every key of it becomes a field. Lines logged while a run is in flight also carry the run's
``issue_id``, ``identifier``, ``slot`` and ``session_id``, filled in by :class:`RunContext`
from the run's asyncio task and the runtime's latest state of its slots, so that even a line
from deep inside an agent runner can be traced to its issue.

The event log file (``logging.log_file``, JSON lines) is written here too, by
:class:`LogFileSink`, a listener of the runtime's events: the runtime emits events and leaves
where they go to the process that runs it.

Agents echo what they see and trackers echo what they were sent, so a tracker token can reach a
log line through an error message. The :class:`SecretRedactor` on the handler replaces every
known secret value (``tracker.api_key`` and the well-known token variables) with ``***`` in the
message, the arguments, the extra fields and the traceback of every record, whichever logger
it came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO

from lorenz.config import LogFormat, LoggingSettings, WorkflowSettings
from lorenz.model import EventType, RunIdentity, RuntimeEvent, RuntimeSnapshot
from lorenz.runtime import LorenzRuntime
from lorenz.secrets import MIN_SECRET_CHARS, REDACTED, SecretRedactor
from lorenz.secrets import tracker_secrets as secret_values
from lorenz.workflow import LoadedWorkflow

__all__ = ["MIN_SECRET_CHARS", "REDACTED", "LogFileSink", "SecretRedactor", "tracker_secrets"]

logger = logging.getLogger("lorenz.daemon")
EXTRA_KEY = "lorenz"
"""The ``extra=`` key the runtime puts its structured fields under."""
RUN_TASK_PREFIX = "lorenz-run:"
"""Name prefix of the runtime's per-run tasks (``lorenz-run:<issue id>#<slot>``)."""

RESERVED_JSON_KEYS = ("ts", "level", "logger", "message")
"""Fields every JSON line starts with; an extra field of that name is kept as ``event_<key>``."""
RUN_KEYS = ("issue_id", "identifier", "slot", "session_id")
"""Run-scoped fields, in the order text lines show them (right after the message)."""

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_BARE_VALUE = re.compile(r"^[A-Za-z0-9_.,:/@#+\-]+$")

_RECORD_ATTRIBUTES = frozenset(
    {
        *logging.LogRecord("", 0, "", 0, "", None, None).__dict__,
        "message",
        "asctime",
        "taskName",
        EXTRA_KEY,
    }
)
"""What every record has; anything else on a record came from ``extra=`` and is a field."""


# ------------------------------------------------------------------------------ secrets


def tracker_secrets(settings: WorkflowSettings, environ: Mapping[str, str]) -> list[str]:
    """The values never to log: ``tracker.api_key``, ``tracker.webhook_secret`` and the
    well-known token variables."""
    values = secret_values(api_key=settings.tracker.api_key, environ=environ)
    if settings.tracker.webhook_secret:
        values.append(settings.tracker.webhook_secret)
    return values


# ------------------------------------------------------------------------------ run context


class RunContext:
    """Which issue, slot and agent session each in-flight slot key belongs to.

    Fed from runtime snapshots (see :class:`RunContextAttachment`); read by the log filter for
    every record. A slot stays known while it runs, waits for a worker or waits for its retry,
    so the lines about its end (``run_finished``, ``retry_scheduled``) still carry its session.
    """

    def __init__(self) -> None:
        self._slots: dict[str, dict[str, Any]] = {}

    def observe(self, snapshot: RuntimeSnapshot) -> None:
        """Follow the slots of ``snapshot`` (see :meth:`observe_identities`)."""
        lanes = snapshot.lanes
        identities = [
            RunIdentity(row.slot_key, row.issue_id, row.identifier, row.slot_index,
                        row.session_id)
            for row in lanes.running
        ]
        for waiting in (lanes.reserving, lanes.retrying):
            identities.extend(
                RunIdentity(row.slot_key, row.issue_id, row.identifier, row.slot_index)
                for row in waiting
            )
        self.observe_identities(identities)

    def observe_identities(self, identities: Iterable[RunIdentity]) -> None:
        """Know exactly these slots from now on; a session seen once stays with its slot."""
        known: dict[str, dict[str, Any]] = {}
        for identity in identities:
            key = identity.slot_key
            fields = dict(self._slots.get(key, {}))
            fields["issue_id"] = identity.issue_id
            fields["identifier"] = identity.identifier
            fields["slot"] = identity.slot_index
            if identity.session_id:
                fields["session_id"] = identity.session_id
            known[key] = {k: v for k, v in fields.items() if v is not None}
        self._slots = known

    def fields_for(self, slot_key: str) -> dict[str, Any]:
        return dict(self._slots.get(slot_key, {}))

    def clear(self) -> None:
        self._slots = {}


RUN_CONTEXT = RunContext()
"""The process-wide run context the handler installed by :func:`configure_logging` reads."""


class RunContextFilter(logging.Filter):
    """Adds the run-scoped fields to a record that concerns one run.

    A record concerns a run when its extra fields name an issue and slot (runtime events), or
    when it is emitted from inside a run's own task (runners, hooks, workspace code).
    """

    def __init__(self, context: RunContext = RUN_CONTEXT) -> None:
        super().__init__()
        self._context = context

    def filter(self, record: logging.LogRecord) -> bool:
        extra = getattr(record, EXTRA_KEY, None)
        fields: dict[str, Any] = dict(extra) if isinstance(extra, Mapping) else {}
        slot_key = _slot_key_of(fields) or _current_run_task()
        if slot_key is None:
            return True
        known = self._context.fields_for(slot_key)
        if not known:
            issue_id, _, slot = slot_key.rpartition("#")
            known = {"issue_id": issue_id, "slot": int(slot) if slot.isdigit() else slot}
        for key in RUN_KEYS:
            if fields.get(key) is None and known.get(key) is not None:
                fields[key] = known[key]
        setattr(record, EXTRA_KEY, fields)
        return True


def _slot_key_of(fields: Mapping[str, Any]) -> str | None:
    if fields.get("slot_key"):
        return str(fields["slot_key"])
    if fields.get("issue_id") is not None and fields.get("slot") is not None:
        return f"{fields['issue_id']}#{fields['slot']}"
    return None


def _current_run_task() -> str | None:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        return None
    if task is None:
        return None
    name = task.get_name()
    return name[len(RUN_TASK_PREFIX) :] if name.startswith(RUN_TASK_PREFIX) else None


# ------------------------------------------------------------------------------ formatting


def _timestamp(record: logging.LogRecord) -> str:
    at = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The runtime's ``extra={"lorenz": {...}}`` fields, then any other ``extra=`` keys."""
    extra = getattr(record, EXTRA_KEY, None)
    fields: dict[str, Any] = dict(extra) if isinstance(extra, Mapping) else {}
    for key, value in record.__dict__.items():
        if key not in _RECORD_ATTRIBUTES and key not in fields:
            fields[key] = value
    return fields


def _run_first(fields: Mapping[str, Any]) -> list[tuple[str, Any]]:
    ordered = [(key, fields[key]) for key in RUN_KEYS if fields.get(key) is not None]
    ordered.extend((key, value) for key, value in fields.items() if key not in RUN_KEYS)
    return ordered


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, then every field."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        for key, value in _run_first(_fields(record)):
            if key == "message" and isinstance(value, str) and value in message:
                continue  # the runtime's message line already says it
            line[f"event_{key}" if key in RESERVED_JSON_KEYS else key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<ts> <LEVEL> <logger> "<message>" key=value …``, Kubernetes-component style."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        parts = [_timestamp(record), f"{record.levelname:<7}", record.name, json.dumps(message)]
        for key, value in _run_first(_fields(record)):
            if value is None or key == "at":
                continue  # "at" repeats the line's own timestamp
            if key == "message" and isinstance(value, str) and value in message:
                continue
            parts.append(f"{key}={format_value(value)}")
        line = " ".join(parts)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line = f"{line}\n{record.exc_text}"
        if record.stack_info:
            line = f"{line}\n{record.stack_info}"
        return line


def format_value(value: Any) -> str:
    """A ``key=value`` value: bare when unambiguous, JSON-quoted otherwise."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return value if _BARE_VALUE.match(value) else json.dumps(value, ensure_ascii=False)
    return json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False)


# ------------------------------------------------------------------------------ setup


class _CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is *now*.

    NB: the terminal view swaps ``sys.stderr`` for a proxy that prints above its live region;
    a handler that captured the original stream at setup would draw through the view instead.
    """

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


@dataclasses.dataclass
class LoggingSetup:
    """What :func:`configure_logging` installed, so it can be updated or removed."""

    handler: logging.Handler
    redactor: SecretRedactor
    run_context: RunContext
    workflow: str | None = None
    """The workflow whose ``logging`` section this follows (``None``: the CLI's defaults)."""

    def close(self) -> None:
        """Remove the handler from the root logger (tests, re-configuration)."""
        root = logging.getLogger()
        root.removeHandler(self.handler)
        # NB: a handler whose stream is gone cannot fail the shutdown.
        with contextlib.suppress(Exception):
            self.handler.close()


_ACTIVE: LoggingSetup | None = None


def configure_logging(
    settings: LoggingSettings,
    *,
    stream: TextIO | None = None,
    secrets: Iterable[str | None] = (),
    run_context: RunContext = RUN_CONTEXT,
) -> LoggingSetup:
    """Install Lorenz's log handler on the root logger (replacing any earlier one).

    ``stream`` defaults to the *current* ``sys.stderr`` at each write (see the terminal view).
    ``secrets`` are the values to scrub; see :func:`tracker_secrets`. Calling it again (a
    reload, or the host after the CLI's early setup) swaps the handler, never stacks it.
    """
    global _ACTIVE
    handler: logging.Handler = (
        logging.StreamHandler(stream) if stream is not None else _CurrentStderrHandler(sys.stderr)
    )
    handler.setFormatter(JsonFormatter() if settings.format is LogFormat.JSON else TextFormatter())
    redactor = SecretRedactor(secrets)
    # NB: filters on the handler, not on a logger: logger filters skip records that propagate
    # up from child loggers, and every Lorenz module logs through its own child logger.
    handler.addFilter(RunContextFilter(run_context))
    handler.addFilter(redactor)

    root = logging.getLogger()
    if _ACTIVE is not None:
        _ACTIVE.close()
    for existing in list(root.handlers):
        # NB: exactly basicConfig()'s handler (the CLI's pre-workflow setup) is replaced rather
        # than doubled; anything else on the root (pytest's capture, a user's) is left alone.
        if type(existing) is logging.StreamHandler and existing.stream in (sys.stderr, sys.stdout):
            root.removeHandler(existing)
    root.addHandler(handler)
    level = _LEVELS[settings.level]
    root.setLevel(level)
    # aiohttp logs every request at INFO; the dashboard's polling fallback would flood the log.
    logging.getLogger("aiohttp.access").setLevel(max(level, logging.WARNING))
    # httpx logs every tracker request at INFO; its lines come back with `logging.level: debug`.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else logging.WARNING)
    _ACTIVE = LoggingSetup(handler=handler, redactor=redactor, run_context=run_context)
    return _ACTIVE


def active_logging() -> LoggingSetup | None:
    """The setup :func:`configure_logging` installed last, if any."""
    return _ACTIVE


def configure_for_workflow(
    loaded: LoadedWorkflow,
    *,
    environ: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> LoggingSetup:
    """:func:`configure_logging` with the workflow's ``logging`` section and its secrets."""
    setup = configure_logging(
        loaded.settings.logging,
        stream=stream,
        secrets=tracker_secrets(loaded.settings, os.environ if environ is None else environ),
    )
    setup.workflow = str(loaded.canonical_path)
    return setup


# ------------------------------------------------------------------------------ attachment


class _HostOptions(Protocol):
    @property
    def environ(self) -> Mapping[str, str] | None: ...


class LogFileSink:
    """The JSONL event log (``logging.log_file``): every runtime event, one JSON object a line.

    An event listener of the runtime, so the runtime only emits events and the single-host
    process decides where they are written. The path is read at each event, so a hot reload
    that changes it takes effect at once; the folders are created on demand; an unwritable
    file costs a warning, never the run. ``run_update`` (an agent's progress, many a second)
    is not written: the run's start, end and retry events are.
    """

    def __init__(self, *, settings: Callable[[], WorkflowSettings]) -> None:
        self._settings = settings

    def __call__(self, event: RuntimeEvent) -> None:
        if event.type is EventType.RUN_UPDATE:
            return
        path = self._settings().logging.log_file
        if not path:
            return
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(event.to_dict(), default=str) + "\n")
        except OSError:
            # NB: a broken log sink must never take the orchestrator down.
            logger.warning("cannot append to log_file path=%s", path)


class RunContextAttachment:
    """Keeps the log context and the secret list in step with the runtime; writes the log file.

    On every snapshot: which slots run with which session (for :class:`RunContextFilter`) and
    the tracker key in force (a hot reload may have changed it). On every event: a line in the
    ``logging.log_file``, if one is set (:class:`LogFileSink`).
    """

    def __init__(
        self,
        *,
        setup: LoggingSetup,
        environ: Mapping[str, str],
    ) -> None:
        self._setup = setup
        self._environ = dict(environ)
        self._detach: list[Callable[[], None]] = []
        self._api_key: str | None = None

    async def start(self, runtime: LorenzRuntime) -> None:
        def on_change() -> None:
            self._setup.run_context.observe_identities(runtime.run_identities())
            api_key = runtime.settings.tracker.api_key
            if api_key != self._api_key:
                self._api_key = api_key
                self._setup.redactor.add(tracker_secrets(runtime.settings, self._environ))

        sink = LogFileSink(settings=lambda: runtime.settings)
        self._detach.append(runtime.add_event_listener(sink))
        # NB: the run context needs which runs exist and their sessions, not each agent
        # message (agent_progress=False), and not a whole snapshot either: one was built per
        # change for this listener alone, ~2 a run, with the recent events and history copied.
        on_change()
        self._detach.append(runtime.on_change(on_change, agent_progress=False))

    async def stop(self) -> None:
        while self._detach:
            self._detach.pop()()
        self._setup.run_context.clear()


def attachment_factory(
    loaded: LoadedWorkflow, options: _HostOptions
) -> RunContextAttachment | None:
    """For ``ATTACHMENTS`` (register it first): the run context for the log lines.

    If logging does not follow this workflow yet (the composition root did not call
    :func:`configure_for_workflow` right after loading it), it is configured here, so that
    ``logging.format``/``level`` and secret scrubbing apply from the first attachment on.
    """
    environ = options.environ if options.environ is not None else os.environ
    setup = active_logging()
    if setup is None or setup.workflow != str(loaded.canonical_path):
        setup = configure_for_workflow(loaded, environ=environ)
    return RunContextAttachment(setup=setup, environ=environ)
