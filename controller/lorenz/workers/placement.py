"""Placement: which machine a run executes on, and the runner that puts it there.

Where a run executes is decided in one place, :mod:`lorenz.policies.placement` (a host of
``worker.ssh_hosts`` under its per-host cap, a Pod of its own, or this machine); this module
turns that decision into a process there. A run placed on
an SSH host is always a worker there — its workspace, hooks and agent live on the host, and only
its journal, tool calls and cancel travel over ssh — so the controller never touches the remote
filesystem itself. A run on this machine is a local worker (or, in the operator and in tests
that ask for it, an in-process runner).

:class:`PlacingRunner` is the one :class:`~lorenz.agents.AgentRunner` the runtime is given; it
looks at each request's :class:`~lorenz.agents.RunPlacement` and hands the request on. The SSH
transports live as long as the placing runner's :class:`SshTransports` (one per host entry and
connection settings), so the runs on one host share nothing but the transport's private socket
directory; each run's ssh forward is closed when the run ends.
"""

from __future__ import annotations

import atexit
import dataclasses
import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Final

from lorenz.agents import (
    AdoptionCanceller,
    AgentRunError,
    AgentRunner,
    AgentRunRequest,
    AgentRunResult,
    DroppedAdoption,
    RunPlacement,
)
from lorenz.codes import ErrorCode
from lorenz.config import AgentProtocol, WorkerSettings, WorkflowSettings
from lorenz.model import Issue
from lorenz.policies.placement import RunLocation, run_location
from lorenz.workers.journal import DEFAULT_MAX_BYTES as DEFAULT_JOURNAL_MAX_BYTES
from lorenz.workers.runner import WorkerRunner
from lorenz.workers.spec import HookSpec, RunSpec
from lorenz.workspaces.keys import slot_dir_name, workspace_key

if TYPE_CHECKING:
    from lorenz.workers.ssh import SshTransport

DEFAULT_WORKSPACE_ROOT_NAME: Final = "lorenz_workspaces"
"""Under the system temporary directory when ``workspace.root`` is unset (as locally)."""

HOOK_VARIABLE_PREFIX: Final = "LORENZ_"
"""The run's variables (``LORENZ_ISSUE_ID``, ``LORENZ_WORKSPACE``, …) that hooks get too."""


POD_PLACEMENT: Final = "pod"
"""The placement of a run in a Pod of its own (``worker.kind: pod``; the operator's runner)."""

POD_WORKSPACE_ROOT: Final = "/var/lib/lorenz/workspaces"
"""Where a run's Pod mounts its workspace volume; the workspace is a folder under it."""


def pod_workspace_path(
    settings: WorkflowSettings, *, issue: Issue, slot_index: int
) -> PurePosixPath:
    """The workspace of an issue slot inside its run's Pod: the local layout under
    :data:`POD_WORKSPACE_ROOT` (``workspace.root`` is the operator's folder, not the Pod's)."""
    path = PurePosixPath(POD_WORKSPACE_ROOT) / workspace_key(issue.identifier)
    if settings.agent.ensemble_size > 1 or slot_index > 0:
        path = path / slot_dir_name(slot_index)
    return path


class PodRunnerUnavailable(AgentRunError):
    """``worker.kind: pod`` where nothing places runs in Pods (outside the operator)."""

    code = ErrorCode.WORKER_KIND_UNAVAILABLE


def remote_workspace_path(
    settings: WorkflowSettings, *, issue: Issue, slot_index: int
) -> PurePosixPath:
    """The workspace of an issue slot on an SSH host: the local layout, under the same
    ``workspace.root`` path (which the loader made absolute), never resolved on this machine."""
    configured = settings.workspace.root
    root = PurePosixPath(configured or f"{tempfile.gettempdir()}/{DEFAULT_WORKSPACE_ROOT_NAME}")
    path = root / workspace_key(issue.identifier)
    if settings.agent.ensemble_size > 1 or slot_index > 0:
        path = path / slot_dir_name(slot_index)
    return path


