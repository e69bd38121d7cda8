"""An agent's question, and the answer that resumes it: plain data every layer shares.

A runner that sees its agent ask for input (Codex ``item/tool/requestUserInput``, an ACP
permission request the policy cannot answer, Claude Code's ``AskUserQuestion``) captures an
:class:`AgentQuestion` and ends the run with it; the question crosses the worker boundary in
the final record (:meth:`AgentQuestion.to_json`), waits in the orchestrator's ``waiting`` lane
(persisted in the claim store's checkpoint) and is posted to the tracker. The answer comes back
as a :class:`SessionResume`: the next run of the slot continues the saved session with it.

Everything read back from outside (a final record, a checkpoint) goes through
:meth:`AgentQuestion.from_json`, which bounds every field and returns ``None`` for anything
it cannot use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

QUESTION_TEXT_LIMIT: Final = 8_000
"""Characters of a question's text kept (a longer one is cut, marked with an ellipsis)."""

OPTION_LIMIT: Final = 20
"""Options kept per question."""

OPTION_TEXT_LIMIT: Final = 500

ANSWER_TEXT_LIMIT: Final = 20_000
"""The longest answer accepted (from the tracker, the CLI, the API or the dashboard)."""


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (the cut marked with ``…``)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentQuestion:
    """What an agent asked, and where to resume it."""

    text: str
    """The question as the agent put it (several questions of one request joined by lines)."""
    options: tuple[str, ...] = ()
    """The choices the agent offered (labels), when it offered any."""
    session_id: str | None = None
    """The session to resume: the Codex thread id, the Claude Code session id, the ACP session
    id (``None``: the protocol keeps no session; the answer starts a new one)."""
    turn: int = 1
    """The turn of the run in which the agent asked."""
    source: str = ""
    """What carried the question (``item/tool/requestUserInput``, ``AskUserQuestion``,
    ``session/request_permission``)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "options": list(self.options),
            "session_id": self.session_id,
            "turn": self.turn,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, raw: Any) -> AgentQuestion | None:
        """The inverse of :meth:`to_json`, bounded; ``None`` for anything unreadable."""
        if not isinstance(raw, Mapping):
            return None
        text = raw.get("text")
        if not isinstance(text, str) or not text.strip():
            return None
        options = raw.get("options") or []
        session = raw.get("session_id")
        turn = raw.get("turn", 1)
        source = raw.get("source") or ""
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            return None
        if session is not None and (not isinstance(session, str) or len(session) > 1000):
            return None
        if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
            return None
        if not isinstance(source, str):
            return None
        return cls(
            text=clip(text, QUESTION_TEXT_LIMIT),
            options=tuple(clip(o, OPTION_TEXT_LIMIT) for o in options[:OPTION_LIMIT]),
            session_id=session or None,
            turn=turn,
            source=clip(source, 200),
        )


def question_parts(params: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The question texts and option labels of an input request or notification:
    ``requestUserInput``'s ``questions[{header, question, options[{label}]}]``, an
    elicitation's ``message``, or a notification's ``message`` / ``question`` / ``prompt``."""
    texts: list[str] = []
    options: list[str] = []
    questions = params.get("questions")
    if isinstance(questions, list):
        for item in questions[:10]:
            if not isinstance(item, Mapping):
                continue
            header, question = item.get("header"), item.get("question")
            parts = [p for p in (header, question) if isinstance(p, str) and p.strip()]
            if parts:
                texts.append(" — ".join(parts) if len(parts) == 2 else parts[0])
            offered = item.get("options")
            if isinstance(offered, list):
                for option in offered[:20]:
                    label = option.get("label") if isinstance(option, Mapping) else option
                    if isinstance(label, str) and label.strip():
                        options.append(label.strip())
    for key in ("message", "question", "prompt", "text"):
        value = params.get(key)
        if isinstance(value, str) and value.strip():
            texts.append(value)
            break
    return texts, options


def question_of(
    *,
    texts: list[str],
    options: list[str],
    session_id: str | None,
    turn: int,
    source: str,
) -> AgentQuestion:
    """A question from what a protocol carried (empty texts say that something was asked)."""
    text = "\n".join(t.strip() for t in texts if t and t.strip())
    return AgentQuestion(
        text=clip(text or f"The agent asked for input ({source}).", QUESTION_TEXT_LIMIT),
        options=tuple(clip(o, OPTION_TEXT_LIMIT) for o in options if o)[:OPTION_LIMIT],
        session_id=session_id,
        turn=turn,
        source=source,
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionResume:
    """A saved session to continue, with the rendered answer as the first turn's input."""

    session_id: str | None
    """The session the question was asked in (``None``: none was kept; a new one starts)."""
    answer: str
    """The answer as a person gave it."""
    text: str
    """The resumed turn's input: the answer rendered through ``input.answer_template``."""
    question: AgentQuestion
    """The question it answers (for a runner that must start a new session, the summary)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "answer": self.answer,
            "text": self.text,
            "question": self.question.to_json(),
        }

    @classmethod
    def from_json(cls, raw: Any) -> SessionResume | None:
        if not isinstance(raw, Mapping):
            return None
        question = AgentQuestion.from_json(raw.get("question"))
        session = raw.get("session_id")
        answer, text = raw.get("answer"), raw.get("text")
        if question is None or not isinstance(answer, str) or not isinstance(text, str):
            return None
        if session is not None and not isinstance(session, str):
            return None
        return cls(
            session_id=session or None,
            answer=clip(answer, ANSWER_TEXT_LIMIT),
            text=clip(text, ANSWER_TEXT_LIMIT * 2),
            question=question,
        )


def new_session_summary(resume: SessionResume) -> str:
    """The first input of a *new* session standing in for one that cannot be resumed (an ACP
    agent without ``loadSession``, a question asked before any session existed): what was asked,
    then the rendered answer. The workspace still holds the earlier run's work."""
    lines = [
        "You are continuing earlier work in this workspace; the session it ran in could not be "
        "resumed. In that session you asked:",
        "",
        resume.question.text,
    ]
    if resume.question.options:
        lines += ["", "Options offered: " + "; ".join(resume.question.options)]
    lines += ["", resume.text]
    return "\n".join(lines)
