"""What a run hands its agent, and what becomes of what the agent reports back.

The agent of a run (in its detached worker) gets an environment (this process's, the kind's
``env`` and the run's variables, minus tracker secrets), a question it may ask between turns
(is the issue still active?), a launch callback, and a callback for its updates, which are
scrubbed of secrets and applied to the orchestrator's running entry in the background.
Apart from dispatching (which claims, spawns and settles runs) because these are the run's
conversation with its agent while it runs, not the decisions around it.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from lorenz.agents.environment import agent_environment
from lorenz.config import AgentKindSettings, TrackerKind
from lorenz.model import AgentUpdate, Issue, SlotKey
from lorenz.model.variables import run_variables
from lorenz.runtime.parts import RuntimeParts
from lorenz.runtime.reconciling import Reconciling
from lorenz.runtime.runs import ActiveRun
from lorenz.tasks import run_to_completion

logger = logging.getLogger("lorenz.runtime")


class AgentCalls:
    """The callbacks and the environment a run's agent gets (see the module docstring)."""

    def __init__(self, *, parts: RuntimeParts, reconciling: Reconciling) -> None:
        self._parts = parts
        self._reconciling = reconciling

    def agent_env(
        self,
        *,
        issue: Issue,
        attempt: int | None,
        slot_index: int,
        workspace: Path,
        kind: AgentKindSettings | None = None,
        remote: bool = False,
    ) -> dict[str, str]:
        """The agent's environment: this process's (``base_env``) with the kind's ``env`` and
        the run's variables, minus tracker secrets. ``remote``: only the additions — a worker
        on an SSH host lays them over the remote login's own environment."""
        settings = self._parts.settings
        if kind is None:
            kind = settings.agent_kind()
        extra = dict(kind.env)
        extra.update(
            run_variables(
                issue_id=issue.id,
                identifier=issue.identifier,
                title=issue.title,
                state=issue.state,
                attempt=attempt,
                slot_index=slot_index,
                workspace=workspace,
            )
        )
        extra["LORENZ_WORKFLOW"] = str(self._parts.workflow.current.path)
        if settings.tracker.kind is TrackerKind.FILES and settings.tracker.path:
            extra["LORENZ_TRACKER_PATH"] = settings.tracker.path
        secrets = [
            value
            for value in (settings.tracker.api_key, settings.tracker.webhook_secret)
            if value
        ]
        base = {} if remote else self._parts.base_env
        return agent_environment(base=base, extra=extra, secret_values=secrets)

    async def issue_still_active(self, issue_id: str) -> bool:
        if self._reconciling.in_grace(issue_id):
            return False  # terminal already: the turn under way is the last one
        try:
            # NB: asked mid-run; a run cancelled meanwhile lets the request finish first.
            tracker = self._parts.tracker.current
            found = await run_to_completion(tracker.fetch_issues_by_ids([issue_id]))
        except Exception:  # noqa: BLE001 - unknown counts as inactive: no new turn
            return False
        issue = found[0] if found else None
        return self._parts.orchestrator.reconciliation_decision(issue) is None

    def on_launch(self, run: ActiveRun, *, launching: bool) -> None:
        """The run's worker launch began (``True``) or answered (see ``on_launch`` of
        :class:`~lorenz.agents.AgentRunRequest`)."""
        run.launching = launching
        if not launching:
            run.launched_at_ms = self._parts.clock.monotonic_ms()

    def on_agent_update(self, key: SlotKey, update: AgentUpdate) -> None:
        """An update of the slot's agent: scrubbed, then applied in the background."""
        if update.message:
            scrubbed = self._parts.reporting.scrub(update.message)
            if scrubbed != update.message:  # NB: a copy only when there was a secret in it
                update = dataclasses.replace(update, message=scrubbed)
        self._parts.background.spawn(
            self.apply_update(key, update), name=f"lorenz-agent-update:{key}"
        )

    async def apply_update(self, key: SlotKey, update: AgentUpdate) -> None:
        try:
            progress = await self._parts.orchestrator.apply_update(key, update)
        except Exception:
            # Logged, not raised: this runs as a background task, and one bad update must not
            # hide the ones after it.
            logger.exception("applying an agent update failed slot=%s", key)
            return
        self._parts.reporting.agent_update(key, update, progress)
        # NB: a new session (a turn began) is more than progress: the log lines carry it.
        self._parts.reporting.emit_snapshot(progress_only=update.session_id is None)
