"""The orchestrator's checkpoint: what it persists beside the claim rows, typed.

A claim row holds one slot; what belongs to no single row lives in the checkpoint, written
through :meth:`~lorenz.model.ClaimStore.save_checkpoint` as one JSON-safe mapping: the usage
totals of ended runs, the consecutive failures per slot, and the blocked slots. The
orchestrator builds a :class:`Checkpoint` from its state and writes :meth:`Checkpoint.to_json`;
hydration reads one back with :meth:`Checkpoint.from_json`.

The persisted form is a contract with every store already written (SQLite, Turso, the
operator's ``Claim`` checkpoint resource)::

    {"schema": 1,
     "usage_totals": {"input_tokens": …, "output_tokens": …, "total_tokens": …,
                      "seconds_running": …, "cost_usd": …},
     "failure_streaks": [{"slot_key": "<issue id>#<slot>", "failures": 2,
                          "max_attempts": 3, "terminal_action": "block",
                          "failure_code": "turn_timeout"}, …],                   # when any
     "blocked": [{"slot_key": …, "issue_id": …, "reason": …, …}, …],            # when any
     "resumes": [{"slot_key": …, "session_id": …, "answer": …, "text": …,
                  "question": {…}}, …]}                                           # when any

A failure streak carries the retry budget it was decided under (``max_attempts``,
``terminal_action``, the last failure's code): a restart decides the recovered streak with
it, not with a changed WORKFLOW.md. Optional keys: an entry without them decides with the
settings, as before.

A waiting slot is a blocked entry with ``waiting: true``, its ``question`` (text, options,
session id, turn) and ``question_posted``; an answered one becomes a pending retry plus its
``resumes`` entry, which lives until the resumed run ends. Both are optional keys: a checkpoint
written before questions existed reads as before, and an older reader ignores them.

NB: lists of objects, not maps keyed by slot key: the Kubernetes store camelCases every
mapping key of the checkpoint, which would mangle issue ids. Reading is forgiving: a part that
cannot be read is left out and reported (``CheckpointInvalid``), never fatal.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping
from typing import Any, cast

from lorenz.config import TerminalAction
from lorenz.model import (
    BlockReason,
    ClaimPhase,
    ClaimRecord,
    SlotKey,
    UsageTotals,
    slot_key,
    stored_failure_code,
)
from lorenz.model.questions import AgentQuestion, SessionResume
from lorenz.orchestrator.errors import CheckpointInvalid
from lorenz.orchestrator.state import BlockedEntry, OrchestratorState, RetryBudget

CHECKPOINT_SCHEMA = 1
"""Version of the checkpoint mapping written through :meth:`ClaimStore.save_checkpoint`."""

_AS_SLOT_KEY = cast("Callable[[str], SlotKey]", str)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """The orchestrator's persisted state beyond the claim rows."""

    usage_totals: UsageTotals | None
    """Usage of ended runs (``None`` only when read back unreadable: totals start at zero)."""
    failure_streaks: Mapping[SlotKey, int] = dataclasses.field(default_factory=dict)
    """Consecutive failed runs per slot (slots at 0 are left out)."""
    blocked: tuple[BlockedEntry, ...] = ()
    """Blocked slots, in slot key order."""
    resumes: Mapping[SlotKey, SessionResume] = dataclasses.field(default_factory=dict)
    """Answered questions whose slot's next run resumes the session."""
    retry_budgets: Mapping[SlotKey, RetryBudget] = dataclasses.field(default_factory=dict)
    """The budget each streak was decided under (stored in its ``failure_streaks`` entry)."""
    schema: int = CHECKPOINT_SCHEMA

    @classmethod
    def of(
        cls,
        *,
        usage_totals: UsageTotals,
        failure_streaks: Mapping[SlotKey, int],
        blocked: Mapping[SlotKey, BlockedEntry],
        resumes: Mapping[SlotKey, SessionResume] | None = None,
        retry_budgets: Mapping[SlotKey, RetryBudget] | None = None,
    ) -> Checkpoint:
        """The checkpoint of the orchestrator's state (its maps, as it keeps them)."""
        streaks = dict(sorted(failure_streaks.items()))
        return cls(
            usage_totals=usage_totals,
            failure_streaks=streaks,
            retry_budgets={k: b for k, b in (retry_budgets or {}).items() if k in streaks},
            blocked=tuple(entry for _, entry in sorted(blocked.items())),
            resumes=dict(sorted((resumes or {}).items())),
        )

    def to_json(self) -> dict[str, Any]:
        """The persisted form (see the module docstring): empty parts are left out."""
        totals = self.usage_totals if self.usage_totals is not None else UsageTotals()
        document: dict[str, Any] = {"schema": self.schema, "usage_totals": totals.to_dict()}
        if self.failure_streaks:
            document["failure_streaks"] = [
                {
                    "slot_key": key,
                    "failures": failures,
                    **_budget_to_json(self.retry_budgets.get(key)),
                }
                for key, failures in self.failure_streaks.items()
            ]
        if self.blocked:
            document["blocked"] = [blocked_to_checkpoint(entry) for entry in self.blocked]
        if self.resumes:
            document["resumes"] = [
                {"slot_key": key, **resume.to_json()} for key, resume in self.resumes.items()
            ]
        return document

    @classmethod
    def from_json(
        cls, document: Mapping[str, Any]
    ) -> tuple[Checkpoint, tuple[CheckpointInvalid, ...]]:
        """A stored checkpoint, and what of it could not be read (left out of it)."""
        problems: list[CheckpointInvalid] = []
        totals = checkpoint_usage(document)
        if isinstance(totals, CheckpointInvalid):
            problems.append(totals)
        streaks, blocked, problem = _read_retry_state(document)
        budgets = _read_budgets(document, streaks=streaks)
        if problem is not None:
            problems.append(problem)
        resumes, resume_problem = read_resumes(document)
        if resume_problem is not None:
            problems.append(resume_problem)
        checkpoint = cls(
            usage_totals=totals if isinstance(totals, UsageTotals) else None,
            failure_streaks=streaks,
            blocked=blocked,
            resumes=resumes,
            retry_budgets=budgets,
        )
        return checkpoint, tuple(problems)

    def retry_state(
        self,
        *,
        recovered: Mapping[SlotKey, ClaimRecord],
        problem: CheckpointInvalid | None = None,
    ) -> RetryStateRestore:
        """The failure streaks of recovered slots and the blocked slots of recovered pending
        retries (an entry without its row is stale and dropped)."""
        pending = {
            key for key, record in recovered.items() if record.phase is ClaimPhase.RETRY_PENDING
        }
        return RetryStateRestore(
            failure_streaks={
                key: failures
                for key, failures in self.failure_streaks.items()
                if key in recovered
            },
            blocked={entry.key: entry for entry in self.blocked if entry.key in pending},
            problem=problem,
            resumes={key: r for key, r in self.resumes.items() if key in recovered},
            retry_budgets={k: b for k, b in self.retry_budgets.items() if k in recovered},
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryStateRestore:
    """Failure streaks and blocked slots from the checkpoint, for the recovered rows."""

    failure_streaks: dict[SlotKey, int]
    blocked: dict[SlotKey, BlockedEntry]
    """Blocked slots; each replaces the pending retry recovered for the same slot."""
    problem: CheckpointInvalid | None
    resumes: dict[SlotKey, SessionResume] = dataclasses.field(default_factory=dict)
    """Answered questions of recovered slots: their next run resumes the session."""
    retry_budgets: dict[SlotKey, RetryBudget] = dataclasses.field(default_factory=dict)
    """The recorded budgets of recovered slots' streaks."""



def read_resumes(
    checkpoint: Mapping[str, Any],
) -> tuple[dict[SlotKey, SessionResume], CheckpointInvalid | None]:
    """The checkpoint's answered questions; an unreadable entry is left out and reported."""
    rows = checkpoint.get("resumes") if isinstance(checkpoint, Mapping) else None
    found: dict[SlotKey, SessionResume] = {}
    if rows is None:
        return found, None
    problem: CheckpointInvalid | None = None
    for item in rows if isinstance(rows, list) else [None]:
        resume = SessionResume.from_json(item)
        key = item.get("slot_key") if isinstance(item, Mapping) else None
        if resume is None or not isinstance(key, str):
            problem = CheckpointInvalid(
                "the claim store checkpoint has an unreadable answered question; that slot "
                "starts a new session instead of resuming (delete the checkpoint row to "
                "silence this)",
            )
            continue
        found[_AS_SLOT_KEY(key)] = resume
    return found, problem


def checkpoint_usage(checkpoint: Mapping[str, Any]) -> UsageTotals | CheckpointInvalid:
    """The usage totals a checkpoint holds, or why they cannot be read."""
    raw = checkpoint.get("usage_totals") if isinstance(checkpoint, Mapping) else None
    fields = ("input_tokens", "output_tokens", "total_tokens")
    if not isinstance(raw, Mapping) or not all(
        isinstance(raw.get(f, 0), int) and not isinstance(raw.get(f, 0), bool) for f in fields
    ):
        return CheckpointInvalid(
            "the claim store checkpoint has no readable usage_totals; usage totals start "
            "at zero (delete the checkpoint row to silence this)",
        )
    try:
        return UsageTotals(
            input_tokens=int(raw.get("input_tokens", 0)),
            output_tokens=int(raw.get("output_tokens", 0)),
            total_tokens=int(raw.get("total_tokens", 0)),
            seconds_running=float(raw.get("seconds_running", 0.0)),
            cost_usd=float(raw.get("cost_usd", 0.0)),
        )
    except (TypeError, ValueError):
        return CheckpointInvalid(
            "the claim store checkpoint's usage_totals are not numbers; usage totals start "
            "at zero (delete the checkpoint row to silence this)",
        )


def checkpoint_retry_state(
    checkpoint: Mapping[str, Any], *, recovered: Mapping[SlotKey, ClaimRecord]
) -> RetryStateRestore:
    """Failure streaks (for recovered slots) and blocked slots (for recovered pending retries)
    from the checkpoint; any unreadable entry is skipped and reported once."""
    streaks, blocked_entries, problem = _read_retry_state(checkpoint)
    return Checkpoint(
        usage_totals=UsageTotals(), failure_streaks=streaks, blocked=blocked_entries
    ).retry_state(recovered=recovered, problem=problem)


def _read_retry_state(
    checkpoint: Mapping[str, Any],
) -> tuple[dict[SlotKey, int], tuple[BlockedEntry, ...], CheckpointInvalid | None]:
    streaks = checkpoint.get("failure_streaks") if isinstance(checkpoint, Mapping) else None
    blocked_rows = checkpoint.get("blocked") if isinstance(checkpoint, Mapping) else None
    failure_streaks: dict[SlotKey, int] = {}
    blocked: list[BlockedEntry] = []
    problem: CheckpointInvalid | None = None
    if isinstance(streaks, list):
        for item in streaks:
            try:
                key = _AS_SLOT_KEY(str(item["slot_key"]))
                failures = int(item["failures"])
            except (KeyError, TypeError, ValueError):
                problem = _retry_state_invalid()
                continue
            if failures > 0:
                failure_streaks[key] = failures
    elif streaks is not None:
        problem = _retry_state_invalid()
    if isinstance(blocked_rows, list):
        for item in blocked_rows:
            entry = blocked_from_checkpoint(item)
            if entry is None:
                problem = _retry_state_invalid()
                continue
            blocked.append(entry)
    elif blocked_rows is not None:
        problem = _retry_state_invalid()
    return failure_streaks, tuple(blocked), problem


def _retry_state_invalid() -> CheckpointInvalid:
    return CheckpointInvalid(
        "the claim store checkpoint has unreadable retry state (failure counts or blocked "
        "slots); those slots retry as usual (delete the checkpoint row to silence this)",
    )


def blocked_to_checkpoint(blocked: BlockedEntry) -> dict[str, Any]:
    """A blocked slot as the checkpoint stores it (JSON-safe)."""
    return {
        "slot_key": blocked.key,
        "issue_id": blocked.issue_id,
        "identifier": blocked.identifier,
        "slot_index": blocked.slot_index,
        "reason": blocked.reason.value,
        "error": blocked.error,
        "failures": blocked.failures,
        "attempt": blocked.attempt,
        "blocked_at": blocked.blocked_at.isoformat(),
        "action": blocked.action.value,
        "action_key": blocked.action_key,
        "action_done": blocked.action_done,
        "action_error": blocked.action_error,
        "issue_version": blocked.issue_version,
        "host": blocked.host,
        "workspace_path": blocked.workspace_path,
        **(
            {
                "question": blocked.question.to_json(),
                "waiting": blocked.waiting,
                "question_posted": blocked.question_posted,
            }
            if blocked.question is not None
            else {}
        ),
    }


def blocked_from_checkpoint(item: Any) -> BlockedEntry | None:
    """The inverse of :func:`blocked_to_checkpoint`; ``None`` for anything unreadable."""
    if not isinstance(item, Mapping):
        return None
    try:
        issue_id = item["issue_id"]
        identifier = item["identifier"]
        slot_index = item["slot_index"]
        if not (isinstance(issue_id, str) and isinstance(identifier, str)):
            return None
        if not isinstance(slot_index, int) or isinstance(slot_index, bool) or slot_index < 0:
            return None
        if item.get("slot_key") != slot_key(issue_id, slot_index):
            return None
        blocked_at = datetime.datetime.fromisoformat(str(item["blocked_at"]))
        if blocked_at.tzinfo is None:
            blocked_at = blocked_at.replace(tzinfo=datetime.UTC)
        error = item.get("error")
        action_error = item.get("action_error")
        version = item.get("issue_version")
        host = item.get("host")
        workspace = item.get("workspace_path")
        for optional in (error, action_error, version, host, workspace):
            if optional is not None and not isinstance(optional, str):
                return None
        question = AgentQuestion.from_json(item.get("question"))
        if item.get("question") is not None and question is None:
            return None
        return BlockedEntry(
            issue_id=issue_id,
            identifier=identifier,
            slot_index=slot_index,
            reason=BlockReason(item["reason"]),
            error=error,
            failures=int(item.get("failures") or 0),
            attempt=int(item.get("attempt") or 1),
            blocked_at=blocked_at,
            action=TerminalAction(item["action"]),
            action_key=str(item["action_key"]),
            action_done=bool(item.get("action_done")),
            action_error=action_error,
            issue_version=version,
            host=host,
            workspace_path=workspace,
            error_code=stored_failure_code(error),
            question=question,
            waiting=question is not None and item.get("waiting") is True,
            question_posted=item.get("question_posted") is True,
        )
    except (KeyError, TypeError, ValueError):
        return None


def _budget_to_json(budget: RetryBudget | None) -> dict[str, Any]:
    if budget is None:
        return {}
    return {
        "max_attempts": budget.max_attempts,
        "terminal_action": budget.terminal_action.value,
        "failure_code": budget.failure_code,
    }


def _read_budgets(
    checkpoint: Mapping[str, Any], *, streaks: Mapping[SlotKey, int]
) -> dict[SlotKey, RetryBudget]:
    """The budgets recorded beside the streaks; an entry without one (written before budgets
    were recorded) or with an unreadable one decides with the settings, as before."""
    rows = checkpoint.get("failure_streaks") if isinstance(checkpoint, Mapping) else None
    budgets: dict[SlotKey, RetryBudget] = {}
    for item in rows if isinstance(rows, list) else ():
        try:
            key = _AS_SLOT_KEY(str(item["slot_key"]))
            max_attempts = int(item["max_attempts"])
            action = TerminalAction(item["terminal_action"])
        except (KeyError, TypeError, ValueError):
            continue
        code = item.get("failure_code")
        if key in streaks and max_attempts >= 1:
            budgets[key] = RetryBudget(
                max_attempts=max_attempts,
                terminal_action=action,
                failure_code=str(code)[:200] if code is not None else None,
            )
    return budgets


def state_checkpoint(state: OrchestratorState) -> Checkpoint:
    """The checkpoint of the live state: what the rows alone cannot bring back after a restart.

    Answered questions are kept only for slots still tracked (a pending retry or a claim).
    """
    return Checkpoint.of(
        usage_totals=state.usage_totals,
        failure_streaks=state.failure_streaks,
        retry_budgets=state.retry_budgets,
        blocked=state.blocked,
        resumes={
            key: resume
            for key, resume in state.resumes.items()
            if key in state.retry_attempts or key in state.claimed
        },
    )
