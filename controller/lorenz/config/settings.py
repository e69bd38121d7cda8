"""The one configuration schema: WORKFLOW.md front matter, the Workflow CRD spec, and the docs.

Every key is declared once, here, with its type, default, validation, a docstring (which
becomes the field description, and from there the JSON schema's and the CRD's — see
:mod:`lorenz.config.docstrings`), and a reload note in ``json_schema_extra``:

* ``hot`` — re-read on every tick or every use; a reload applies it at once;
* ``new-runs`` — read when a run starts; in-flight runs keep the old value;
* ``restart`` — read once at start-up (listeners, stores).

Validation is strict: an invalid value is an error naming its key path, never a silent fallback
to a default. Unknown keys inside a known section are errors (a typo must not pass silently);
unknown *top-level* keys are ignored with a warning by the loader (``lorenz.workflow``).

Two field markers drive the loader's ``$VAR`` resolution without a second list of keys:
``x-lorenz-env: secret`` (a whole-value ``$VAR`` is replaced by the variable's value, and an
empty result counts as missing) and ``x-lorenz-env: path`` (``$VAR`` and ``~`` expansion, then
relative paths resolve against the directory of WORKFLOW.md).
"""

from __future__ import annotations

import enum
import ipaddress
import re
import shlex
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from lorenz.codes import ErrorCode
from lorenz.config.docstrings import DocumentedModel
from lorenz.config.kinds import AgentLaunch, AgentProtocol, ApprovalMode, WorkspaceKind
from lorenz.config.pricing import (
    MODEL_UNPRICED,
    PRICING_INVALID,
    ModelPrice,
    PriceTable,
    PricingInvalid,
    parse_price_table,
)

RELOAD_KEY = "x-lorenz-reload"
ENV_KEY = "x-lorenz-env"
PASSTHROUGH_KEY = "x-lorenz-passthrough"

UNKNOWN_AGENT_KIND = ErrorCode.UNKNOWN_AGENT_KIND
"""The code of a setting that names an agent kind ``agents`` does not define."""

WORKER_POD_SETTINGS_UNUSED = ErrorCode.WORKER_POD_SETTINGS_UNUSED
"""The code of Pod settings given while ``worker.kind`` is not ``pod``."""
WORKER_KIND_CONFLICT = ErrorCode.WORKER_KIND_CONFLICT
"""The code of ``worker.kind: pod`` next to settings only local or SSH workers use."""
WORKER_POD_VALUE_INVALID = ErrorCode.WORKER_POD_VALUE_INVALID
"""The code of a Pod setting Kubernetes would refuse (a name, a quantity, a toleration)."""
WORKER_DETACHED_FALSE = ErrorCode.WORKER_DETACHED_FALSE
"""The code of ``worker.detached: false``: runs always execute in detached workers."""

CODED_CONFIG_ERRORS: frozenset[str] = frozenset(
    {
        UNKNOWN_AGENT_KIND,
        ErrorCode.RETRY_BACKOFF_ALIAS_CONFLICT,
        ErrorCode.RETRY_CANCEL_STATE_ACTIVE,
        ErrorCode.RETRY_CANCEL_STATE_MISSING,
        ErrorCode.RETRY_ESCALATION_EMPTY,
        ErrorCode.RETRY_ESCALATION_LABEL_REQUIRED,
        WORKER_POD_SETTINGS_UNUSED,
        WORKER_KIND_CONFLICT,
        WORKER_POD_VALUE_INVALID,
        WORKER_DETACHED_FALSE,
        PRICING_INVALID,
        ErrorCode.BUDGET_CANCEL_STATE_MISSING,
    }
)
"""Validation error types raised here whose type is also the stable code the loader reports
(instead of the generic ``invalid_workflow_config``); a ``key_path`` in the error's context
names the key."""


def _reload(mode: Literal["hot", "new-runs", "restart"], **extra: Any) -> dict[str, Any]:
    return {RELOAD_KEY: mode, **extra}


def _int_like(value: Any) -> Any:
    # NB: YAML gives real ints; accept decimal strings too ("30000"), but never bools or floats,
    # which pydantic's lax mode would otherwise coerce (True -> 1, 3.0 -> 3).
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    if isinstance(value, float):
        raise ValueError("must be an integer")
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?\d+", text):
            raise ValueError("must be an integer")
        return int(text)
    return value


Int = Annotated[int, BeforeValidator(_int_like)]
# NB: the constraint must come before the BeforeValidator. The other way round pydantic still
# validates correctly but writes a non-standard ``"gt": 0`` into the JSON schema (instead of
# ``exclusiveMinimum``), which the Kubernetes API server rejects in a CRD.
PositiveInt = Annotated[int, Field(gt=0), BeforeValidator(_int_like)]
NonNegativeInt = Annotated[int, Field(ge=0), BeforeValidator(_int_like)]
PortNumber = Annotated[int, Field(ge=0, le=65535), BeforeValidator(_int_like)]


