"""Reporting: events, run history, listeners and the JSONL log file, all redacted.

Everything the runtime shows or writes passes through here: events go to the projection (recent
events, run history), the log, the optional ``log_file`` sink and the event listeners; snapshots
go to their subscribers. The tracker token is scrubbed from all of it first.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorenz.model import EventType, Issue, LorenzError, RetryEntry, RunningEntry, RunOutcome
from lorenz.secrets import Redactor, tracker_secrets

if TYPE_CHECKING:
    from lorenz.runtime.runtime import LorenzRuntime

logger = logging.getLogger("lorenz.runtime")

SnapshotListener = Callable[[dict[str, Any]], None]
EventListener = Callable[[dict[str, Any]], None]


class Reporting:
    """Records and broadcasts what the runtime did, with secrets scrubbed.

    It holds no state of its own: the :class:`LorenzRuntime` it serves keeps all of it.
    """

    def __init__(self, *, runtime: LorenzRuntime) -> None:
        self._runtime = runtime

    def retry_event(self, retry: RetryEntry | None) -> None:
        if retry is None:
            return
        self.event(
            EventType.RETRY_SCHEDULED,
            issue_id=retry.issue_id,
            identifier=retry.identifier,
            slot=retry.slot_index,
            attempt=retry.attempt,
            message=f"{retry.kind.value} retry #{retry.attempt} due {retry.due_at.isoformat()}",
            retry_kind=retry.kind.value,
            due_at=retry.due_at.isoformat(),
            delay_ms=round(retry.due_at_ms - self._runtime._clock.monotonic_ms()),
            error=retry.error,
        )

    def run_ended(
        self, entry: RunningEntry, *, normal: bool, error: str | None, finished_as: str
    ) -> None:
        """A run the runtime settled: its history row and its ``run_finished``/``run_failed``.

        ``finished_as`` is the message of a normal end (a failure says its error).
        """
        outcome = RunOutcome.SUCCESS if normal else RunOutcome.FAILED
        self.record_run(entry, outcome=outcome, error=error)
        self.event(
            EventType.RUN_FINISHED if normal else EventType.RUN_FAILED,
            issue=entry.issue,
            slot=entry.slot_index,
            message=finished_as if normal else (error or "run failed"),
            outcome=outcome.value,
        )

    def record_run(self, entry: RunningEntry, *, outcome: RunOutcome, error: str | None) -> None:
        now = self._runtime._clock.now()
        self._runtime._projection.record_run(
            {
                "issue_id": entry.issue.id,
                "identifier": entry.issue.identifier,
                "slot": entry.slot_index,
                "attempt": entry.attempt,
                "outcome": outcome.value,
                "error": error,
                "started_at": entry.started_at.isoformat(),
                "finished_at": now.isoformat(),
                "duration_ms": round((now - entry.started_at).total_seconds() * 1000),
                "host": entry.host,
                "session_id": entry.session_id,
                "turn_count": entry.turn_count,
                "usage": entry.usage.to_dict(),
            }
        )

    def event(
        self,
        kind: EventType,
        *,
        issue: Issue | None = None,
        slot: int | None = None,
        message: str | None = None,
        **fields: Any,
    ) -> None:
        event: dict[str, Any] = {"type": kind.value, "at": self._runtime._clock.now().isoformat()}
        if issue is not None:
            event["issue_id"] = issue.id
            event["identifier"] = issue.identifier
        if slot is not None:
            event["slot"] = slot
        if message is not None:
            event["message"] = message
        event.update({k: v for k, v in fields.items() if v is not None})
        event = self.current_redactor().redact_value(event)
        self._runtime._projection.record_event(event)
        self._runtime.stats[kind.value] = self._runtime.stats.get(kind.value, 0) + 1
        log_level = logging.WARNING if kind in _WARNING_EVENTS else logging.INFO
        logger.log(log_level, "%s %s", kind.value, message or "", extra={"lorenz": event})
        self.append_log_file(event)
        for listener in self._runtime._event_listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("event listener failed")

    def append_log_file(self, event: Mapping[str, Any]) -> None:
        path = self._runtime.settings.logging.log_file
        if not path:
            return
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(event, default=str) + "\n")
        except OSError:
            # NB: a broken log sink must never take the orchestrator down.
            logger.warning("cannot append to log_file path=%s", path)

    def scrub(self, text: str) -> str:
        """``text`` with the tracker token (and the well-known token variables) as ``***``.

        NB: agents echo what they saw and trackers echo what they were sent, so a token can
        reach an error message; everything shown or written (events, the log file, snapshot
        errors, agent messages) passes through here first.
        """
        return self.current_redactor().redact(text)

    def current_redactor(self) -> Redactor:
        """The redactor for the current settings (rebuilt only when a reload changed the key)."""
        api_key = self._runtime.settings.tracker.api_key
        if self._runtime._redactor_key != api_key:
            self._runtime._redactor.update(
                tracker_secrets(api_key=api_key, environ=self._runtime._base_env)
            )
            self._runtime._redactor_key = api_key
        return self._runtime._redactor

    def emit_snapshot(self) -> None:
        if not self._runtime._snapshot_listeners:
            return
        snapshot = self._runtime.snapshot()
        for listener in list(self._runtime._snapshot_listeners):
            try:
                listener(snapshot)
            except Exception:
                logger.exception("snapshot listener failed")

    def subscribe(self, listener: SnapshotListener) -> Callable[[], None]:
        """Call ``listener`` with every new snapshot, starting with the current one."""
        self._runtime._snapshot_listeners.append(listener)
        listener(self._runtime.snapshot())

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._runtime._snapshot_listeners.remove(listener)

        return unsubscribe

    def add_event_listener(self, listener: EventListener) -> Callable[[], None]:
        """Call ``listener`` with every runtime event (metrics, Kubernetes Events, logs)."""
        self._runtime._event_listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._runtime._event_listeners.remove(listener)

        return remove


_WARNING_EVENTS = frozenset(
    {
        EventType.POLL_ERROR,
        EventType.RUN_FAILED,
        EventType.RUN_STALLED,
        EventType.RECONCILE_REFRESH_FAILED,
        EventType.WORKFLOW_RELOAD_FAILED,
        EventType.STARTUP_WORKSPACE_CLEANUP_FAILED,
        EventType.WORKSPACE_PRESERVED,
    }
)


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, LorenzError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
