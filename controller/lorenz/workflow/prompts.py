"""Strict prompt rendering: the WORKFLOW.md body is a Liquid template over ``issue``, ``attempt``.

Strictness is the point. A typo such as ``{{ issue.titel }}`` must fail the run attempt loudly
(``template_render_error``), never send the agent a prompt with a hole in it. python-liquid does
this with ``StrictUndefined`` (unknown variables and attributes raise, even inside ``{% if %}``)
and ``strict_filters`` (unknown filters raise). Because an undefined variable raises even in a
test, the optional inputs are always passed, ``None`` when they do not apply.

Template variables, exactly:

* ``issue`` — the normalized issue (:meth:`lorenz.model.Issue.to_template_dict`): strings keys,
  ISO-8601 timestamps, ``labels`` a list, ``blocked_by`` a list of ``{id, identifier, state}``;
* ``attempt`` — ``None`` on a first run, else the 1-based retry or continuation count;
* ``retry_kind`` — ``None`` on a first run, else ``"continuation"`` or ``"failure"`` (a Lorenz
  extension; templates written for the Symphony specification, see ``docs/architecture.md``,
  never need it).

The template is parsed once per workflow load and rendered per run. A parse error does not make
the workflow unloadable — as in Symphony, template errors fail only the run attempt — but
``lorenz validate`` reports it (and statically spots unknown variables and filters) through
:meth:`PromptTemplate.problems`.
"""

from __future__ import annotations

from typing import Any

from liquid import BoundTemplate, Environment, StrictUndefined
from liquid.exceptions import LiquidError, LiquidSyntaxError

from lorenz.model import Issue, RetryKind
from lorenz.workflow.errors import TemplateParseError, TemplateRenderError, WorkflowError

TEMPLATE_VARIABLES: tuple[str, ...] = ("issue", "attempt", "retry_kind")

DEFAULT_PROMPT_TEMPLATE = """\
You are working on an issue from the configured tracker.

Identifier: {{ issue.identifier }}
Title: {{ issue.title }}

{% if issue.description %}{{ issue.description }}{% else %}No description provided.{% endif %}
"""
"""Used when the WORKFLOW.md body is empty."""

_ENVIRONMENT = Environment(undefined=StrictUndefined, strict_filters=True, autoescape=False)

_ISSUE_KEYS: frozenset[str] = frozenset(
    Issue(id="x", identifier="x", title="x", state="x").to_template_dict()
)


class PromptTemplate:
    """A parsed prompt body, rendered once per run."""

    def __init__(self, source: str, *, first_line: int = 1) -> None:
        self.source = source
        """The body as written (trimmed); empty means the default template is used."""
        self.is_default = not source.strip()
        self.text = DEFAULT_PROMPT_TEMPLATE if self.is_default else source
        """The template actually rendered."""
        self.first_line = first_line
        """Line of WORKFLOW.md the body starts on, so errors can name file lines."""
        self._template: BoundTemplate | None = None
        self._parse_error: TemplateParseError | None = None
        try:
            self._template = _ENVIRONMENT.from_string(self.text)
        except LiquidError as exc:
            self._parse_error = TemplateParseError(
                f"prompt template does not parse ({self._describe(exc)}); fix the Liquid syntax "
                "in the WORKFLOW.md body",
                key_path="prompt",
            )
            self._parse_error.__cause__ = exc

    @property
    def parse_error(self) -> TemplateParseError | None:
        return self._parse_error

    def render(
        self, *, issue: Issue, attempt: int | None = None, retry_kind: RetryKind | None = None
    ) -> str:
        """The prompt for one run; raises ``template_parse_error`` or ``template_render_error``."""
        if self._template is None:
            assert self._parse_error is not None
            raise self._parse_error
        context: dict[str, Any] = {
            "issue": issue.to_template_dict(),
            "attempt": attempt,
            "retry_kind": retry_kind.value if retry_kind is not None else None,
        }
        try:
            return self._template.render(**context)
        except LiquidError as exc:
            raise TemplateRenderError(
                f"prompt for {issue.identifier} failed to render ({self._describe(exc)}); "
                f"templates see only {', '.join(TEMPLATE_VARIABLES)}",
                key_path="prompt",
            ) from exc

    def problems(self) -> list[WorkflowError]:
        """What would fail at render time, found without an issue: a parse error, unknown
        filters, variables other than the template inputs, unknown ``issue.<field>``s."""
        if self._template is None:
            assert self._parse_error is not None
            return [self._parse_error]
        found: list[WorkflowError] = []
        analysis = self._template.analyze()
        for name, spans in analysis.filters.items():
            if name not in _ENVIRONMENT.filters:
                found.append(
                    TemplateRenderError(
                        f"unknown filter {name!r} at {self._where(spans[0].index)}",
                        key_path="prompt",
                    )
                )
        for name, variables in analysis.globals.items():
            if name not in TEMPLATE_VARIABLES:
                found.append(
                    TemplateRenderError(
                        f"unknown variable {name!r} at {self._where(variables[0].span.index)}; "
                        f"templates see only {', '.join(TEMPLATE_VARIABLES)}",
                        key_path="prompt",
                    )
                )
                continue
            if name != "issue":
                continue
            for variable in variables:
                segments = variable.segments
                field = segments[1] if len(segments) > 1 else None
                if isinstance(field, str) and field not in _ISSUE_KEYS:
                    found.append(
                        TemplateRenderError(
                            f"unknown issue field {field!r} at "
                            f"{self._where(variable.span.index)}; issue fields are "
                            f"{', '.join(sorted(_ISSUE_KEYS))}",
                            key_path="prompt",
                        )
                    )
        return found

    def _where(self, index: int) -> str:
        line = self.text.count("\n", 0, max(index, 0))
        if self.is_default:
            return f"line {line + 1} of the default prompt"
        return f"line {self.first_line + line}"

    def _describe(self, exc: LiquidError) -> str:
        token = getattr(exc, "token", None)
        message = getattr(exc, "message", None) or str(exc).splitlines()[0]
        index = getattr(token, "start_index", -1) if token is not None else -1
        if isinstance(index, int) and index >= 0:
            return f"{self._where(index)}: {message}"
        if isinstance(exc, LiquidSyntaxError):
            return f"{message} (at the end of the template)"
        return str(message)


def continuation_prompt(turn: int, max_turns: int) -> str:
    """Guidance for turns 2..``max_turns`` on the same thread (never the original prompt)."""
    return (
        f"Continuation turn {turn} of {max_turns}. Your previous turn ended normally, and the "
        "issue is still in an active state, so the work is not finished. Pick up from the "
        "current state of the workspace (and any notes you left there) rather than starting "
        "over; the original task has not changed, so there is no need to restate it. Keep "
        "going until the issue is done, and stop only if you are genuinely blocked."
    )