def _strip_blank_to_none(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        return None
    return value


OptionalScript = Annotated[str | None, BeforeValidator(_strip_blank_to_none)]


class Section(DocumentedModel):
    """Base of every config section: unknown keys are errors, docstrings become descriptions."""

    # NB: defer_build — a section's validator is built when it is first used (inside
    # WorkflowSettings' schema, usually), not at import: ``lorenz validate`` starts faster, and
    # DocumentedModel needs it to add the docstrings before the schema exists.
    model_config = pydantic.ConfigDict(
        extra="forbid",
        validate_default=True,
        frozen=True,
        defer_build=True,
    )


class TrackerKind(enum.StrEnum):
    LINEAR = "linear"
    GITHUB = "github"
    FILES = "files"
    MEMORY = "memory"
    GITLAB = "gitlab"
    JIRA = "jira"


DEFAULT_ACTIVE_STATES = ("Todo", "In Progress")
DEFAULT_TERMINAL_STATES = ("Closed", "Cancelled", "Canceled", "Duplicate", "Done")


class TrackerSettings(Section):
    """Where issues come from and which of their states mean "work on it" or "done"."""

    kind: TrackerKind | None = Field(default=None, json_schema_extra=_reload("hot"))
    """The tracker adapter: ``linear``, ``github``, ``gitlab``, ``jira`` (Jira Cloud), ``files``
    (Markdown files in a folder) or ``memory`` (tests). Required before anything is dispatched."""

    endpoint: str | None = Field(default=None, json_schema_extra=_reload("hot"))
    """API endpoint. Defaults per kind: ``https://api.linear.app/graphql`` for linear,
    ``https://api.github.com`` for github, ``https://gitlab.com`` for gitlab (the instance URL;
    ``/api/v4`` is appended). For jira, the site URL (like ``https://example.atlassian.net``);
    required."""

    api_key: str | None = Field(
        default=None, json_schema_extra=_reload("hot", **{ENV_KEY: "secret"})
    )
    """API token, literal or ``$VAR``. When omitted, linear reads ``LINEAR_API_KEY``, github
    reads ``GITHUB_TOKEN``, gitlab ``GITLAB_TOKEN`` and jira ``JIRA_API_TOKEN``. A ``$VAR`` that
    resolves to an empty string counts as missing. In Kubernetes use ``apiKeySecretRef`` on the
    Workflow instead."""

    webhook_secret: str | None = Field(
        default=None, json_schema_extra=_reload("hot", **{ENV_KEY: "secret"})
    )
    """Webhook signing secret, literal or ``$VAR`` (a ``$VAR`` is best: keep it out of the
    file). Set, it turns on ``POST /api/v1/webhooks/<tracker kind>`` on the server (see
    docs/webhooks.md) and makes ``polling.interval_ms`` default to 300000 (5 min) instead of
    30000 unless ``polling.interval_ms`` is set: polling becomes the backstop for lost
    deliveries. Unset, the route answers 404. A ``$VAR`` that resolves to an empty string
    counts as unset. In Kubernetes use ``webhookSecretRef`` on the Workflow instead (the
    operator's webhook Service)."""

    project_slug: str | None = Field(default=None, json_schema_extra=_reload("hot"))
    """Linear project ``slugId`` (the last segment of the project URL), the Jira project key
    (``ENG`` for ``ENG-12``), or for gitlab the project's full path (``group/app``) or numeric
    id. Required for linear, jira and gitlab."""

    repository: str | None = Field(default=None, json_schema_extra=_reload("hot"))
    """GitHub ``owner/name``. Required for github."""

    email: str | None = Field(
        default=None, json_schema_extra=_reload("hot", **{ENV_KEY: "secret"})
    )
    """The Atlassian account email the jira API token belongs to (HTTP basic auth), literal or
    ``$VAR``; when omitted, jira reads ``JIRA_EMAIL``. Required for jira."""

    path: str | None = Field(default=None, json_schema_extra=_reload("hot", **{ENV_KEY: "path"}))
    """Folder of issue files for the ``files`` tracker (relative to WORKFLOW.md's folder)."""

    assignee: str | None = Field(
        default=None, json_schema_extra=_reload("hot", **{ENV_KEY: "secret"})
    )
    """Only issues assigned to this user id (``me`` = the token's user) are dispatchable."""

    active_states: tuple[str, ...] = Field(
        default=DEFAULT_ACTIVE_STATES, json_schema_extra=_reload("hot")
    )
    """States that mean "work on it"; compared trimmed and lowercased."""

    terminal_states: tuple[str, ...] = Field(
        default=DEFAULT_TERMINAL_STATES, json_schema_extra=_reload("hot")
    )
    """States that mean "done": runs stop and their workspaces are removed."""

    required_labels: tuple[str, ...] = Field(default=(), json_schema_extra=_reload("hot"))
    """An issue must carry every one of these labels to be dispatched or to keep running
    (compared trimmed and lowercased; a blank entry is an error)."""

    provider: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra=_reload("hot", **{PASSTHROUGH_KEY: True})
    )
    """Adapter-owned settings passed through unchanged (documented per tracker)."""

    @pydantic.field_validator("active_states", "terminal_states", "required_labels", mode="before")
    @classmethod
    def _lists_only(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("must be a YAML list of strings, not a single string")
        return value

    @pydantic.field_validator("active_states", "terminal_states")
    @classmethod
    def _no_blank_states(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not s.strip() for s in value):
            raise ValueError("state names must not be blank")
        return value

    @pydantic.field_validator("required_labels")
    @classmethod
    def _normalize_labels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for index, label in enumerate(value):
            norm = label.strip().lower()
            if not norm:
                # NB: dropping it would be worse than refusing it: a list of only blank entries
                # would silently turn the label gate off and dispatch every issue.
                raise ValueError(
                    f"entry {index} is blank; remove it or write the label's name"
                )
            seen.setdefault(norm, None)
        return tuple(seen)

    @pydantic.field_validator("endpoint")
    @classmethod
    def _endpoint_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank")
        return value


WEBHOOK_BACKSTOP_INTERVAL_MS = 300_000
"""``polling.interval_ms`` when ``tracker.webhook_secret`` is set and the interval is not."""


class PollingSettings(Section):
    """How often the tracker is polled."""

    interval_ms: PositiveInt = Field(default=30000, json_schema_extra=_reload("hot"))
    """Milliseconds between polls; takes effect when the next poll is scheduled."""

    dispatch_batch_ms: NonNegativeInt = Field(
        default=500, le=60000, json_schema_extra=_reload("hot")
    )
    """Between polls, how long freed capacity, clean exits and due retries are gathered
    before one by-id tracker read decides the exits and revalidates what will start."""


class WorkspaceSettings(Section):
    """Where each issue's isolated working directory lives."""

    root: str | None = Field(default=None, json_schema_extra=_reload("hot", **{ENV_KEY: "path"}))
    """Parent of all workspaces; relative to WORKFLOW.md's folder. Default:
    ``<system temp>/lorenz_workspaces``. A running issue keeps the path it was created with."""

    kind: WorkspaceKind = Field(default=WorkspaceKind.DIRECTORY, json_schema_extra=_reload("hot"))
    """``directory`` (a plain folder) or ``worktree`` (a git worktree of ``workspace.repo`` on
    branch ``lorenz/<identifier>``)."""

    repo: str | None = Field(default=None, json_schema_extra=_reload("hot", **{ENV_KEY: "path"}))
    """The git repository worktrees are made from (``kind: worktree`` only)."""

    base_ref: str = Field(default="HEAD", json_schema_extra=_reload("hot"))
    """The commit-ish new worktree branches start from."""

    @pydantic.model_validator(mode="after")
    def _worktree_needs_repo(self) -> WorkspaceSettings:
        if self.kind is WorkspaceKind.WORKTREE and not self.repo:
            raise ValueError("workspace.repo is required when workspace.kind is worktree")
        return self


class HooksSettings(Section):
    """Shell scripts run in the workspace around each run (``sh -lc``, cwd = workspace)."""

    after_create: OptionalScript = Field(default=None, json_schema_extra=_reload("hot"))
    """Runs once when a workspace is newly created; failure aborts the attempt and removes the
    new directory."""

    before_run: OptionalScript = Field(default=None, json_schema_extra=_reload("hot"))
    """Runs before every attempt; failure aborts the attempt."""

    after_run: OptionalScript = Field(default=None, json_schema_extra=_reload("hot"))
    """Runs after every attempt once the workspace exists; failure is logged and ignored."""

    before_remove: OptionalScript = Field(default=None, json_schema_extra=_reload("hot"))
    """Runs before a workspace is deleted; failure is logged and deletion goes ahead."""

    timeout_ms: PositiveInt = Field(default=60000, json_schema_extra=_reload("hot"))
    """Limit for each hook; the hook's process group is killed when it passes."""


class AgentSettings(Section):
    """Scheduling limits and which agent kind runs issues."""

    kind: str = Field(default="codex", json_schema_extra=_reload("new-runs"))
    """The ``agents.<kind>`` entry that runs issues no ``kind_by_label`` or ``kind_by_state``
    rule chooses (``codex`` is predefined)."""

    max_concurrent_agents: PositiveInt = Field(default=10, json_schema_extra=_reload("hot"))
    """Global cap on occupied slots (running plus reserved)."""

    max_concurrent_agents_by_state: dict[str, PositiveInt] = Field(
        default_factory=dict, json_schema_extra=_reload("hot")
    )
    """Per-state caps; keys are state names compared trimmed and lowercased."""

    max_retry_backoff_ms: PositiveInt = Field(default=300000, json_schema_extra=_reload("hot"))
    """Alias of ``retry.backoff.max_ms`` (the older spelling, still accepted): when only this
    key is set it caps the failure backoff; setting both to different values is an error."""

    max_turns: PositiveInt = Field(default=20, json_schema_extra=_reload("new-runs"))
    """Turns per run on one thread while the issue stays active."""

    max_continuation_runs: NonNegativeInt = Field(
        default=10, le=10000, json_schema_extra=_reload("hot")
    )
    """Continuation re-runs of one slot in a row: an agent that ends cleanly while its issue
    stays active is run again, and after this many such re-runs its next clean exit blocks the
    slot (``blocked`` lane, reason ``continuation_limit``) until a refresh or a change of the
    issue. A failure, or the issue leaving the candidates, starts the count again; ``0`` never
    blocks."""

    ensemble_size: PositiveInt = Field(default=1, le=16, json_schema_extra=_reload("hot"))
    """Slots per issue: each runs and retries independently."""

    terminal_grace_ms: NonNegativeInt = Field(default=60000, json_schema_extra=_reload("hot"))
    """How long a run whose issue turned terminal mid-turn may go on to finish that turn.

    Agents often move their own issue to Done and then push or comment: a poll seeing Done
    first must not kill them mid-push. No new turn starts; the run is cancelled if it is still
    going when this ends. ``0`` cancels at once."""

    concurrency: dict[str, NonNegativeInt] = Field(
        default_factory=dict, json_schema_extra=_reload("hot")
    )
    """Cap on occupied slots per agent kind (``{claude: 2, codex: 4}``), checked next to the
    global and per-state caps; ``0`` disables a kind (its issues wait). Kinds not listed get
    ``default_concurrency``. Every key must name a kind of ``agents``."""

    default_concurrency: NonNegativeInt | None = Field(
        default=None, json_schema_extra=_reload("hot")
    )
    """Cap for each kind not listed in ``concurrency``; unset: only the global and per-state
    caps apply (a single-agent workflow needs neither)."""

    kind_by_label: dict[str, str] = Field(default_factory=dict, json_schema_extra=_reload("hot"))
    """Agent kind per issue label (``{needs-claude: claude}``): an issue carrying one of these
    labels runs that kind; when it carries several, the first one listed here wins. Labels
    compare trimmed and lowercased."""

    kind_by_state: dict[str, str] = Field(default_factory=dict, json_schema_extra=_reload("hot"))
    """Agent kind per issue state (``{"in review": reviewer}``), for issues no label rule
    chose; states compare trimmed and lowercased. Issues no rule chooses run ``kind``."""

    @pydantic.field_validator("max_concurrent_agents_by_state")
    @classmethod
    def _normalize_state_caps(cls, value: dict[str, int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for state, cap in value.items():
            norm = state.strip().lower()
            if not norm:
                raise ValueError("state names must not be blank")
            out[norm] = cap
        return out

    @pydantic.field_validator("kind_by_label", "kind_by_state")
    @classmethod
    def _normalize_rule_keys(cls, value: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, kind in value.items():
            norm = name.strip().lower()
            if not norm:
                raise ValueError("label and state names must not be blank")
            if norm in out and out[norm] != kind:
                raise ValueError(
                    f"{name!r} appears twice (compared trimmed and lowercased) with different "
                    "kinds; keep one"
                )
            out[norm] = kind
        return out

    def referenced_kinds(self) -> list[tuple[str, str]]:
        """(key path, kind name) of every agent kind these settings name."""
        refs = [("agent.kind", self.kind)]
        refs.extend((f"agent.concurrency.{kind}", kind) for kind in self.concurrency)
        refs.extend((f"agent.kind_by_label.{label}", kind)
                    for label, kind in self.kind_by_label.items())
        refs.extend((f"agent.kind_by_state.{state}", kind)
                    for state, kind in self.kind_by_state.items())
        return refs


class TerminalAction(enum.StrEnum):
    """What happens to an issue whose slot has used up ``retry.max_attempts``."""

    BLOCK = "block"
    """Stop retrying; the slot waits in the ``blocked`` lane until a refresh or a change of
    the issue in the tracker."""
    ESCALATE = "escalate"
    """As ``block``, and tell the tracker once: a comment and/or a label on the issue."""
    CANCEL = "cancel"
    """Move the issue to ``retry.cancel_state``; the slot is released."""


class RetryBackoffSettings(Section):
    """Failure backoff: ``min(initial_ms * multiplier^(failures-1), max_ms)``."""

    initial_ms: PositiveInt = Field(default=10000, json_schema_extra=_reload("hot"))
    """Delay before the retry after the first failure."""
    multiplier: PositiveInt = Field(default=2, le=100, json_schema_extra=_reload("hot"))
    """Factor applied for each further consecutive failure (``1`` = a fixed delay)."""
    max_ms: PositiveInt = Field(default=300000, json_schema_extra=_reload("hot"))
    """Cap on any failure delay (``agent.max_retry_backoff_ms`` is an alias)."""


class RetryEscalationSettings(Section):
    """How ``terminal_action: escalate`` tells the tracker (at least one of the two)."""

    comment: bool = Field(default=True, json_schema_extra=_reload("hot"))
    """Post one comment on the issue saying why it stopped (with a hidden idempotency key, so a
    replay after a crash never posts it twice)."""
    label: str | None = Field(default="lorenz-blocked", json_schema_extra=_reload("hot"))
    """Label added to the issue (``null`` = none). A label in ``tracker.required_labels`` is
    refused: it would never be a change the operator made."""

    @pydantic.field_validator("label", mode="before")
    @classmethod
    def _blank_label_is_none(cls, value: Any) -> Any:
        return _strip_blank_to_none(value)

    @pydantic.model_validator(mode="after")
    def _says_something(self) -> RetryEscalationSettings:
        if not self.comment and self.label is None:
            raise PydanticCustomError(
                ErrorCode.RETRY_ESCALATION_EMPTY,
                "escalation needs a comment or a label; set comment: true or a label",
            )
        return self


class RetrySettings(Section):
    """Retry budget for failing runs and what happens when it is used up.

    Only *consecutive failures* of a slot count: a clean exit (a continuation) resets the count
    and never consumes the budget. An agent that asks for input or approval goes to the
    ``blocked`` lane at once, whatever the budget."""

    max_attempts: PositiveInt = Field(default=3, le=100, json_schema_extra=_reload("hot"))
    """Consecutive failures a slot may have; the next decision after the last one is the
    terminal action instead of another retry."""
    backoff: RetryBackoffSettings = Field(default_factory=RetryBackoffSettings)
    """Delay between failed attempts."""
    terminal_action: TerminalAction = Field(
        default=TerminalAction.BLOCK, json_schema_extra=_reload("hot")
    )
    """``block``, ``escalate`` or ``cancel`` (see the ``TerminalAction`` values)."""
    escalate: RetryEscalationSettings = Field(default_factory=RetryEscalationSettings)
    """Comment and label of ``terminal_action: escalate``."""
    cancel_state: str | None = Field(default=None, json_schema_extra=_reload("hot"))
    """The tracker state ``terminal_action: cancel`` moves the issue to (required then; must
    not be one of ``tracker.active_states``)."""

    @pydantic.field_validator("cancel_state", mode="before")
    @classmethod
    def _blank_state_is_none(cls, value: Any) -> Any:
        return _strip_blank_to_none(value)

    @pydantic.model_validator(mode="after")
    def _cancel_needs_state(self) -> RetrySettings:
        if self.terminal_action is TerminalAction.CANCEL and self.cancel_state is None:
            raise PydanticCustomError(
                ErrorCode.RETRY_CANCEL_STATE_MISSING,
                "terminal_action: cancel needs retry.cancel_state (the state to move the issue to)",
            )
        return self


DEFAULT_ANSWER_TEMPLATE = "The answer to your question: {{ answer }}"
"""``input.answer_template`` unless set."""


class InputSettings(Section):
    """Questions agents ask: the slot waits, the question goes to the tracker, the answer
    resumes the same session (docs/questions.md)."""

    waiting_state: str | None = Field(default=None, json_schema_extra=_reload("hot"))
    """Tracker state to move a waiting issue to (``null``: it stays where it is); one of
    ``tracker.active_states`` (an issue outside them is no candidate, and its slot would be
    released). The answer does not move it back: the resumed agent moves it on."""
    waiting_label: str | None = Field(default=None, json_schema_extra=_reload("hot"))
    """Label added to a waiting issue (``null``: none)."""
    timeout_ms: PositiveInt | None = Field(default=None, json_schema_extra=_reload("hot"))
    """How long a question may wait for its answer; past it the slot takes
    ``retry.terminal_action`` (``cancel`` counts as ``block``, as for every question).
    ``null``: it waits for ever."""
    answer_template: str = Field(
        default=DEFAULT_ANSWER_TEMPLATE, min_length=1, max_length=20_000,
        json_schema_extra=_reload("hot"),
    )
    """The resumed turn's input, a strict Liquid template over ``answer`` (the text),
    ``question`` (the question's text) and ``issue`` (as in the prompt)."""
    answer_authors: tuple[str, ...] | None = Field(default=None, json_schema_extra=_reload("hot"))
    """Who may answer on the tracker (comment authors as the tracker names them: login, email
    or display name; compared case-insensitively). ``null``: anyone but Lorenz itself. The CLI,
    the API and the dashboard are authenticated by the server's own rules instead."""

    @pydantic.field_validator("waiting_state", "waiting_label", mode="before")
    @classmethod
    def _blank_is_none(cls, value: Any) -> Any:
        return _strip_blank_to_none(value)


def _usd(value: Any) -> Any:
    # NB: a dollar amount from YAML: ints and floats, never bools (True would be $1).
    if isinstance(value, bool):
        raise ValueError("must be a number of USD, not a boolean")
    return value


Usd = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False), BeforeValidator(_usd)]


class BudgetSettings(Section):
    """Spend caps: tokens and dollars per run, per issue and per UTC day (``0`` = no cap).

    Usage is counted as the agent reports it; dollars are priced with ``pricing`` (or the
    agent's own ``cost_usd``, which wins). A run that crosses a cap is stopped within one usage
    update (``budget_exhausted``, not retried, ``on_exhausted`` runs once); an issue at its cap,
    or any issue while the day's budget is spent, is not dispatched (the ``budget`` lane).
    See docs/budgets.md."""

    max_tokens_per_run: NonNegativeInt = Field(default=0, json_schema_extra=_reload("hot"))
    """Tokens one attempt of one slot may use; ``0`` = no cap."""
    max_tokens_per_issue: NonNegativeInt = Field(default=0, json_schema_extra=_reload("hot"))
    """Tokens all attempts and slots of one issue may use, across restarts; ``0`` = no cap."""
    max_usd_per_issue: Usd = Field(default=0.0, json_schema_extra=_reload("hot"))
    """USD all attempts and slots of one issue may spend, across restarts; ``0`` = no cap."""
    max_usd_per_day: Usd = Field(default=0.0, json_schema_extra=_reload("hot"))
    """USD the whole workflow may spend per UTC day; ``0`` = no cap."""
    on_exhausted: TerminalAction = Field(
        default=TerminalAction.BLOCK, json_schema_extra=_reload("hot")
    )
    """What happens to an issue whose run crossed a cap: ``block``, ``escalate`` or ``cancel``
    (the ``retry.terminal_action`` values; ``escalate`` uses ``retry.escalate``, ``cancel``
    uses ``retry.cancel_state``)."""
    warn_at: float = Field(
        default=0.8, gt=0, le=1, allow_inf_nan=False, json_schema_extra=_reload("hot")
    )
    """Share of a cap after which a ``budget_warning`` event and metric are emitted."""

    @property
    def caps_any(self) -> bool:
        """Whether any cap, of tokens or of dollars, is set."""
        return self.caps_usd or self.max_tokens_per_run > 0 or self.max_tokens_per_issue > 0

    @property
    def caps_usd(self) -> bool:
        """Whether a dollar cap is set (then every model needs a price)."""
        return self.max_usd_per_issue > 0 or self.max_usd_per_day > 0


def _price_table(value: Any) -> Any:
    try:
        entries = parse_price_table(value, where="pricing")
    except PricingInvalid as exc:
        # NB: a custom error type, so the loader reports it under its own code.
        raise PydanticCustomError(
            PRICING_INVALID,
            "{reason}; each entry is a map of input, output and optionally "
            "cached_input, in USD per million tokens",
            {"key_path": exc.key_path, "reason": exc.message},
        ) from None
    return {pattern: price.to_dict() for pattern, price in entries}


class ModelPriceSettings(Section):
    """USD per million tokens of the models a ``pricing`` glob matches."""

    input: float = Field(ge=0, allow_inf_nan=False, json_schema_extra=_reload("hot"))
    """A prompt token read fresh."""
    cached_input: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, json_schema_extra=_reload("hot")
    )
    """A prompt token read from the provider's prompt cache; unset = ``input``."""
    output: float = Field(ge=0, allow_inf_nan=False, json_schema_extra=_reload("hot"))
    """A generated token (reasoning tokens included)."""

    def as_price(self) -> ModelPrice:
        cached = self.input if self.cached_input is None else self.cached_input
        return ModelPrice(input=self.input, cached_input=cached, output=self.output)


PriceMap = Annotated[dict[str, ModelPriceSettings], BeforeValidator(_price_table)]


_MODEL_OPTION = re.compile(r"^(?:--model|-m)(?:=(?P<value>.+))?$")
_CODEX_MODEL_OVERRIDE = re.compile(r"^model\s*=\s*[\"']?(?P<value>[^\"']+)[\"']?$")


def command_model(command: str) -> str | None:
    """The model a command line names (``--model X``, ``-m X``, Codex ``-c model=X``)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for index, word in enumerate(words):
        following = words[index + 1] if index + 1 < len(words) else None
        option = _MODEL_OPTION.match(word)
        if option is not None:
            return option.group("value") or following
        if word in ("-c", "--config") and following is not None:
            override = _CODEX_MODEL_OVERRIDE.match(following.strip())
            if override is not None:
                return override.group("value")
    return None


class AgentKindSettings(Section):
    """One agent kind: how to launch it and how to talk to it."""

    command: str = Field(min_length=1, json_schema_extra=_reload("new-runs"))
    """Shell command, run with ``bash -lc`` in the workspace; kept verbatim."""

    login_shell: bool = Field(default=True, json_schema_extra=_reload("new-runs"))
    """Run ``command`` in a login shell (``bash -lc``, the default the specification names:
    the user's profiles set up PATH, version managers and the like); ``false`` runs it with
    ``bash -c``, which skips the profiles and their cost on every run (tens of ms for a lean
    profile, seconds for one that runs ``pyenv init`` or ``nvm``), for a command whose
    environment needs no profile."""

    protocol: AgentProtocol = Field(
        default=AgentProtocol.CODEX_APP_SERVER, json_schema_extra=_reload("new-runs")
    )
    """Wire protocol: ``codex-app-server``, ``acp``, ``claude-stream-json`` or ``command``."""

    stall_timeout_ms: Int = Field(default=300000, json_schema_extra=_reload("hot"))
    """A run with no agent event for this long is stalled and retried; ``<= 0`` disables."""

    turn_timeout_ms: PositiveInt = Field(default=3600000, json_schema_extra=_reload("new-runs"))
    """Limit for one turn."""

    read_timeout_ms: PositiveInt = Field(default=5000, json_schema_extra=_reload("new-runs"))
    """Limit for each request/response during the handshake, once the agent answered its
    first request (its start-up has its own limit, ``startup_timeout_ms``)."""

    startup_timeout_ms: PositiveInt = Field(default=60000, json_schema_extra=_reload("new-runs"))
    """Limit for the agent's first answer (``initialize``): the command's start-up (the login
    shell ``bash -lc``, the agent's own start) plus that answer. A slow shell profile or a
    loaded machine can take seconds before the agent reads its first line, which
    ``read_timeout_ms`` must not count; past this the run fails with ``startup_timeout``."""

    approvals: ApprovalMode = Field(
        default=ApprovalMode.DENY, json_schema_extra=_reload("new-runs")
    )
    """How approval and permission requests are answered."""

    approval_policy: Any = Field(
        default=None, json_schema_extra=_reload("new-runs", **{PASSTHROUGH_KEY: True})
    )
    """Codex ``approvalPolicy`` passed through unchanged (string or map)."""

    thread_sandbox: str | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """Codex thread sandbox mode (``read-only``, ``workspace-write``, ``danger-full-access``)."""

    turn_sandbox_policy: dict[str, Any] | None = Field(
        default=None, json_schema_extra=_reload("new-runs", **{PASSTHROUGH_KEY: True})
    )
    """Codex turn ``sandboxPolicy`` passed through unchanged."""

    env: dict[str, str] = Field(default_factory=dict, json_schema_extra=_reload("new-runs"))
    """Extra environment for the agent process (tracker secrets are always stripped)."""

    @pydantic.field_validator("command")
    @classmethod
    def _command_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    def launch(self) -> AgentLaunch:
        """What a run needs of this kind, as the worker holds it (no pydantic there)."""
        return AgentLaunch(**{name: getattr(self, name) for name in type(self).model_fields})


DEFAULT_CODEX_COMMAND = "codex app-server"


class CodexSettings(Section):
    """Symphony-compatible ``codex`` section; it defines (or overrides) ``agents.codex``."""

    command: str = Field(
        default=DEFAULT_CODEX_COMMAND, min_length=1, json_schema_extra=_reload("new-runs")
    )
    """Shell command of the Codex app-server."""
    approval_policy: Any = Field(
        default=None, json_schema_extra=_reload("new-runs", **{PASSTHROUGH_KEY: True})
    )
    """Codex ``approvalPolicy``, passed through."""
    thread_sandbox: str | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """Codex thread sandbox mode."""
    turn_sandbox_policy: dict[str, Any] | None = Field(
        default=None, json_schema_extra=_reload("new-runs", **{PASSTHROUGH_KEY: True})
    )
    """Codex turn ``sandboxPolicy``, passed through."""
    turn_timeout_ms: PositiveInt = Field(default=3600000, json_schema_extra=_reload("new-runs"))
    """Limit for one turn."""
    read_timeout_ms: PositiveInt = Field(default=5000, json_schema_extra=_reload("new-runs"))
    """Limit for each handshake request after the first answer."""
    startup_timeout_ms: PositiveInt = Field(default=60000, json_schema_extra=_reload("new-runs"))
    """Limit for the app-server's start-up and first answer (``initialize``)."""
    stall_timeout_ms: Int = Field(default=300000, json_schema_extra=_reload("hot"))
    """Stall threshold; ``<= 0`` disables stall detection."""

    @pydantic.field_validator("command")
    @classmethod
    def _command_not_blank(cls, value: str) -> str:
        # NB: without this, a blank command fails later, inside the model validator that builds
        # ``agents.codex``, and the error would name ``command`` instead of ``codex.command``.
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    def as_agent_kind(self) -> AgentKindSettings:
        return AgentKindSettings(
            command=self.command,
            protocol=AgentProtocol.CODEX_APP_SERVER,
            stall_timeout_ms=self.stall_timeout_ms,
            turn_timeout_ms=self.turn_timeout_ms,
            read_timeout_ms=self.read_timeout_ms,
            startup_timeout_ms=self.startup_timeout_ms,
            approval_policy=self.approval_policy,
            thread_sandbox=self.thread_sandbox,
            turn_sandbox_policy=self.turn_sandbox_policy,
        )


class WorkerPoolSettings(Section):
    """A worker pool that hands out hosts (two-phase dispatch)."""

    acquire_timeout_ms: PositiveInt = Field(default=30000, json_schema_extra=_reload("hot"))
    """Limit for acquiring a host; reservations expire after twice this plus 60 s."""
    drain_deadline_ms: PositiveInt = Field(default=30000, json_schema_extra=_reload("restart"))
    """Bound on draining the pool at shutdown."""


_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.@-]+)(:\d{1,5})?$")


class WorkerKind(enum.StrEnum):
    LOCAL = "local"
    POD = "pod"


class ImagePullPolicy(enum.StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


# Kubernetes' own grammars: a DNS-1123 subdomain (Secret and ServiceAccount names), a label key
# (prefix/name) and value, and a resource quantity (``500m``, ``1Gi``, ``2e3``).
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_RESERVED_VOLUMES = frozenset({"spec", "state", "workspace", "home", "tmp"})
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?)$")
_QUANTITY = re.compile(
    r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)


def _pod_value_error(key_path: str, message: str, **values: Any) -> PydanticCustomError:
    """``message`` with ``{name!r}``-style fields filled from ``values``, as a coded error.

    NB: a custom error type, so the loader reports it under its own code and key path; the
    text is formatted here because pydantic's templates know no ``!r`` (it only substitutes
    ``{key_path}``, which the text cannot contain: values are shown quoted).
    """
    text = message.format(**values)
    return PydanticCustomError(WORKER_POD_VALUE_INVALID, text, {"key_path": key_path})


def _dns_subdomain(value: str, *, key_path: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise _pod_value_error(
            key_path,
            "{name!r} is not a Kubernetes object name (lowercase letters, digits, '-' and '.', "
            "at most 253 characters)",
            name=value,
        )
    return value


def _label_key(value: str, *, key_path: str) -> str:
    prefix, _, name = value.rpartition("/")
    if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))) or not (
        _LABEL_NAME.match(name)
    ):
        raise _pod_value_error(
            key_path, "{name!r} is not a Kubernetes label key ([prefix/]name)", name=value
        )
    return value


