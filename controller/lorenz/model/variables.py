"""The ``LORENZ_*`` variables that tell a run's hooks and its agent which run they belong to.

Hooks (run by :mod:`lorenz.workspaces`) and agents (started by :mod:`lorenz.runtime`) both get
the issue, the attempt, the slot and the workspace; each used to write the block itself, so a
variable added to one went missing from the other. Both build it here. What only one of them
gets is added by that one: ``LORENZ_HOOK`` (the hook's name) by the workspace manager;
``LORENZ_WORKFLOW`` and ``LORENZ_TRACKER_PATH`` by the runtime.
"""

from __future__ import annotations

import os


def run_variables(
    *,
    issue_id: str,
    identifier: str,
    title: str,
    state: str,
    attempt: int | None,
    slot_index: int,
    workspace: str | os.PathLike[str],
) -> dict[str, str]:
    """The variables of one run: ``attempt`` is empty for a first run (``None``)."""
    return {
        "LORENZ_ISSUE_ID": issue_id,
        "LORENZ_ISSUE_IDENTIFIER": identifier,
        "LORENZ_ISSUE_TITLE": title,
        "LORENZ_ISSUE_STATE": state,
        "LORENZ_ATTEMPT": "" if attempt is None else str(attempt),
        "LORENZ_SLOT": str(slot_index),
        "LORENZ_WORKSPACE": os.fspath(workspace),
    }
