"""Noticing WORKFLOW.md edits and swapping configuration in only when the new one is whole.

The runtime calls :meth:`WorkflowReloader.check` at the start of every tick (and may call it from
a file watcher too). A change is detected by the file's stamp — modification time, size and a
content hash — so an edit is seen even when a watcher misses an event or the mtime does not move.

A reload replaces the current workflow only if the whole pipeline succeeds: read, split, YAML,
schema, and the dispatch preflight. Otherwise the last good workflow stays in force, the error is
logged and returned, and the stamp is *not* advanced, so the same error is reported on every
check until the file is fixed (an operator who missed the first log line sees the next one).

An async caller (the runtime's tick) runs the load through :func:`load_off_loop`, so parsing
never blocks the event loop that serves polls, runs and ``/healthz``, and is bounded in time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from lorenz.config import WorkflowSettings
from lorenz.workflow.errors import WorkflowError, WorkflowLoadTimeout
from lorenz.workflow.loading import LoadedWorkflow, load_workflow, workflow_stamp
from lorenz.workflow.preflight import validate_dispatch

if TYPE_CHECKING:
    import asyncio

logger = logging.getLogger("lorenz.workflow")

LOAD_TIMEOUT_S = 10.0
"""How long a load run by :func:`load_off_loop` may take before ``workflow_load_timeout``."""

T = TypeVar("T")

SettingsCheck = Callable[[WorkflowSettings], None]


@dataclasses.dataclass(frozen=True, slots=True)
class ReloadResult:
    """What one :meth:`WorkflowReloader.check` did."""

    changed: bool
    """The file differs from the workflow in force (whether or not it loaded)."""
    reloaded: bool
    """A new workflow is now in force."""
    error: WorkflowError | None = None
    """Why the changed file was rejected (the previous workflow stays)."""


class WorkflowReloader:
    """Holds the workflow in force and replaces it when the file changes and loads cleanly."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        cli_flags: Mapping[str, str] = MappingProxyType({}),
        cli_features: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
        check_settings: SettingsCheck | None = validate_dispatch,
    ) -> None:
        """Load the workflow now; a failure raises (the service must not start without one).

        ``check_settings`` runs after the schema on every (re)load; ``None`` skips it.
        """
        self._cli_flags = dict(cli_flags)
        self._cli_features = tuple(cli_features)
        self._environ = environ
        self._check_settings = check_settings
        self._current = self._load(path)

    @property
    def current(self) -> LoadedWorkflow:
        """The workflow in force (the last one that loaded completely)."""
        return self._current

    @property
    def path(self) -> Path:
        return self._current.path

    def _load(self, path: str | os.PathLike[str] | None) -> LoadedWorkflow:
        loaded = load_workflow(
            path,
            cli_flags=self._cli_flags,
            cli_features=self._cli_features,
            environ=self._environ,
        )
        if self._check_settings is not None:
            self._check_settings(loaded.settings)
        return loaded

    def check(self) -> ReloadResult:
        """Reload if the file changed; never raises a :class:`WorkflowError`."""
        try:
            stamp = workflow_stamp(self._current.path)
        except WorkflowError as exc:
            self._report(exc)
            return ReloadResult(changed=True, reloaded=False, error=exc)
        if stamp == self._current.stamp:
            return ReloadResult(changed=False, reloaded=False)
        try:
            loaded = self._load(self._current.path)
        except WorkflowError as exc:
            self._report(exc)
            return ReloadResult(changed=True, reloaded=False, error=exc)
        self._current = loaded
        logger.info("reloaded workflow path=%s sha256=%s", loaded.path, loaded.stamp.sha256[:12])
        return ReloadResult(changed=True, reloaded=True)

    def _report(self, exc: WorkflowError) -> None:
        logger.error(
            "failed to reload workflow path=%s code=%s reason=%s; keeping last known good",
            self._current.path,
            exc.code,
            exc.message,
        )


async def load_off_loop(
    load: Callable[[], T], *, timeout_s: float = LOAD_TIMEOUT_S, what: str = "workflow"
) -> T:
    """``load()`` run in a worker thread, awaited for at most ``timeout_s``.

    The event loop keeps serving polls, runs and HTTP while the file is parsed. Past the bound
    :class:`WorkflowLoadTimeout` is raised and the late result, if any, is dropped. NB: a thread
    cannot be killed: the parsing bounds keep every load short, and this bound only keeps an
    unforeseen slow input (or a hung network file system) from stalling the caller. The thread
    is a daemon thread, so an abandoned load never holds up the process's exit the way a stuck
    ``asyncio.to_thread`` worker holds up ``asyncio.run``'s executor shutdown.
    """
    # NB: imported here: `lorenz validate` imports this module and must start fast.
    import asyncio

    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    future.add_done_callback(_retrieve)

    def work() -> None:
        try:
            result = load()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side whole
            _settle_threadsafe(loop, future, None, exc)
        else:
            _settle_threadsafe(loop, future, result, None)

    threading.Thread(target=work, name=f"lorenz-load-{what}", daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout=timeout_s)
    except TimeoutError:
        raise WorkflowLoadTimeout(
            f"loading the {what} took longer than {timeout_s:g} s (limit); check it for a very "
            "large or deeply nested front matter"
        ) from None


def _settle_threadsafe(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    # NB: a closed loop raises RuntimeError: nobody waits for this load any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle)


def _retrieve(future: asyncio.Future[Any]) -> None:
    # NB: a load abandoned at its time bound may still fail later; retrieving the exception
    # keeps asyncio from logging "exception was never retrieved" for it.
    if not future.cancelled():
        future.exception()