class PodResourcesSettings(Section):
    """Compute resources of the run's container, as Kubernetes quantities."""

    requests: dict[str, str] = Field(default_factory=dict, json_schema_extra=_reload("new-runs"))
    """What the scheduler reserves for the run (``{cpu: 500m, memory: 1Gi}``)."""
    limits: dict[str, str] = Field(default_factory=dict, json_schema_extra=_reload("new-runs"))
    """What the run may use at most (over the memory limit: OOMKilled, a failure retry)."""

    @pydantic.model_validator(mode="after")
    def _quantities(self) -> PodResourcesSettings:
        for where, values in (("requests", self.requests), ("limits", self.limits)):
            for name, quantity in values.items():
                _label_key(name, key_path=f"worker.pod_template.resources.{where}")
                if not _QUANTITY.match(str(quantity).strip()):
                    raise _pod_value_error(
                        f"worker.pod_template.resources.{where}.{name}",
                        "{quantity!r} is not a Kubernetes quantity (e.g. 500m, 2, 1Gi)",
                        quantity=quantity,
                    )
        return self


class TolerationOperator(enum.StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class TolerationSettings(Section):
    """A Kubernetes toleration of the run's Pod (the same fields as a Pod spec's)."""

    key: str | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """The taint key; unset with ``operator: Exists`` tolerates every taint."""
    operator: TolerationOperator = Field(
        default=TolerationOperator.EQUAL, json_schema_extra=_reload("new-runs")
    )
    """``Equal`` (key and value match) or ``Exists`` (the key is enough)."""
    value: str | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """The taint value (``Equal`` only)."""
    effect: TaintEffect | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """``NoSchedule``, ``PreferNoSchedule`` or ``NoExecute``; unset matches all three."""
    toleration_seconds: NonNegativeInt | None = Field(
        default=None, json_schema_extra=_reload("new-runs")
    )
    """For ``NoExecute``: how long the Pod stays bound after the taint appears."""

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> TolerationSettings:
        where = "worker.pod_template.tolerations"
        if self.operator is TolerationOperator.EXISTS and self.value:
            raise _pod_value_error(where, "operator Exists takes no value; drop the value")
        if self.key is None and self.operator is not TolerationOperator.EXISTS:
            raise _pod_value_error(where, "a toleration without a key needs operator Exists")
        if self.toleration_seconds is not None and self.effect is not TaintEffect.NO_EXECUTE:
            raise _pod_value_error(where, "toleration_seconds needs effect NoExecute")
        if self.key is not None:
            _label_key(self.key, key_path=f"{where}.key")
        return self

    def manifest(self) -> dict[str, Any]:
        """The toleration as a Pod spec writes it."""
        out: dict[str, Any] = {"operator": self.operator.value}
        if self.key is not None:
            out["key"] = self.key
        if self.value is not None:
            out["value"] = self.value
        if self.effect is not None:
            out["effect"] = self.effect.value
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


ClaimAccessMode = Literal["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"]

POD_RESERVED_PATHS: tuple[str, ...] = (
    "/var/run/lorenz/spec",
    "/var/lib/lorenz/run",
    "/var/lib/lorenz/workspaces",
    "/home/lorenz",
    "/tmp",
)
"""The mount paths of a run's Pod that Lorenz owns (the spec, the worker's state, the
workspace, ``HOME`` and ``/tmp``); ``lorenz.kube.pods`` mounts exactly these."""


def _reserved_overlap(path: str) -> str | None:
    """The reserved path ``path`` would hide or enter, if any."""
    clean = path.rstrip("/") or "/"
    for reserved in POD_RESERVED_PATHS:
        if clean == reserved or reserved.startswith(clean.rstrip("/") + "/"):
            return reserved
        if reserved in POD_RESERVED_PATHS[:3] and clean.startswith(reserved + "/"):
            return reserved
    return None


class PodVolumeSettings(Section):
    """One extra volume of the run's Pod, and where its container mounts it (exactly one of
    ``secret``, ``config_map``, ``persistent_volume_claim``, ``empty_dir``)."""

    name: str = Field(min_length=1, max_length=63, json_schema_extra=_reload("new-runs"))
    """The volume's name in the Pod (a DNS label; not ``spec``, ``state``, ``workspace``,
    ``home`` or ``tmp``)."""
    mount_path: str = Field(min_length=1, json_schema_extra=_reload("new-runs"))
    """An absolute path in the container; never one of Lorenz's own (``/tmp``,
    ``/home/lorenz``, the workspace, state and spec folders), a folder above them, or one
    inside the workspace, state or spec folder (``/home/lorenz/.config`` is fine)."""
    read_only: bool = Field(default=False, json_schema_extra=_reload("new-runs"))
    """Mount it read-only."""
    secret: str | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """A Secret of the Workflow's namespace, one file per key."""
    config_map: str | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """A ConfigMap of the Workflow's namespace, one file per key."""
    persistent_volume_claim: str | None = Field(
        default=None, json_schema_extra=_reload("new-runs")
    )
    """A PersistentVolumeClaim of the Workflow's namespace (every run of the Workflow mounts
    it: a shared cache, never a workspace)."""
    empty_dir: EmptyDirSettings | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """A fresh ``emptyDir`` per run."""

    @pydantic.model_validator(mode="after")
    def _valid(self) -> PodVolumeSettings:
        where = f"worker.pod_template.volumes.{self.name}"
        if not _DNS_LABEL.match(self.name) or self.name in _RESERVED_VOLUMES:
            raise _pod_value_error(
                where, "{name!r} is not a volume name of its own (a DNS label, not one of "
                "spec, state, workspace, home, tmp)", name=self.name,
            )
        if not self.mount_path.startswith("/") or "/../" in f"{self.mount_path}/":
            raise _pod_value_error(
                f"{where}.mount_path", "{path!r} is not an absolute path", path=self.mount_path
            )
        reserved = _reserved_overlap(self.mount_path)
        if reserved is not None:
            raise _pod_value_error(
                f"{where}.mount_path", "{path!r} overlaps {reserved!r}, which Lorenz mounts; "
                "choose another path", path=self.mount_path, reserved=reserved,
            )
        sources = [
            value for value in (self.secret, self.config_map, self.persistent_volume_claim,
                                self.empty_dir) if value is not None
        ]
        if len(sources) != 1:
            raise _pod_value_error(
                where, "name exactly one of secret, config_map, persistent_volume_claim, "
                "empty_dir",
            )
        for key in ("secret", "config_map", "persistent_volume_claim"):
            value = getattr(self, key)
            if isinstance(value, str):
                _dns_subdomain(value, key_path=f"{where}.{key}")
        return self

    def manifest(self) -> dict[str, Any]:
        """The volume as a Pod spec writes it."""
        source: dict[str, Any]
        if self.secret is not None:
            source = {"secret": {"secretName": self.secret}}
        elif self.config_map is not None:
            source = {"configMap": {"name": self.config_map}}
        elif self.persistent_volume_claim is not None:
            source = {"persistentVolumeClaim": {"claimName": self.persistent_volume_claim,
                                                "readOnly": self.read_only}}
        else:
            assert self.empty_dir is not None
            source = {"emptyDir": self.empty_dir.manifest()}
        return {"name": self.name, **source}

    def mount(self) -> dict[str, Any]:
        """The container's volumeMount of it."""
        return {"name": self.name, "mountPath": self.mount_path, "readOnly": self.read_only}


class EmptyDirSettings(Section):
    """A fresh volume per attempt, removed with the Pod."""

    size_limit: str | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """The most the workspace may hold (a quantity, ``10Gi``); over it the Pod is evicted."""
    medium: Literal["", "Memory"] = Field(default="", json_schema_extra=_reload("new-runs"))
    """``""`` (the node's disk) or ``Memory`` (tmpfs, counted against the memory limit)."""

    @pydantic.field_validator("size_limit")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None and not _QUANTITY.match(value.strip()):
            raise _pod_value_error(
                "worker.workspace.empty_dir.size_limit",
                "{quantity!r} is not a Kubernetes quantity (e.g. 10Gi)",
                quantity=value,
            )
        return value

    def manifest(self) -> dict[str, Any]:
        """The ``emptyDir`` source as a Pod spec writes it."""
        out: dict[str, Any] = {}
        if self.size_limit:
            out["sizeLimit"] = self.size_limit
        if self.medium:
            out["medium"] = self.medium
        return out


class PodTemplateSettings(Section):
    """What the run's Pod is made of (``worker.kind: pod``)."""

    image: str | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """The image that runs ``lorenz worker`` and the agent: ``FROM`` the Lorenz image plus the
    agent and the repositories' toolchain (docs/install.md). Unset: the operator's own image,
    which has no agent but ``command`` agents that ship with it."""
    image_pull_policy: ImagePullPolicy | None = Field(
        default=None, json_schema_extra=_reload("new-runs")
    )
    """``Always``, ``IfNotPresent`` or ``Never``; unset: Kubernetes' default for the tag."""
    resources: PodResourcesSettings = Field(default_factory=PodResourcesSettings)
    """Requests and limits of the run's container."""
    node_selector: dict[str, str] = Field(
        default_factory=dict, json_schema_extra=_reload("new-runs")
    )
    """Node labels the run's node must carry."""
    tolerations: tuple[TolerationSettings, ...] = Field(
        default=(), json_schema_extra=_reload("new-runs")
    )
    """Taints the run's Pod tolerates."""
    affinity: dict[str, Any] | None = Field(
        default=None, json_schema_extra=_reload("new-runs", **{PASSTHROUGH_KEY: True})
    )
    """A Kubernetes ``affinity`` (node, Pod and anti-affinity), passed to the Pod unchanged;
    the API server checks it when the Pod is created (a refusal fails the run with its
    reason)."""
    runtime_class_name: str | None = Field(
        default=None, max_length=253, json_schema_extra=_reload("new-runs")
    )
    """A RuntimeClass of the cluster (``gvisor``, ``kata``) for the run's Pod: a sandboxed
    runtime puts a kernel boundary between the agent and the node. Passed to the Pod as
    ``runtimeClassName``; the platform team provides the RuntimeClass and its handler on the
    nodes (the API server refuses a Pod that names one that does not exist)."""
    env_from_secrets: tuple[Annotated[str, Field(max_length=253)], ...] = Field(
        default=(), max_length=32, json_schema_extra=_reload("new-runs")
    )
    """Secrets of the Workflow's namespace whose keys become the agent's environment (a
    model provider's key, say). Never the tracker's Secret: the tracker token stays in the
    operator."""

    volumes: tuple[PodVolumeSettings, ...] = Field(
        default=(), max_length=16, json_schema_extra=_reload("new-runs")
    )
    """Extra volumes mounted in the run's container: a Secret, a ConfigMap, a claim of the
    Workflow's namespace or an ``emptyDir`` (an agent's configuration, a shared cache). No
    other kind: a run's Pod never mounts the node's disk or a ServiceAccount token."""

    @pydantic.model_validator(mode="after")
    def _names(self) -> PodTemplateSettings:
        if self.image is not None and not self.image.strip():
            raise _pod_value_error("worker.pod_template.image", "must not be blank")
        names = [volume.name for volume in self.volumes]
        for name in names:
            if names.count(name) > 1:
                raise _pod_value_error(
                    "worker.pod_template.volumes", "the volume name {name!r} is used twice",
                    name=name,
                )
        for name in self.env_from_secrets:
            _dns_subdomain(name, key_path="worker.pod_template.env_from_secrets")
        if self.runtime_class_name is not None:
            _dns_subdomain(
                self.runtime_class_name, key_path="worker.pod_template.runtime_class_name"
            )
        for key, value in self.node_selector.items():
            _label_key(key, key_path="worker.pod_template.node_selector")
            if len(value) > 63 or not _LABEL_VALUE.match(value):
                raise _pod_value_error(
                    f"worker.pod_template.node_selector.{key}",
                    "{value!r} is not a Kubernetes label value",
                    value=value,
                )
        return self


class VolumeClaimTemplateSettings(Section):
    """The PersistentVolumeClaim made for each issue's workspace."""

    storage: str = Field(default="10Gi", json_schema_extra=_reload("new-runs"))
    """The size the claim requests (a quantity, ``10Gi``)."""
    storage_class_name: str | None = Field(default=None, json_schema_extra=_reload("new-runs"))
    """The claim's StorageClass; unset: the cluster's default class, ``""``: none (it binds
    only to a PersistentVolume made beforehand)."""
    access_modes: tuple[ClaimAccessMode, ...] = Field(
        default=("ReadWriteOnce",), min_length=1, json_schema_extra=_reload("new-runs")
    )
    """The claim's access modes (``ReadWriteOnce``: the attempts of one issue run one at a
    time, so the node of the newest one mounts it)."""

    @pydantic.model_validator(mode="after")
    def _valid(self) -> VolumeClaimTemplateSettings:
        if not _QUANTITY.match(self.storage.strip()):
            raise _pod_value_error(
                "worker.workspace.volume_claim_template.storage",
                "{quantity!r} is not a Kubernetes quantity (e.g. 10Gi)",
                quantity=self.storage,
            )
        if self.storage_class_name:
            _dns_subdomain(
                self.storage_class_name,
                key_path="worker.workspace.volume_claim_template.storage_class_name",
            )
        return self


class PodWorkspaceSettings(Section):
    """Where the workspace of a run in a Pod lives: a fresh ``emptyDir`` per attempt (the
    default), or one PersistentVolumeClaim per issue, kept across its attempts."""

    empty_dir: EmptyDirSettings = Field(default_factory=EmptyDirSettings)
    """An ``emptyDir`` volume: fresh per attempt, never shared with another run."""
    volume_claim_template: VolumeClaimTemplateSettings | None = Field(
        default=None, json_schema_extra=_reload("new-runs")
    )
    """Set: each issue's workspace is a claim of its own (one per slot with
    ``agent.ensemble_size`` > 1), made from this template by the operator, named after the
    Workflow and the issue, kept across the issue's attempts and deleted when the issue is
    terminal or the Workflow is deleted. It is never shared with another issue, Workflow or
    namespace."""

    @pydantic.model_validator(mode="after")
    def _one_kind(self) -> PodWorkspaceSettings:
        if self.volume_claim_template is not None and "empty_dir" in self.model_fields_set:
            raise _pod_value_error(
                "worker.workspace",
                "set either empty_dir or volume_claim_template, not both",
            )
        return self


def _cidr(value: str, *, key_path: str) -> str:
    try:
        return str(ipaddress.ip_network(value.strip(), strict=True))
    except ValueError:
        raise _pod_value_error(
            key_path,
            "{cidr!r} is not a network in CIDR notation with its host bits zero "
            "(e.g. 203.0.113.0/24, 0.0.0.0/0, 2001:db8::/32)",
            cidr=value,
        ) from None


class EgressRuleSettings(Section):
    """One destination a run Pod may open connections to (``kind: pod``), besides DNS."""

    cidr: str = Field(max_length=64, json_schema_extra=_reload("new-runs"))
    """The destination network (``203.0.113.0/24``; ``0.0.0.0/0`` for anywhere — then list
    the cluster's own networks in ``except_cidrs``: run Pods never reach the API server, the
    operator or another namespace through a rule of the operator's own, but a CIDR you give
    is taken as given)."""
    except_cidrs: tuple[str, ...] = Field(
        default=(), max_length=32, json_schema_extra=_reload("new-runs")
    )
    """Networks inside ``cidr`` that stay out of reach (the Pod and Service networks)."""
    ports: tuple[Annotated[int, Field(ge=1, le=65535)], ...] = Field(
        default=(), max_length=32, json_schema_extra=_reload("new-runs")
    )
    """Destination ports; empty = every port."""
    protocol: Literal["TCP", "UDP"] = Field(default="TCP", json_schema_extra=_reload("new-runs"))
    """The protocol of ``ports``."""

    @pydantic.field_validator("cidr")
    @classmethod
    def _network(cls, value: str) -> str:
        return _cidr(value, key_path="worker.egress.cidr")

    @pydantic.field_validator("except_cidrs")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_cidr(one, key_path="worker.egress.except_cidrs") for one in value)

    def manifest(self) -> dict[str, Any]:
        """The NetworkPolicy egress rule (``to`` one ipBlock, on ``ports``)."""
        block: dict[str, Any] = {"cidr": self.cidr}
        if self.except_cidrs:
            block["except"] = list(self.except_cidrs)
        rule: dict[str, Any] = {"to": [{"ipBlock": block}]}
        if self.ports:
            rule["ports"] = [{"port": port, "protocol": self.protocol} for port in self.ports]
        return rule


