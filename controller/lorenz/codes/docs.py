"""Render ``docs/errors.md`` from the error-code registry, so the page cannot drift from it.

The page is for browsing: an index of every area with its codes, then one table per area
(code, kind, meaning, what to do). Each code has an anchor of its own name, so other docs link
``errors.md#<code>``. ``tests/codes/test_registry.py`` compares the committed page with
:func:`render_error_docs`; regenerate it with ``python -m lorenz.codes.docs > docs/errors.md``.
"""

from __future__ import annotations

import sys

from lorenz.codes import CODE_DOCS, Area, ErrorCode, Kind

AREA_TITLES: dict[Area, str] = {
    Area.CONFIG: "Configuration: WORKFLOW.md, flags, features, environment",
    Area.TRACKER: "Trackers: Linear, GitHub, GitLab, Jira, issue files, memory",
    Area.AGENT: "Agents: the coding agent a run drives",
    Area.RUN: "Runs: how the runtime ends, skips or blocks a run",
    Area.BUDGET: "Budgets: token and dollar caps, model prices",
    Area.WORKER: "Workers: the detached process a run executes in",
    Area.WORKSPACE: "Workspaces: directories, git worktrees, hooks",
    Area.CLAIMS: "Claims: the claim store and what is restored from it",
    Area.DAEMON: "Daemon: leadership lease, control endpoint, attach commands",
    Area.SERVER: "Server: HTTP API, dashboard, metrics",
    Area.WEBHOOKS: "Webhooks: tracker deliveries to the server",
    Area.OPERATOR: "Operator: Kubernetes, its API, the Pods of runs",
    Area.GENERAL: "General",
}
"""The heading of each area's section, in page order."""

_INTRO = """\
# Error codes

<!-- Generated from lorenz/codes/catalog.py by `python -m lorenz.codes.docs`; do not edit. -->

Every error Lorenz reports carries a stable code: `lorenz validate` prints it, the HTTP API
answers `{"error": {"code": ..., "message": ...}}`, a Workflow's `Degraded` condition uses it
as its reason, and a failed run's `last_error` starts with `<code>: `. Codes never change once
released; messages may improve, and each message also says what to do.

Kinds: **error** — a command, a request, a start-up or a reload failed; **outcome** — a run
ended (or was skipped) with this code, and the retry policy decides what follows
(docs/scheduling.md). Codes named *Base code* belong to a family's base class and appear only
when nothing narrower fits.

Link to a code as `errors.md#<code>`. In code, name it as `ErrorCode.<NAME>`
(`from lorenz.codes import ErrorCode`). A new code is a member of `ErrorCode`
(`lorenz/codes/__init__.py`) plus its entry in `CODE_DOCS` (`lorenz/codes/catalog.py`, or
`lorenz/codes/services.py` for the services' areas); then regenerate this page with
`python -m lorenz.codes.docs > docs/errors.md` (`tests/codes/test_registry.py` checks both).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_error_docs() -> str:
    """The text of ``docs/errors.md``."""
    by_area: dict[Area, list[ErrorCode]] = {area: [] for area in AREA_TITLES}
    for code in sorted(ErrorCode, key=lambda c: c.value):
        by_area[CODE_DOCS[code].area].append(code)
    lines = [_INTRO, "## Areas", ""]
    for area, codes in by_area.items():
        if codes:
            links = ", ".join(f"[`{code.value}`](#{code.value})" for code in codes)
            lines.append(f"- [{AREA_TITLES[area]}](#{area.value}): {links}")
    for area, codes in by_area.items():
        if not codes:
            continue
        lines += [
            "",
            f'<a id="{area.value}"></a>',
            "",
            f"## {AREA_TITLES[area]}",
            "",
            "| code | kind | meaning | what to do |",
            "|---|---|---|---|",
        ]
        for code in codes:
            doc = CODE_DOCS[code]
            kind = "outcome" if doc.kind is Kind.OUTCOME else "error"
            lines.append(
                f'| <a id="{code.value}"></a>`{code.value}` | {kind} '
                f"| {_cell(doc.meaning)} | {_cell(doc.action)} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_error_docs())
