"""The two writes a tracker does for the retry budget's terminal actions (``retry.*``).

``escalate`` leaves one comment and/or one label on an issue; ``cancel`` moves it to a state.
Both may be replayed: the runtime applies an action, then records its receipt, and a crash in
between replays the action on the next start. So an escalation carries an idempotency key, the
comment embeds it as an invisible marker (an HTML comment, which every tracker's Markdown
renderer hides), and the adapter looks for the marker before posting: a replay posts nothing.
Adding a label that is already there, and moving an issue to the state it is in, change nothing
by themselves.
"""

from __future__ import annotations

import re
from typing import Protocol, runtime_checkable

from lorenz.model import Issue

ESCALATION_MARKER_RE = re.compile(r"<!-- lorenz-escalation: (lz-[0-9a-f]{1,64}) -->")
MAX_COMMENT_PAGES = 10
"""How many pages of an issue's comments are searched for an earlier escalation."""


def escalation_marker(key: str) -> str:
    """The invisible marker an escalation comment carries."""
    return f"<!-- lorenz-escalation: {key} -->"


def with_marker(body: str, *, key: str) -> str:
    """``body`` as posted: the marker first, then the text."""
    return f"{escalation_marker(key)}\n{body}"


def has_marker(text: str | None, *, key: str) -> bool:
    """Whether ``text`` (a comment body, an issue file) carries the marker of ``key``."""
    return bool(text) and escalation_marker(key) in (text or "")


@runtime_checkable
class IssueWriter(Protocol):
    """A tracker that can apply the terminal actions (Linear, GitHub, files, memory)."""

    async def escalate_issue(
        self, issue: Issue, *, key: str, comment: str | None, label: str | None
    ) -> bool:
        """Post ``comment`` (marked with ``key``) unless a comment with that key is already
        there, and add ``label`` unless the issue has it. ``True`` when anything was written."""
        ...

    async def move_issue_to_state(self, issue: Issue, *, state: str) -> None:
        """Move the issue to ``state`` (a name from the tracker's settings)."""
        ...