class SshTransports:
    """One :class:`SshTransport` per (host entry, connection settings), made on first use."""

    def __init__(
        self, *, env: Mapping[str, str] | None = None, secret_values: Sequence[str] = ()
    ) -> None:
        self.env = env
        """The environment ssh runs with (tracker secrets are stripped by the transport)."""
        self.secret_values = tuple(secret_values)
        self._transports: dict[tuple[str, str | None, str, str], SshTransport] = {}
        atexit.register(self._forget_local_dirs)

    def transport(self, host: str, *, worker: WorkerSettings) -> SshTransport:
        key = (host, worker.ssh_config, worker.remote_command, worker.remote_state_root)
        transport = self._transports.get(key)
        if transport is None:
            # NB: on the first run placed on an SSH host: a controller without ``ssh_hosts``
            # never loads the SSH transport.
            from lorenz.workers.ssh import SshTransport

            transport = SshTransport(
                host=host,
                ssh_options=["-F", worker.ssh_config] if worker.ssh_config else [],
                remote_command=shlex.split(worker.remote_command),
                remote_state_root=worker.remote_state_root,
                env=self.env,
                secret_values=self.secret_values,
            )
            self._transports[key] = transport
        return transport

    async def close(self) -> None:
        for transport in self._transports.values():
            await transport.close()
        self._transports.clear()

    def _forget_local_dirs(self) -> None:
        # NB: the forwards die with their ssh processes; only the private socket directories
        # would outlive an interpreter that never awaited close().
        import shutil

        for transport in self._transports.values():
            shutil.rmtree(transport.local_dir, ignore_errors=True)


class SshWorkerRunner(WorkerRunner):
    """A :class:`WorkerRunner` for one run on an SSH host: the worker creates the workspace
    there, runs every hook there, and starts its agent from the remote login's environment."""

    def __init__(
        self,
        *,
        workflow: str,
        transport: SshTransport,
        placement: RunPlacement,
        journal_max_bytes: int = DEFAULT_JOURNAL_MAX_BYTES,
    ) -> None:
        super().__init__(
            workflow=workflow,
            transport=transport,
            placement=placement.host,
            journal_max_bytes=journal_max_bytes,
        )
        self.ssh = transport
        self.run_placement = placement

    def spec_for(self, request: AgentRunRequest, *, run: int = 0) -> RunSpec:
        return placed_spec(super().spec_for(request, run=run), request, self.run_placement)

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        try:
            return await super().run(request)
        finally:
            if self.last_handle is not None:
                await self.ssh.close_forward(self.last_handle.handle)

    async def cancel_adoption(self, dropped: DroppedAdoption) -> bool:
        try:
            return await super().cancel_adoption(dropped)
        finally:
            if self.last_handle is not None:
                await self.ssh.close_forward(self.last_handle.handle)


def placed_spec(spec: RunSpec, request: AgentRunRequest, placement: RunPlacement) -> RunSpec:
    """``spec`` for a run placed on another host (over SSH, or in a Pod): the workspace made
    there, the hooks run there with the run's ``LORENZ_`` variables, and the host's own
    environment under the run's."""
    hooks = placement.hooks
    variables = {
        name: value
        for name, value in request.env.items()
        if name.startswith(HOOK_VARIABLE_PREFIX)
    }
    return dataclasses.replace(
        spec,
        workspace=str(request.workspace),
        create_workspace=True,
        inherit_env=True,
        host=placement.host,
        hooks=HookSpec(
            after_create=hooks.after_create,
            before_run=hooks.before_run,
            after_run=hooks.after_run,
            timeout_ms=hooks.timeout_ms,
            env=variables,
        ),
    )


class PlacingRunner:
    """Hands each request to the runner for where it is placed."""

    def __init__(
        self,
        *,
        workflow: str,
        protocol: AgentProtocol,
        local: Callable[[AgentProtocol], AgentRunner],
        transports: SshTransports,
        pods: Callable[[RunPlacement], AgentRunner] | None = None,
    ) -> None:
        self.workflow = workflow
        self.protocol = protocol
        self.local = local
        """The runner for runs on this machine (in-process, or a local worker)."""
        self.transports = transports
        self.pods = pods
        """The runner for runs in Pods of their own (given by the operator only)."""
        self.last_runner: AgentRunner | None = None

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        runner = self._runner_for(request.placement)
        self.last_runner = runner
        return await runner.run(request)

    async def cancel_adoption(self, dropped: DroppedAdoption) -> bool:
        """Cancel a dropped adoption's worker where it runs (``False``: an in-process runner
        has no workers to cancel)."""
        runner = self._runner_for(dropped.placement)
        if not isinstance(runner, AdoptionCanceller):
            return False
        return await runner.cancel_adoption(dropped)

    def _runner_for(self, placement: RunPlacement | None) -> AgentRunner:
        if placement is None:
            return self.local(self.protocol)
        location = run_location(placement.worker, host=placement.host)
        if location is RunLocation.POD:
            if self.pods is None:
                raise PodRunnerUnavailable(
                    "worker.kind: pod places runs in Pods, which only the Kubernetes operator "
                    "does; use worker.kind: local here"
                )
            return self.pods(placement)
        return SshWorkerRunner(
            workflow=self.workflow,
            transport=self.transports.transport(placement.host, worker=placement.worker),
            placement=placement,
            journal_max_bytes=placement.worker.journal_max_bytes,
        )

