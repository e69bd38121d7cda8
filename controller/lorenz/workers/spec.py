"""The run spec: everything a worker needs to execute one run, and nothing secret.

The controller writes it once, before the worker starts; the worker reads it and never asks for
more configuration. It is a file on disk (``spec.json``, 0600) and, for SSH placement, a stream
on ssh's stdin, so it must hold no tracker credential: the agent environment in it is already
stripped of secrets, and host-side tools are listed by their specs only (the calls come back to
the controller, which holds the token).

The *handle* is a pure function of (workflow, issue key, slot, attempt, generation). A controller
that crashed between starting a worker and recording that it did so can therefore compute the
same name again and find the worker, instead of starting a second one.

NB: plain frozen dataclasses, read by :mod:`lorenz.config.dataclass_json` (no pydantic): every
worker reads its spec, and the launcher that forks them preloads what they import; pydantic and
the settings models were ~10 MiB of that shared image, and each fork's own validation and
re-dump of its spec wrote pages of its own (issue #35). The fields' limits are ``Annotated``
metadata, which the reader, :func:`unpassable_fields` and construction in code all check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Annotated, Any, Final

from lorenz.config.dataclass_json import (
    DataclassJsonError,
    Ge,
    Gt,
    Le,
    MaxLen,
    MinLen,
    check_limits,
    constraints_of,
    encode_json,
    read_dataclass,
    read_json,
)
from lorenz.config.kinds import AgentLaunch
from lorenz.model import Issue
from lorenz.workers.journal import DEFAULT_MAX_BYTES as DEFAULT_JOURNAL_MAX_BYTES
from lorenz.workers.journal import MIN_MAX_BYTES as MIN_JOURNAL_MAX_BYTES

SPEC_VERSION: Final = 1

HANDLE_PREFIX: Final = "lzw"
"""Every worker handle starts with this (``lzw-…``); state-dir scans look only at these."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