class WorkerSettings(Section):
    """Where runs execute: locally, or on SSH hosts."""

    ssh_hosts: tuple[str, ...] = Field(default=(), json_schema_extra=_reload("hot"))
    """``host``, ``user@host`` or ``host:port`` (``[v6]:port``) entries; empty means run
    locally. With hosts, every run starts ``lorenz worker`` on one of them over ssh (the
    least-loaded first; a retry goes back to its host while it has room) and never on this
    machine; its workspace lives there, under the same ``workspace.root``."""
    max_concurrent_agents_per_host: PositiveInt | None = Field(
        default=None, json_schema_extra=_reload("hot")
    )
    """Cap on running slots per SSH host; unset means no per-host cap."""
    worker_pool: WorkerPoolSettings = Field(default_factory=WorkerPoolSettings)
    """Pool-governed dispatch. No shipped runner builds a pool yet, so these keys change
    nothing today; the reservation step of Pod placement is meant to use them."""
    ssh_config: str | None = Field(
        default=None, json_schema_extra=_reload("hot", **{ENV_KEY: "path"})
    )
    """An ssh client configuration file (passed as ``ssh -F``; relative to WORKFLOW.md's
    folder); unset: ssh's own (``~/.ssh/config``)."""
    remote_command: str = Field(
        default="lorenz worker", min_length=1, json_schema_extra=_reload("hot")
    )
    """How ``lorenz worker`` is started on an SSH host (split as a shell would; the remote
    login shell runs it), e.g. ``/opt/lorenz/bin/lorenz worker``."""
    remote_state_root: str = Field(
        default="~/.lorenz/workers", min_length=1, json_schema_extra=_reload("hot")
    )
    """Where workers keep their state directories on SSH hosts (``~`` is the remote user's
    home); keep it short: it holds unix sockets, whose paths are limited to 107 bytes."""
    kind: WorkerKind = Field(default=WorkerKind.LOCAL, json_schema_extra=_reload("new-runs"))
    """Where each run executes: ``local`` (a worker on this machine, or on ``ssh_hosts``;
    in the operator, inside the operator's Pod: unisolated, it shares the operator's filesystem
    and ServiceAccount with every Workflow's agents) or ``pod`` (a Pod of its own in the
    Workflow's namespace, built from ``pod_template``; see docs/operator.md). Outside the
    operator only ``local`` exists and is the default; in the operator a Workflow that names
    no kind gets ``pod``, and ``local`` must be chosen explicitly."""
    pod_template: PodTemplateSettings = Field(default_factory=PodTemplateSettings)
    """The run's Pod (``kind: pod``)."""
    service_account_name: str | None = Field(
        default=None, json_schema_extra=_reload("new-runs")
    )
    """The ServiceAccount of the run's Pod (``kind: pod``); its token is never mounted
    (``automountServiceAccountToken: false``). Unset: ``lorenz-agent``, which the operator
    creates in the Workflow's namespace when it is missing (no RBAC binding, no token
    mounted). Never the operator's own."""
    workspace: PodWorkspaceSettings = Field(default_factory=PodWorkspaceSettings)
    """The run's workspace volume (``kind: pod``)."""
    egress: tuple[EgressRuleSettings, ...] = Field(
        default=(), max_length=32, json_schema_extra=_reload("new-runs")
    )
    """Where the run's Pod may connect besides DNS (``kind: pod``), e.g. the git host and the
    model API: the operator keeps a NetworkPolicy per Workflow that admits no ingress to its
    run Pods and, as egress, only DNS (port 53 to the ``kube-system`` namespace) and these
    rules. Empty: DNS only. Enforced only where the cluster's network plugin enforces
    NetworkPolicies (docs/operator.md)."""
    start_timeout_ms: PositiveInt = Field(default=120000, json_schema_extra=_reload("new-runs"))
    """How long a run's Pod may take to be scheduled, pull its image and serve the worker
    (``kind: pod``); past it the Pod is deleted and the run fails with the reason."""
    journal_max_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024 * 1024, json_schema_extra=_reload("restart")
    )
    """Cap on one run's journal file (``journal.jsonl`` in its worker state directory), in
    bytes; at least 1 MiB. Past it the worker keeps the head (the first half of the cap: the
    run's start, hooks and session) and the newest records (a quarter of the cap), and puts
    one ``journal_dropped`` record between them counting what was dropped (see
    docs/runs.md). The final record is always kept. Local runs read it at start-up."""
    detached: bool | None = Field(default=None, json_schema_extra=_reload("restart"))
    """Each run on this machine executes in a detached ``lorenz worker`` (its own session,
    journal and socket) that outlives this process: after a crash, ``kill -9``, upgrade or
    leadership change the next controller adopts it instead of starting the agent again. Always
    so, on a single host and in the operator: unset and ``true`` mean workers, ``false`` is
    refused (``worker_detached_false``; see docs/runs.md)."""

    @pydantic.field_validator("service_account_name")
    @classmethod
    def _service_account(cls, value: str | None) -> str | None:
        if value is not None:
            _dns_subdomain(value, key_path="worker.service_account_name")
        return value

    @pydantic.model_validator(mode="after")
    def _kind_agrees(self) -> WorkerSettings:
        if self.detached is False:
            # NB: an in-process agent dies with its controller, so a restart, a crash or a
            # leadership change would cost its run: the failure mode workers remove.
            raise PydanticCustomError(
                WORKER_DETACHED_FALSE,
                "{key_path}: false is refused: runs always execute in detached workers "
                "(docs/runs.md); delete worker.detached or set it to true",
                {"key_path": "worker.detached"},
            )
        pod_only = [
            name
            for name in ("pod_template", "service_account_name", "workspace", "start_timeout_ms")
            if name in self.model_fields_set
        ]
        if self.kind is not WorkerKind.POD and pod_only:
            raise PydanticCustomError(
                WORKER_POD_SETTINGS_UNUSED,
                "{key_path} only applies to runs in Pods; set worker.kind: pod or remove it",
                {"key_path": f"worker.{pod_only[0]}"},
            )
        if self.kind is WorkerKind.POD:
            for name in ("ssh_hosts", "detached"):
                if name in self.model_fields_set and getattr(self, name):
                    raise PydanticCustomError(
                        WORKER_KIND_CONFLICT,
                        "{key_path} does not apply with worker.kind: pod, the operator's "
                        "default (every run is a worker in its own Pod); remove it or set "
                        "worker.kind: local",
                        {"key_path": f"worker.{name}"},
                    )
        return self

    @pydantic.field_validator("ssh_hosts")
    @classmethod
    def _valid_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for host in value:
            if not _HOST_RE.match(host.strip()):
                raise ValueError(f"not a host or host:port: {host!r}")
        return tuple(h.strip() for h in value)


