"""Errors a user can cause carry a stable code and a one-line message that says what to do.

Codes are part of the product's interface (docs, tests, ``lorenz validate`` output, Kubernetes
conditions): they never change once released. Messages may improve.
"""

from __future__ import annotations

import dataclasses
import re

from lorenz.codes import ErrorCode


class LorenzError(Exception):
    """Base of every coded error."""

    code: str = ErrorCode.LORENZ_ERROR

    def __init__(self, message: str, *, code: str | None = None, key_path: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.key_path = key_path
        """The config key the error is about, when there is one (``agent.max_turns``)."""

    def __str__(self) -> str:
        where = f" [{self.key_path}]" if self.key_path else ""
        return f"{self.code}{where}: {self.message}"


@dataclasses.dataclass(frozen=True, slots=True)
class RunFailure:
    """Why a run did not end cleanly: a stable code to decide on, and the text users see.

    Decisions (does this poison the worker host?) read ``code``; ``text`` goes into the retry
    entry, the run history and events, and is never parsed.
    """

    code: str
    text: str

    @classmethod
    def from_error(cls, error: LorenzError) -> RunFailure:
        """A coded error as a failure: ``<code>: <message>``."""
        return cls(code=error.code, text=f"{error.code}: {error.message}")

    def __str__(self) -> str:
        return self.text


_CODED_TEXT = re.compile(r"([a-z][a-z0-9_]*): ")


def stored_failure_code(text: str | None) -> str | None:
    """The code of a failure that storage kept only as text, or ``None``.

    A claim row (``last_error``) and the checkpoint's blocked slots keep a failure's text, not
    its code; a coded failure's text is ``<code>: <message>`` (:meth:`RunFailure.from_error`),
    so hydration reads the code back from it. Live failures carry their code and never come
    through here.

    NB: text of another form (``agent exited: …``, ``aborted: shutdown``) may give a word that
    is no code; decisions compare against the codes they know, so such a word decides nothing.
    """
    if text is None:
        return None
    match = _CODED_TEXT.match(text)
    return match.group(1) if match else None