SpecInvalid = DataclassJsonError
"""What reading a spec raises: ``where`` names the field (``issue.id``), ``message`` what is
wrong with it."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IssueSpec:
    """The issue fields a run uses (prompt rendering already happened in the controller)."""

    id: Annotated[str, MinLen(1), MaxLen(500)]
    """Tracker id of the issue."""
    identifier: Annotated[str, MinLen(1), MaxLen(200)]
    """Human key (``ABC-123``)."""
    title: Annotated[str, MaxLen(2000)] = ""
    """Title, used for the Codex turn title."""
    state: Annotated[str, MaxLen(200)] = ""
    """Tracker state when the run was dispatched."""
    url: Annotated[str | None, MaxLen(2000)] = None
    """Link to the issue."""

    def __post_init__(self) -> None:
        check_limits(self)

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
        """The spec of ``issue``; raises :class:`SpecInvalid` for an issue that
        :func:`unpassable_fields` reports (check that first: a run must never start with it)."""
        fields = {"id": issue.id, "identifier": issue.identifier, "title": issue.title,
                  "state": issue.state, "url": issue.url}
        return read_dataclass(cls, fields, path=("issue",))


def unpassable_fields(issue: Issue) -> dict[str, str]:
    """The fields of ``issue`` no run can be given, each with why (empty: the issue can run).

    A NUL byte cannot be passed to a process at all (hooks and agents get these fields as
    environment variables), and a field longer than :class:`IssueSpec` allows cannot be put in
    a run spec. Both are the issue's fault, not the agent's: the runtime refuses such an issue
    once with ``issue_field_invalid`` instead of starting a run that can only fail. The limits
    are :class:`IssueSpec`'s own, read from its fields, so the check and the spec never differ.
    """
    problems: dict[str, str] = {}
    for field in dataclasses.fields(IssueSpec):
        name = field.name
        value = getattr(issue, name, None)
        if not isinstance(value, str):
            continue
        if "\x00" in value:
            problems[name] = "holds a NUL byte"
            continue
        limit = next(
            (c.max_length for c in constraints_of(IssueSpec, name) if isinstance(c, MaxLen)),
            None,
        )
        if limit is not None and len(value) > limit:
            problems[name] = f"is {len(value)} characters long, over the limit of {limit}"
        elif name in _REQUIRED_ISSUE_FIELDS and not value:
            problems[name] = "is empty"
    return problems


_REQUIRED_ISSUE_FIELDS: Final = frozenset({"id", "identifier"})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HookSpec:
    """The workspace hooks the worker runs itself (``sh -lc`` in the workspace)."""

    after_create: str | None = None
    """Run when the worker had to create the workspace (remote placement)."""
    before_run: str | None = None
    """Run before the agent; a failure ends the run as failed without starting the agent."""
    after_run: str | None = None
    """Run after the agent, also after a failure or a cancel; a failure is journaled only."""
    timeout_ms: Annotated[int, Gt(0)] = 60000
    """Limit for each hook; its process group is killed when it passes."""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Complete environment of the hooks (secrets already stripped by the controller)."""

    def __post_init__(self) -> None:
        check_limits(self)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    """One run, as the controller hands it to a worker."""

    version: int = SPEC_VERSION
    """Spec format version; a worker refuses versions it does not know."""
    workflow: Annotated[str, MinLen(1), MaxLen(4096)]
    """Identity of the workflow (its canonical path or ``namespace/name``)."""
    issue: IssueSpec
    """The issue this run works on."""
    slot_index: Annotated[int, Ge(0)] = 0
    """Ensemble slot of the issue."""
    attempt: Annotated[int | None, Ge(0)] = None
    """Retry attempt (``None`` for a first run)."""
    generation: Annotated[int, Ge(0)] = 0
    """Controller generation that dispatched the run (the fence of the claim store)."""
    run: Annotated[int, Ge(0)] = 0
    """Ordinal among runs with the same attempt and generation (continuations repeat the
    attempt number); part of the handle."""
    prompt: Annotated[str, MaxLen(1_000_000)]
    """The rendered first-turn prompt."""
    agent: AgentLaunch
    """How to launch the agent and speak to it."""
    max_turns: Annotated[int, Gt(0), Le(1000)] = 20
    """Turn limit of the run."""
    continuation_prompts: list[str] = dataclasses.field(default_factory=list)
    """The prompts of turns 2..``max_turns``, rendered by the controller (one per turn)."""
    workspace: Annotated[str, MinLen(1), MaxLen(4096)]
    """Absolute path of the workspace on the host the worker runs on."""
    create_workspace: bool = False
    """Create the workspace (and run ``after_create``) when it is missing: remote placement."""
    hooks: HookSpec = dataclasses.field(default_factory=HookSpec)
    """Hooks run by the worker."""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Environment of the agent process (secrets already stripped): complete, or with
    ``inherit_env`` laid over the worker's own."""
    inherit_env: bool = False
    """Start the agent's and the hooks' environments from the worker's own (SSH placement:
    the remote login's ``PATH``, ``HOME``, …, minus tracker variables by name) and lay
    ``env`` / ``hooks.env`` over it. Off: ``env`` and ``hooks.env`` are complete."""
    host: Annotated[str | None, MaxLen(1000)] = None
    """The ``worker.ssh_hosts`` entry the run is placed on (``None``: the controller's host).
    A successor controller reaches the worker through it (probe, attach, cancel)."""
    answer: dict[str, Any] | None = None
    """An answered question's session to continue (:class:`~lorenz.model.questions.SessionResume`
    as JSON): the agent resumes it with the rendered answer as its first input."""
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Specs of the host-side tools the controller executes (``linear_graphql``)."""
    controller_wait_ms: Annotated[int, Gt(0)] = 300_000
    """How long a call that needs the controller (a tool, the between-turn activity check)
    waits for one to attach before it is answered without it."""
    linger_ms: Annotated[int, Ge(0)] = 30_000
    """How long the worker keeps serving its final record for a controller to collect."""
    journal_max_bytes: Annotated[int, Ge(MIN_JOURNAL_MAX_BYTES)] = DEFAULT_JOURNAL_MAX_BYTES
    """Cap on the run's journal file (``worker.journal_max_bytes``): past it the middle
    records are replaced by one ``journal_dropped`` record (head and tail kept)."""

    def __post_init__(self) -> None:
        """The limits of each field (also of a spec the controller builds: it must never write
        one the worker refuses) and the checks that span fields."""
        check_limits(self)
        if self.version != SPEC_VERSION:
            raise SpecInvalid(
                f"version {self.version} is not the version this worker reads ({SPEC_VERSION})",
                path=("version",),
            )
        if not self.workspace.startswith("/"):
            raise SpecInvalid("must be an absolute path", path=("workspace",))
        if len(self.continuation_prompts) < self.max_turns - 1:
            raise SpecInvalid(
                f"continuation_prompts needs one prompt for each turn after the first "
                f"({self.max_turns - 1}), got {len(self.continuation_prompts)}",
                path=("continuation_prompts",),
            )
        # NB: keep in ``agent.env`` only what survived into ``env``: secrets never reach the
        # file. ``agent`` carries the kind's launch values as configured, and its ``env`` may
        # name a tracker key (``LINEAR_API_KEY: $LINEAR_API_KEY``, resolved). The controller
        # already stripped ``env`` of every secret by name and value; an entry of ``agent.env``
        # that is not in it with the same value was stripped, and is dropped here, as the
        # controller builds the spec, before it is written (``spec.json``, ssh's stdin).
        # Nothing reads ``agent.env`` in the worker: ``env`` is what the agent gets.
        kept = {k: v for k, v in self.agent.env.items() if self.env.get(k) == v}
        if kept != self.agent.env:
            object.__setattr__(self, "agent", dataclasses.replace(self.agent, env=kept))

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


def decode_spec(raw: str | bytes) -> RunSpec:
    """The run spec in the JSON document ``raw``; raises :class:`SpecInvalid` naming the field."""
    return read_json(RunSpec, raw)


def encode_spec(spec: RunSpec) -> bytes:
    """``spec`` as the JSON bytes :func:`decode_spec` reads (``spec.json``, ssh's stdin, the
    launcher's request)."""
    return encode_json(spec)


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