class ServerSettings(Section):
    """The HTTP API, dashboard and metrics server."""

    port: PortNumber | None = Field(default=None, json_schema_extra=_reload("restart"))
    """Port to listen on; unset = no server, ``0`` = an ephemeral port. CLI ``--port`` wins."""
    host: str = Field(default="127.0.0.1", min_length=1, json_schema_extra=_reload("restart"))
    """Address to bind."""
    allowed_hosts: tuple[str, ...] = Field(default=(), json_schema_extra=_reload("restart"))
    """Extra names the server answers to in the ``Host`` header, ``name`` (any port) or
    ``name:port`` (``[v6]:port``), e.g. a reverse proxy's name. Loopback (``localhost``,
    ``127.0.0.1``, ``[::1]``) and the bound address with the bound port always are; any other
    name is refused with ``host_not_allowed`` (DNS rebinding)."""

    @pydantic.field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part for part in value.split(",") if part.strip())
        return value

    @pydantic.field_validator("allowed_hosts")
    @classmethod
    def _valid_allowed_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for host in value:
            if not _HOST_RE.match(host.strip()) or "@" in host:
                raise ValueError(f"not a host name or host:port: {host!r}")
        return tuple(h.strip().lower() for h in value)


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


class LoggingSettings(Section):
    """Process logs and the event log file."""

    log_file: str | None = Field(
        default=None, json_schema_extra=_reload("hot", **{ENV_KEY: "path"})
    )
    """File that runtime events are appended to (JSON lines)."""
    format: LogFormat = Field(default=LogFormat.TEXT, json_schema_extra=_reload("restart"))
    """``text`` or ``json`` (one JSON object per line)."""
    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", json_schema_extra=_reload("restart")
    )
    """Minimum level of process logs."""


