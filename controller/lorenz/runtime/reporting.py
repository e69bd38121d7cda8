"""Reporting: events, run history and listeners, all redacted.

Everything the runtime shows passes through here: events go to the projection (recent events,
run history), the process log and the event listeners; snapshots go to their subscribers. The
tracker token is scrubbed from all of it first. Events and snapshots are typed
(:class:`~lorenz.model.RuntimeEvent`, :class:`~lorenz.model.RuntimeSnapshot`); what writes them
somewhere — the HTTP API, the JSONL ``log_file`` (a listener of the single-host daemon, see
:mod:`lorenz.daemon.logs`), Kubernetes Events — turns them into dicts itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from lorenz.model import (
    AgentUpdate,
    EventType,
    Issue,
    LorenzError,
    ReservationRecord,
    RetryEntry,
    RunningEntry,
    RunOutcome,
    RunRecord,
    RuntimeEvent,
    RuntimeSnapshot,
    SlotKey,
)
from lorenz.runtime.projection import Projection
from lorenz.runtime.providers import InForce
from lorenz.secrets import Redactor, tracker_secrets

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from lorenz.model import Clock, EventDetails
    from lorenz.orchestrator import AgentProgress, EligibilityReport
    from lorenz.workflow import LoadedWorkflow

logger = logging.getLogger("lorenz.runtime")

SnapshotListener = Callable[[RuntimeSnapshot], None]
EventListener = Callable[[RuntimeEvent], None]

_TEXT_FIELDS = ("issue_id", "identifier", "message", "host", "reason", "code", "error")
"""The free-text fields of an event a secret could reach (agents and trackers echo them)."""
_TEXT_LISTS = ("fields", "kept", "removed")


class Reporting:
    """Records and broadcasts what the runtime did, with secrets scrubbed.

    It owns the projection (recent events, run history), the redactor and every listener. The
    snapshot it hands out is built by whoever composes the runtime (:meth:`serve_snapshots`):
    it shows the state of collaborators above this module, which it does not know.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        workflow: InForce[LoadedWorkflow],
        base_env: Mapping[str, str],
    ) -> None:
        self._clock = clock
        self._workflow = workflow
        self._base_env = base_env
        self._projection = Projection()
        self._redactor = Redactor()
        self._redactor_key: tuple[str | None, str | None] = (None, None)
        """The tracker's API key and webhook secret the redactor was last built with."""
        self._redactor.update(tracker_secrets(api_key=None, environ=base_env))
        self._snapshot: Callable[[], RuntimeSnapshot] | None = None
        self._snapshot_listeners: list[SnapshotListener] = []
        self._progress_blind_listeners: list[SnapshotListener] = []
        """Listeners (also in ``_snapshot_listeners``) not called for agent progress alone."""
        self._change_listeners: list[Callable[[], None]] = []
        """Told that the state changed, without a snapshot (they build one when they need it)."""
        self._progress_blind_change_listeners: list[Callable[[], None]] = []
        """Change listeners (also in ``_change_listeners``) not told of agent progress alone."""
        self._event_listeners: list[EventListener] = []

    def serve_snapshots(self, build: Callable[[], RuntimeSnapshot]) -> None:
        """What :meth:`emit_snapshot` and :meth:`subscribe` hand out (set once, by the facade).

        NB: a callable, not the facade: the snapshot reads parts above this module (the poll
        state, the reload's error), and this module must not import them.
        """
        self._snapshot = build

    @property
    def change_listeners(self) -> list[Callable[[], None]]:
        """The change listeners registered now (the list itself: read it, do not change it)."""
        return self._change_listeners

    def recent_events(self) -> tuple[RuntimeEvent, ...]:
        """The last few events, newest first."""
        return self._projection.recent_events()

    def run_history(self) -> tuple[RunRecord, ...]:
        """The last few finished runs, newest first."""
        return self._projection.run_history()

    def _build_snapshot(self) -> RuntimeSnapshot:
        if self._snapshot is None:
            raise RuntimeError("Reporting.serve_snapshots() was not called")
        return self._snapshot()

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
            retry_kind=retry.kind,
            due_at=retry.due_at,
            delay_ms=round(retry.due_at_ms - self._clock.monotonic_ms()),
            error=retry.error,
        )

    def retries_released(self, retries: Iterable[RetryEntry], *, reason: str) -> None:
        """One ``retry_released`` per pending retry the orchestrator dropped (it will not run)."""
        for retry in retries:
            self.event(
                EventType.RETRY_RELEASED,
                issue_id=retry.issue_id,
                identifier=retry.identifier,
                slot=retry.slot_index,
                attempt=retry.attempt,
                message=f"{retry.kind.value} retry #{retry.attempt} released: {reason}",
                retry_kind=retry.kind,
                reason=reason,
            )

    def reservations_expired(self, reservations: Iterable[ReservationRecord]) -> None:
        """One ``reservation_expired`` per reservation swept for outliving its acquire."""
        for reservation in reservations:
            restored = reservation.consumed_retry is not None
            self.event(
                EventType.RESERVATION_EXPIRED,
                issue=reservation.issue,
                slot=reservation.slot_index,
                attempt=reservation.attempt,
                message="reservation expired before a worker was bound; "
                + ("its retry is restored" if restored else "the slot is free again"),
                reason="reservation_expired",
            )

    def eligibility(self, report: EligibilityReport) -> None:
        """What an eligibility pass swept: expired reservations and pruned retries."""
        self.reservations_expired(report.expired)
        span = self._workflow.current.settings.agent.ensemble_size
        for retry in report.pruned:
            self.retries_released(
                (retry,),
                reason="slot_beyond_ensemble" if retry.slot_index >= span else "not_a_candidate",
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
            outcome=outcome,
        )

    def record_run(self, entry: RunningEntry, *, outcome: RunOutcome, error: str | None) -> None:
        now = self._clock.now()
        redactor = self.current_redactor()
        self._projection.record_run(
            RunRecord(
                issue_id=entry.issue.id,
                identifier=entry.issue.identifier,
                slot=entry.slot_index,
                attempt=entry.attempt,
                outcome=outcome,
                error=redactor.redact(error) if error is not None else None,
                started_at=entry.started_at,
                finished_at=now,
                duration_ms=round((now - entry.started_at).total_seconds() * 1000),
                host=entry.host,
                session_id=entry.session_id,
                turn_count=entry.turn_count,
                usage=entry.usage,
            )
        )

    def event(
        self,
        kind: EventType,
        *,
        issue: Issue | None = None,
        slot: int | None = None,
        message: str | None = None,
        **details: Unpack[EventDetails],
    ) -> None:
        """Record, log and broadcast one event; details left ``None`` are left out."""
        fields: dict[str, object] = {
            key: tuple(value) if key in _TEXT_LISTS else value  # type: ignore[arg-type]
            for key, value in details.items()
            if value is not None
        }
        if issue is not None:
            fields["issue_id"] = issue.id
            fields["identifier"] = issue.identifier
        event = self._redacted(
            RuntimeEvent(
                type=kind,
                at=self._clock.now(),
                slot=slot,
                message=message,
                **fields,  # type: ignore[arg-type]
            )
        )
        self._projection.record_event(event)
        log_level = logging.WARNING if kind in _WARNING_EVENTS else logging.INFO
        if logger.isEnabledFor(log_level):
            logger.log(
                log_level, "%s %s", kind.value, message or "", extra={"lorenz": event.to_dict()}
            )
        self._notify(event)

    def agent_update(
        self, key: SlotKey, update: AgentUpdate, progress: AgentProgress | None
    ) -> None:
        """Tell the event listeners an agent reported (not recorded: updates are many).

        ``progress`` is what the orchestrator's ``apply_update()`` answered (``None``: the slot
        is no longer running), so no listener reads the orchestrator's state to learn it."""
        self._notify(
            RuntimeEvent(
                type=EventType.RUN_UPDATE,
                at=self._clock.now(),
                slot_key=key,
                agent_event=update.event,
                usage=update.usage,
                issue_id=progress.issue_id if progress is not None else None,
                identifier=progress.identifier if progress is not None else None,
                message=progress.message if progress is not None else None,
                run_usage=progress.usage if progress is not None else None,
                agent_at=progress.at if progress is not None else None,
            )
        )

    def _notify(self, event: RuntimeEvent) -> None:
        for listener in self._event_listeners:
            try:
                listener(event)
            except Exception:
                # NB: a failing listener must not cost the others their event.
                logger.exception("event listener failed")

    def _redacted(self, event: RuntimeEvent) -> RuntimeEvent:
        redactor = self.current_redactor()
        if not redactor:
            return event
        changes: dict[str, object] = {}
        for name in _TEXT_FIELDS:
            value = getattr(event, name)
            if value is not None and redactor.redact(value) != value:
                changes[name] = redactor.redact(value)
        for name in _TEXT_LISTS:
            values = getattr(event, name)
            if values is not None:
                redacted = tuple(redactor.redact(value) for value in values)
                if redacted != values:
                    changes[name] = redacted
        return dataclasses.replace(event, **changes) if changes else event  # type: ignore[arg-type]

    def scrub(self, text: str) -> str:
        """``text`` with the tracker token (and the well-known token variables) as ``***``.

        NB: agents echo what they saw and trackers echo what they were sent, so a token can
        reach an error message; everything shown or written (events, the log file, snapshot
        errors, agent messages) passes through here first.
        """
        return self.current_redactor().redact(text)

    def current_redactor(self) -> Redactor:
        """The redactor for the current settings (rebuilt only when a reload changed the key)."""
        tracker = self._workflow.current.settings.tracker
        key = (tracker.api_key, tracker.webhook_secret)
        if self._redactor_key != key:
            values = tracker_secrets(api_key=tracker.api_key, environ=self._base_env)
            if tracker.webhook_secret:
                values.append(tracker.webhook_secret)
            self._redactor.update(values)
            self._redactor_key = key
        return self._redactor

    def emit_snapshot(self, *, progress_only: bool = False) -> None:
        """Hand the listeners a new snapshot; built only when some listener wants it.

        ``progress_only``: what changed is a running slot's progress (its agent's last event,
        message, tokens) and nothing else — the bulk of the traffic with a chatty agent. The
        listeners that asked to skip those (``subscribe(agent_progress=False)``) are not called,
        and with none other no snapshot is built.
        """
        for notify in list(self._change_listeners):
            if progress_only and notify in self._progress_blind_change_listeners:
                continue
            try:
                notify()
            except Exception:
                logger.exception("change listener failed")
        listeners = self._snapshot_listeners
        if progress_only and listeners:
            blind = self._progress_blind_listeners
            listeners = [listener for listener in listeners if listener not in blind]
        if not listeners:
            return
        snapshot = self._build_snapshot()
        for listener in list(listeners):
            try:
                listener(snapshot)
            except Exception:
                # NB: a failing listener must not cost the others their snapshot.
                logger.exception("snapshot listener failed")

    def subscribe(
        self, listener: SnapshotListener, *, agent_progress: bool = True
    ) -> Callable[[], None]:
        """Call ``listener`` with every new snapshot, starting with the current one.

        ``agent_progress=False``: not after an agent update that only moved its run's progress
        (see :meth:`emit_snapshot`); for listeners that follow which runs exist and their
        sessions, not what the agents say.
        """
        self._snapshot_listeners.append(listener)
        if not agent_progress:
            self._progress_blind_listeners.append(listener)
        listener(self._build_snapshot())

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._snapshot_listeners.remove(listener)
            with contextlib.suppress(ValueError):
                self._progress_blind_listeners.remove(listener)

        return unsubscribe

    def on_change(
        self, listener: Callable[[], None], *, agent_progress: bool = True
    ) -> Callable[[], None]:
        """Call ``listener`` (no arguments, no snapshot built) whenever the state changes.

        ``agent_progress=False``: not when only a run's progress moved (as :meth:`subscribe`).
        """
        self._change_listeners.append(listener)
        if not agent_progress:
            self._progress_blind_change_listeners.append(listener)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._change_listeners.remove(listener)
            with contextlib.suppress(ValueError):
                self._progress_blind_change_listeners.remove(listener)

        return unsubscribe

    def add_event_listener(self, listener: EventListener) -> Callable[[], None]:
        """Call ``listener`` with every runtime event (metrics, Kubernetes Events, logs)."""
        self._event_listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._event_listeners.remove(listener)

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
