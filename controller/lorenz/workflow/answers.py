"""The resumed turn's input: an answer rendered through ``input.answer_template``.

Strict like the prompt (:mod:`lorenz.workflow.prompts`): an unknown variable or filter raises
``template_render_error``, so a typo never sends the agent half an answer. The template sees
``answer`` (the text a person gave), ``question`` (the agent's question) and ``issue``.
"""

from __future__ import annotations

from liquid import Environment, StrictUndefined
from liquid.exceptions import LiquidError

from lorenz.model import Issue
from lorenz.workflow.errors import TemplateRenderError

ANSWER_TEMPLATE_VARIABLES: tuple[str, ...] = ("answer", "question", "issue")

_ENVIRONMENT = Environment(undefined=StrictUndefined, strict_filters=True, autoescape=False)


def render_answer(template: str, *, answer: str, question: str, issue: Issue) -> str:
    """``template`` rendered for one answer; raises :class:`TemplateRenderError`."""
    try:
        return _ENVIRONMENT.from_string(template).render(
            answer=answer, question=question, issue=issue.to_template_dict()
        )
    except LiquidError as exc:
        raise TemplateRenderError(
            f"input.answer_template failed to render ({exc}); it sees only "
            f"{', '.join(ANSWER_TEMPLATE_VARIABLES)}",
            key_path="input.answer_template",
        ) from exc