class ClaimStoreBackend(enum.StrEnum):
    MEMORY = "memory"
    SQLITE = "sqlite"
    TURSO = "turso"


class ClaimStoreSettings(Section):
    """Claim persistence. Set only through flags (``claim_store.*``), never as a section."""

    backend: ClaimStoreBackend = Field(
        default=ClaimStoreBackend.MEMORY, json_schema_extra=_reload("restart")
    )
    """``memory`` (process lifetime), ``sqlite`` or ``turso`` (durable, same host)."""
    path: str = Field(default="", json_schema_extra=_reload("restart"))
    """Store file; empty = ``<workspace.root>/.lorenz/claim-store/<sha256>/claims.db``."""
    owner_stale_ms: NonNegativeInt = Field(default=0, json_schema_extra=_reload("restart"))
    """Heartbeat age after which another owner's claims are recovered; 0 = store default."""
    recovery_interval_ms: PositiveInt = Field(default=5000, json_schema_extra=_reload("restart"))
    """How often a running Lorenz with a durable store takes over stale or dead owners' claims."""


class DaemonSettings(Section):
    """The long-lived daemon (feature ``daemon``)."""

    enabled: bool = Field(default=False, json_schema_extra=_reload("restart"))
    """Take the leadership lease and serve control endpoints."""
    heartbeat_ms: PositiveInt = Field(default=5000, json_schema_extra=_reload("restart"))
    """How often the lease heartbeat is written."""
    stale_ms: PositiveInt = Field(default=30000, json_schema_extra=_reload("restart"))
    """Heartbeat age after which an unverifiable lease is stale."""


