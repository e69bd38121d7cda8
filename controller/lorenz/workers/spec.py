"""The run spec: everything a worker needs to execute one run, and nothing secret.

The controller writes it once, before the worker starts; the worker reads it and never asks for
more configuration. It is a file on disk (``spec.json``, 0600) and, for SSH placement, a stream
on ssh's stdin, so it must hold no tracker credential: the agent environment in it is already
stripped of secrets, and host-side tools are listed by their specs only (the calls come back to
the controller, which holds the token).

The *handle* is a pure function of (workflow, issue key, slot, attempt, generation). A controller
that crashed between starting a worker and recording that it did so can therefore compute the
same name again and find the worker, instead of starting a second one.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final

import pydantic
from pydantic import Field

from lorenz.config import AgentKindSettings
from lorenz.model import Issue
from lorenz.workers.journal import DEFAULT_MAX_BYTES as DEFAULT_JOURNAL_MAX_BYTES
from lorenz.workers.journal import MIN_MAX_BYTES as MIN_JOURNAL_MAX_BYTES

SPEC_VERSION: Final = 1

HANDLE_PREFIX: Final = "lzw"
"""Every worker handle starts with this (``lzw-…``); state-dir scans look only at these."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class SpecModel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class IssueSpec(SpecModel):
    """The issue fields a run uses (prompt rendering already happened in the controller)."""

    id: str = Field(min_length=1, max_length=500)
    """Tracker id of the issue."""
    identifier: str = Field(min_length=1, max_length=200)
    """Human key (``ABC-123``)."""
    title: str = Field(default="", max_length=2000)
    """Title, used for the Codex turn title."""
    state: str = Field(default="", max_length=200)
    """Tracker state when the run was dispatched."""
    url: str | None = Field(default=None, max_length=2000)
    """Link to the issue."""

    def to_issue(self) -> Issue:
        return Issue(
            id=self.id,
            identifier=self.identifier,
            title=self.title or self.identifier,
            state=self.state or "unknown",
            url=self.url,
        )

    @classmethod
    def from_issue(cls, issue: Issue) -> IssueSpec:
        """The spec of ``issue``; raises :class:`pydantic.ValidationError` for an issue that
        :func:`unpassable_fields` reports (check that first: a run must never start with it)."""
        return cls(
            id=issue.id,
            identifier=issue.identifier,
            title=issue.title,
            state=issue.state,
            url=issue.url,
        )


def unpassable_fields(issue: Issue) -> dict[str, str]:
    """The fields of ``issue`` no run can be given, each with why (empty: the issue can run).

    A NUL byte cannot be passed to a process at all (hooks and agents get these fields as
    environment variables), and a field longer than :class:`IssueSpec` allows cannot be put in
    a run spec. Both are the issue's fault, not the agent's: the runtime refuses such an issue
    once with ``issue_field_invalid`` instead of starting a run that can only fail. The limits
    are :class:`IssueSpec`'s own, read from its fields, so the check and the spec never differ.
    """
    problems: dict[str, str] = {}
    for name, field in IssueSpec.model_fields.items():
        value = getattr(issue, name, None)
        if not isinstance(value, str):
            continue
        if "\x00" in value:
            problems[name] = "holds a NUL byte"
            continue
        limit = next(
            (m.max_length for m in field.metadata if getattr(m, "max_length", None) is not None),
            None,
        )
        if limit is not None and len(value) > limit:
            problems[name] = f"is {len(value)} characters long, over the limit of {limit}"
        elif name in _REQUIRED_ISSUE_FIELDS and not value:
            problems[name] = "is empty"
    return problems


_REQUIRED_ISSUE_FIELDS: Final = frozenset({"id", "identifier"})


class HookSpec(SpecModel):
    """The workspace hooks the worker runs itself (``sh -lc`` in the workspace)."""

    after_create: str | None = None
    """Run when the worker had to create the workspace (remote placement)."""
    before_run: str | None = None
    """Run before the agent; a failure ends the run as failed without starting the agent."""
    after_run: str | None = None
    """Run after the agent, also after a failure or a cancel; a failure is journaled only."""
    timeout_ms: int = Field(default=60000, gt=0)
    """Limit for each hook; its process group is killed when it passes."""
    env: dict[str, str] = Field(default_factory=dict)
    """Complete environment of the hooks (secrets already stripped by the controller)."""


