"""The transactional reload: the workflow's source changed, so swap it in, or keep the last good.

Each tick first asks whether the workflow's source still looks like the one loaded (its stamp).
When it does not, the new one is loaded, validated and its tracker client built before anything
is swapped: a failure at any step leaves the workflow, settings and tracker client in force as
they were, and is shown (``config_error`` in the snapshot, ``workflow_reload_failed`` events)
until a reload succeeds or the source is back to the workflow in force.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from lorenz.config import WorkflowSettings
from lorenz.model import ConfigError, EventType, LorenzError
from lorenz.runtime.parts import RuntimeParts
from lorenz.runtime.reporting import describe_error
from lorenz.trackers import TrackerClient
from lorenz.workflow import (
    LoadedWorkflow,
    WorkflowStamp,
    load_off_loop,
    validate_dispatch,
    workflow_stamp,
)

logger = logging.getLogger("lorenz.runtime")


class Reloading:
    """Reloads the workflow when its source changed; owns the reload error shown meanwhile."""

    def __init__(
        self,
        *,
        parts: RuntimeParts,
        reload_workflow: Callable[[], LoadedWorkflow] | None,
        tracker_factory: Callable[[WorkflowSettings], TrackerClient] | None,
        source_stamp: Callable[[], WorkflowStamp] | None,
    ) -> None:
        self._parts = parts
        self._reload_workflow = reload_workflow
        """``None``: the workflow is never reloaded."""
        self._tracker_factory = tracker_factory
        """A new tracker client for new tracker settings (``None``: the client stays)."""
        self._source_stamp = source_stamp
        """What the workflow's source looks like now (a stamp unlike the loaded one means
        "reload"); default: the WORKFLOW.md file's stamp. The operator passes the stamp of the
        Workflow object's latest spec."""
        self._config_error: ConfigError | None = None
        """The reload failing now; ``None`` once one succeeds."""

    @property
    def config_error(self) -> ConfigError | None:
        """The reload failing now; ``None`` once one succeeds (or the source is back)."""
        return self._config_error

    async def reload_if_changed(self) -> None:
        """Swap in the workflow's source if it changed; keep the last good one if it fails."""
        if self._reload_workflow is None:
            return
        workflow = self._parts.workflow
        try:
            stamp = (
                self._source_stamp()
                if self._source_stamp is not None
                else workflow_stamp(workflow.current.path)
            )
        except Exception:  # noqa: BLE001 - unreadable now: the reload below reports why
            stamp = None
        if stamp is not None and stamp == workflow.current.stamp:
            self._config_error = None  # NB: back to the very workflow in force: nothing failing
            return
        reporting = self._parts.reporting
        try:
            # NB: every step that can throw runs before anything is swapped, so a failure
            # leaves the last-known-good workflow, settings and tracker client in place.
            loaded = await load_off_loop(self._reload_workflow)
            validate_dispatch(loaded.settings)
            tracker = (
                self._tracker_factory(loaded.settings)
                if self._tracker_factory is not None
                and _tracker_changed(self._parts.settings, loaded.settings)
                else None
            )
        except Exception as exc:  # noqa: BLE001 - any reload failure keeps the last good workflow
            code = str(getattr(exc, "code", type(exc).__name__))
            self._config_error = ConfigError(
                code=code,
                message=reporting.scrub(_config_message(exc)),
                since=(
                    self._config_error.since
                    if self._config_error is not None
                    else self._parts.clock.now()
                ),
            )
            reporting.event(
                EventType.WORKFLOW_RELOAD_FAILED,
                message=f"{describe_error(exc)}; keeping the last known good workflow",
                code=code,
            )
            return
        self._config_error = None
        old_tracker = self._parts.tracker.current if tracker is not None else None
        workflow.current = loaded
        self._parts.orchestrator.update_settings(loaded.settings)
        self._parts.workspaces.update_settings(loaded.settings)
        if tracker is not None:
            self._parts.tracker.current = tracker
        if old_tracker is not None:
            try:
                await old_tracker.close()
            except Exception:
                # NB: the swapped-out tracker's connections are closed best effort: the new
                # client is in force already, and the reload succeeded.
                logger.warning("closing the replaced tracker client failed", exc_info=True)
        reporting.event(EventType.WORKFLOW_RELOADED, message="workflow reloaded")


def _config_message(exc: BaseException) -> str:
    """A reload error without its code in front (the snapshot carries the code beside it)."""
    if isinstance(exc, LorenzError):
        return f"[{exc.key_path}] {exc.message}" if exc.key_path else exc.message
    return describe_error(exc)


def _tracker_changed(old: WorkflowSettings, new: WorkflowSettings) -> bool:
    return old.tracker != new.tracker