class WorkflowSettings(DocumentedModel):
    """The whole front matter of WORKFLOW.md (and the spec of a Kubernetes ``Workflow``)."""

    model_config = pydantic.ConfigDict(
        extra="forbid", validate_default=True, frozen=True, defer_build=True
    )

    tracker: TrackerSettings = Field(default_factory=TrackerSettings)
    """Issue source."""
    polling: PollingSettings = Field(default_factory=PollingSettings)
    """Poll cadence."""
    workspace: WorkspaceSettings = Field(default_factory=WorkspaceSettings)
    """Per-issue workspaces."""
    hooks: HooksSettings = Field(default_factory=HooksSettings)
    """Workspace lifecycle scripts."""
    agent: AgentSettings = Field(default_factory=AgentSettings)
    """Scheduling limits and the agent kind to run."""
    retry: RetrySettings = Field(default_factory=RetrySettings)
    """Failure backoff, retry budget and terminal action."""
    agents: dict[str, AgentKindSettings] = Field(default_factory=dict)
    """Agent kinds by name; ``codex`` is predefined from the ``codex`` section."""
    codex: CodexSettings = Field(default_factory=CodexSettings)
    """Symphony compatibility: defines ``agents.codex`` unless ``agents.codex`` is given."""
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    """Where runs execute."""
    server: ServerSettings = Field(default_factory=ServerSettings)
    """HTTP server."""
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    """Logs."""
    claim_store: ClaimStoreSettings = Field(default_factory=ClaimStoreSettings)
    """Claim persistence (filled from flags by the loader)."""
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    """Daemon mode (filled from flags and features by the loader)."""
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    """Spend caps in tokens and USD (see docs/budgets.md)."""
    input: InputSettings = Field(default_factory=InputSettings)
    """Agents' questions: the waiting lane and its answers (see docs/questions.md)."""
    pricing: PriceMap = Field(default_factory=dict, json_schema_extra=_reload("hot"))
    """USD per million tokens by model name glob, ``{input, cached_input, output}``; looked up
    before the shipped default table (``lorenz/config/prices.yaml``). The agent's own cost, when
    it reports one, wins over any price."""

    def price_table(self) -> PriceTable:
        """``pricing`` over the shipped defaults."""
        return PriceTable.with_defaults(
            {pattern: price.as_price() for pattern, price in self.pricing.items()}
        )

    def pricing_warnings(self) -> tuple[str, ...]:
        """Coded warnings about prices: a configured model without one while a dollar cap is set.

        The configured model is what an agent kind's command names (``--model``, ``-m``, Codex
        ``-c model=...``); a kind that names none is priced by the model its agent reports."""
        found: list[str] = []
        if not self.budget.caps_usd:
            return tuple(found)
        table = self.price_table()
        for name, kind in sorted(self.effective_agents().items()):
            model = command_model(kind.command)
            if model is not None and table.price_for(model) is None:
                found.append(
                    f"{MODEL_UNPRICED}: agents.{name} runs model {model!r}, which has no price "
                    "while a dollar cap is set; add it under pricing (its tokens still count "
                    "against token caps)"
                )
        return tuple(found)

    def agent_kind(self, name: str | None = None) -> AgentKindSettings:
        """The settings of agent kind ``name`` (default: ``agent.kind``)."""
        kinds = self.effective_agents()
        key = name or self.agent.kind
        if key not in kinds:
            raise KeyError(key)
        return kinds[key]

    def effective_agents(self) -> dict[str, AgentKindSettings]:
        """``agents`` with ``codex`` filled in from the Symphony ``codex`` section."""
        kinds = dict(self.agents)
        kinds.setdefault("codex", self.codex.as_agent_kind())
        return kinds

    @pydantic.model_validator(mode="after")
    def _retry_settings_agree(self) -> WorkflowSettings:
        alias = self.agent.max_retry_backoff_ms
        backoff = self.retry.backoff
        if "max_retry_backoff_ms" in self.agent.model_fields_set:
            if "max_ms" in backoff.model_fields_set and backoff.max_ms != alias:
                raise PydanticCustomError(
                    ErrorCode.RETRY_BACKOFF_ALIAS_CONFLICT,
                    "agent.max_retry_backoff_ms ({alias}) is an alias of retry.backoff.max_ms "
                    "({max_ms}); keep only retry.backoff.max_ms",
                    {"alias": alias, "max_ms": backoff.max_ms},
                )
            if backoff.max_ms != alias:
                # NB: frozen models; the alias is folded in once, here, so every reader uses
                # retry.backoff.max_ms only.
                retry = self.retry.model_copy(
                    update={"backoff": backoff.model_copy(update={"max_ms": alias})}
                )
                object.__setattr__(self, "retry", retry)
        cancel = self.retry.cancel_state
        if self.retry.terminal_action is TerminalAction.CANCEL and cancel is not None:
            active = {state.strip().lower() for state in self.tracker.active_states}
            if cancel.strip().lower() in active:
                raise PydanticCustomError(
                    ErrorCode.RETRY_CANCEL_STATE_ACTIVE,
                    "retry.cancel_state {state!r} is an active state, so the issue would run "
                    "again; name a state outside tracker.active_states",
                    {"state": cancel},
                )
        waiting = self.input.waiting_state
        if waiting is not None:
            active = {state.strip().lower() for state in self.tracker.active_states}
            if waiting.strip().lower() not in active:
                raise PydanticCustomError(
                    ErrorCode.INPUT_WAITING_STATE_INACTIVE,
                    "input.waiting_state {state!r} is not an active state, so a waiting issue "
                    "would be released; add it to tracker.active_states",
                    {"state": waiting},
                )
        label = self.retry.escalate.label
        if label is not None and label.strip().lower() in self.tracker.required_labels:
            raise PydanticCustomError(
                ErrorCode.RETRY_ESCALATION_LABEL_REQUIRED,
                "retry.escalate.label {label!r} is one of tracker.required_labels; pick "
                "another label",
                {"label": label},
            )
        return self

    @pydantic.model_validator(mode="after")
    def _webhooks_make_polling_a_backstop(self) -> WorkflowSettings:
        if self.tracker.webhook_secret and "interval_ms" not in self.polling.model_fields_set:
            # NB: frozen models; folded in once, here, so every reader of polling.interval_ms
            # (the runtime, the status, `lorenz config`) sees the effective default.
            polling = self.polling.model_copy(
                update={"interval_ms": WEBHOOK_BACKSTOP_INTERVAL_MS}
            )
            object.__setattr__(self, "polling", polling)
        return self

    @pydantic.model_validator(mode="after")
    def _budget_cancel_has_state(self) -> WorkflowSettings:
        if (
            self.budget.on_exhausted is TerminalAction.CANCEL
            and self.retry.cancel_state is None
        ):
            raise PydanticCustomError(
                ErrorCode.BUDGET_CANCEL_STATE_MISSING,
                "{key_path} cancel needs retry.cancel_state (the state to move the issue to)",
                {"key_path": "budget.on_exhausted"},
            )
        return self

    @pydantic.model_validator(mode="after")
    def _pod_workspaces_are_folders(self) -> WorkflowSettings:
        if self.worker.kind is WorkerKind.POD and self.workspace.kind is WorkspaceKind.WORKTREE:
            raise PydanticCustomError(
                WORKER_KIND_CONFLICT,
                "{key_path} worktree needs workspace.repo on the controller's disk, which a "
                "run's Pod (worker.kind: pod, the operator's default) does not have; use "
                "workspace.kind: directory and clone in hooks.after_create",
                {"key_path": "workspace.kind"},
            )
        return self

    @pydantic.model_validator(mode="after")
    def _agent_kinds_defined(self) -> WorkflowSettings:
        kinds = self.effective_agents()
        for where, kind in self.agent.referenced_kinds():
            if kind not in kinds:
                # NB: a custom error type, so the loader reports it under its own code.
                raise PydanticCustomError(
                    UNKNOWN_AGENT_KIND,
                    "{key_path} {quoted} is not defined in agents (known: {known}); define "
                    "agents.{kind} or name a known kind",
                    {"key_path": where, "kind": kind, "quoted": repr(kind),
                     "known": ", ".join(sorted(kinds))},
                )
        return self


TOP_LEVEL_SECTIONS: frozenset[str] = frozenset(WorkflowSettings.model_fields)
FLAG_ONLY_SECTIONS: frozenset[str] = frozenset({"claim_store", "daemon"})