class RunSpec(SpecModel):
    """One run, as the controller hands it to a worker."""

    version: int = SPEC_VERSION
    """Spec format version; a worker refuses versions it does not know."""
    workflow: str = Field(min_length=1, max_length=4096)
    """Identity of the workflow (its canonical path or ``namespace/name``)."""
    issue: IssueSpec
    """The issue this run works on."""
    slot_index: int = Field(default=0, ge=0)
    """Ensemble slot of the issue."""
    attempt: int | None = Field(default=None, ge=0)
    """Retry attempt (``None`` for a first run)."""
    generation: int = Field(default=0, ge=0)
    """Controller generation that dispatched the run (the fence of the claim store)."""
    run: int = Field(default=0, ge=0)
    """Ordinal among runs with the same attempt and generation (continuations repeat the
    attempt number); part of the handle."""
    prompt: str = Field(max_length=1_000_000)
    """The rendered first-turn prompt."""
    agent: AgentKindSettings
    """How to launch the agent and speak to it."""
    max_turns: int = Field(default=20, gt=0, le=1000)
    """Turn limit of the run."""
    continuation_prompts: list[str] = Field(default_factory=list)
    """The prompts of turns 2..``max_turns``, rendered by the controller (one per turn)."""
    workspace: str = Field(min_length=1, max_length=4096)
    """Absolute path of the workspace on the host the worker runs on."""
    create_workspace: bool = False
    """Create the workspace (and run ``after_create``) when it is missing: remote placement."""
    hooks: HookSpec = Field(default_factory=HookSpec)
    """Hooks run by the worker."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of the agent process (secrets already stripped): complete, or with
    ``inherit_env`` laid over the worker's own."""
    inherit_env: bool = False
    """Start the agent's and the hooks' environments from the worker's own (SSH placement:
    the remote login's ``PATH``, ``HOME``, …, minus tracker variables by name) and lay
    ``env`` / ``hooks.env`` over it. Off: ``env`` and ``hooks.env`` are complete."""
    host: str | None = Field(default=None, max_length=1000)
    """The ``worker.ssh_hosts`` entry the run is placed on (``None``: the controller's host).
    A successor controller reaches the worker through it (probe, attach, cancel)."""
    answer: dict[str, Any] | None = None
    """An answered question's session to continue (:class:`~lorenz.model.questions.SessionResume`
    as JSON): the agent resumes it with the rendered answer as its first input."""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """Specs of the host-side tools the controller executes (``linear_graphql``)."""
    controller_wait_ms: int = Field(default=300_000, gt=0)
    """How long a call that needs the controller (a tool, the between-turn activity check)
    waits for one to attach before it is answered without it."""
    linger_ms: int = Field(default=30_000, ge=0)
    """How long the worker keeps serving its final record for a controller to collect."""
    journal_max_bytes: int = Field(default=DEFAULT_JOURNAL_MAX_BYTES, ge=MIN_JOURNAL_MAX_BYTES)
    """Cap on the run's journal file (``worker.journal_max_bytes``): past it the middle
    records are replaced by one ``journal_dropped`` record (head and tail kept)."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _agent_env_without_secrets(cls, data: Any) -> Any:
        """Keep in ``agent.env`` only what survived into ``env``: secrets never reach the file.

        ``agent`` carries the kind's settings as configured, and its ``env`` may name a tracker
        key (``LINEAR_API_KEY: $LINEAR_API_KEY``, resolved). The controller already stripped
        ``env`` of every secret by name and value; an entry of ``agent.env`` that is not in it
        with the same value was stripped, and is dropped here before the spec is written
        (``spec.json``, ssh's stdin). Nothing reads ``agent.env`` in the worker: ``env`` is
        what the agent gets.
        """
        if not isinstance(data, dict) or "agent" not in data:
            return data
        env = data.get("env") or {}
        agent = data["agent"]
        if isinstance(agent, AgentKindSettings):
            kept = {k: v for k, v in agent.env.items() if env.get(k) == v}
            if kept != agent.env:
                data = {**data, "agent": agent.model_copy(update={"env": kept})}
        elif isinstance(agent, dict) and isinstance(agent.get("env"), dict):
            kept = {k: v for k, v in agent["env"].items() if env.get(k) == v}
            if kept != agent["env"]:
                data = {**data, "agent": {**agent, "env": kept}}
        return data

    @pydantic.field_validator("workspace")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must be an absolute path")
        return value

    @pydantic.model_validator(mode="after")
    def _one_prompt_per_turn(self) -> RunSpec:
        if len(self.continuation_prompts) < self.max_turns - 1:
            raise ValueError(
                f"continuation_prompts needs one prompt for each turn after the first "
                f"({self.max_turns - 1}), got {len(self.continuation_prompts)}"
            )
        return self

    def continuation_prompt(self, turn: int, max_turns: int) -> str:
        """The prompt of ``turn`` (2..``max_turns``), as the runners ask for it."""
        return self.continuation_prompts[min(max(turn - 2, 0), len(self.continuation_prompts) - 1)]

    @property
    def handle(self) -> str:
        return run_handle(
            workflow=self.workflow,
            issue_key=self.issue.identifier,
            slot_index=self.slot_index,
            attempt=self.attempt,
            generation=self.generation,
            run=self.run,
        )


def run_handle(
    *,
    workflow: str,
    issue_key: str,
    slot_index: int,
    attempt: int | None,
    generation: int,
    run: int = 0,
) -> str:
    """The deterministic handle of a run: ``lzw-<identifier>-s<slot>-a<attempt>-g<gen>[-r<run>]
    -<hash>``.

    Short on purpose: it names a directory that holds a unix socket, and socket paths are
    limited to 107 bytes. The hash covers every input, so two workflows with the same issue
    keys never share a handle; the readable part is only for people.
    """
    parts = [workflow, issue_key, str(slot_index), "" if attempt is None else str(attempt),
             str(generation)]
    if run:
        parts.append(str(run))
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]
    readable = _UNSAFE.sub("_", issue_key)[:24] or "issue"
    attempt_part = "0" if attempt is None else str(attempt)
    run_part = f"-r{run}" if run else ""
    return (
        f"{HANDLE_PREFIX}-{readable}-s{slot_index}-a{attempt_part}-g{generation}{run_part}"
        f"-{digest}"
    )


def is_handle(name: str) -> bool:
    return name.startswith(f"{HANDLE_PREFIX}-") and not _UNSAFE.search(name)
