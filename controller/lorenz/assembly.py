"""The one recipe that turns a loaded workflow and an orchestrator into a runtime.

Both composition roots — the single-host daemon (``lorenz.daemon.host``) and the operator's
per-Workflow controller (``lorenz.kube``) — run the same runtime; only where its pieces come
from differs (a WORKFLOW.md file or a Workflow object, a SQLite file or Claim resources, the
process environment or an allow-listed one). What a runtime is made of (the tracker the
settings name, a workspace manager that never leaks tracker secrets to hooks, the agent
runner of the agent kind) is decided here once, so the two roots cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from lorenz.agents import AgentRunner, RunPlacement, build_runner
from lorenz.agents.environment import TRACKER_SECRET_ENV
from lorenz.config import AgentProtocol, WorkflowSettings
from lorenz.model import ClaimStore, SpawnIntents
from lorenz.orchestrator import Orchestrator
from lorenz.policies.placement import runs_in_pods
from lorenz.runtime import LorenzRuntime
from lorenz.trackers import TrackerClient, build_tracker
from lorenz.workflow import LoadedWorkflow, WorkflowStamp
from lorenz.workspaces import WorkspaceManager

if TYPE_CHECKING:
    from lorenz.workers.handles import LocalTransport
    from lorenz.workers.placement import SshTransports

IN_PROCESS_RUNS_ENV: Final = "LORENZ_TEST_IN_PROCESS_RUNS"
"""Test-only: ``1`` in the controller's process environment runs agents inside the controller
instead of in detached workers, for the suite's tests that are about something else (no worker
start per run). Read by both composition roots. Not a setting and not supported: agents then
die with their controller, and a restart or failover runs their issues again."""


def runs_in_workers(environ: Mapping[str, str]) -> bool:
    """Whether this controller's local runs execute in detached workers: always, unless the
    test-only :data:`IN_PROCESS_RUNS_ENV` says otherwise."""
    return environ.get(IN_PROCESS_RUNS_ENV) != "1"


def tracker_factory(
    *, base_dir: Path, env: Mapping[str, str] | None = None
) -> Callable[[WorkflowSettings], TrackerClient]:
    """How a runtime builds a tracker for (re)loaded settings.

    ``env`` is where tracker credentials are read from when the settings name none
    (``None``: the process environment, as on a single host; the operator passes ``{}``: a
    Workflow's credentials come only from its own Secret).
    """

    def build(settings: WorkflowSettings) -> TrackerClient:
        return build_tracker(settings, base_dir=base_dir, env=env)

    return build


def assemble_runtime(
    *,
    workflow: LoadedWorkflow,
    orchestrator: Orchestrator,
    base_env: Mapping[str, str],
    trackers: Callable[[WorkflowSettings], TrackerClient],
    tracker: TrackerClient | None = None,
    reload_workflow: Callable[[], LoadedWorkflow],
    source_stamp: Callable[[], WorkflowStamp] | None = None,
    prove_leadership: Callable[[], Awaitable[None]] | None = None,
    claim_store: ClaimStore | None = None,
    generation: Callable[[], int | None] | None = None,
    pods: Callable[[RunPlacement], AgentRunner] | None = None,
    worker_env: Mapping[str, str] | None = None,
    leave_workers: Callable[[], str | None] | None = None,
    transport: LocalTransport | None = None,
    workers: bool,
) -> LorenzRuntime:
    """A runtime for ``workflow``, ready to ``start()``.

    ``pods`` builds the runner of a run placed in a Pod of its own (``worker.kind: pod``);
    only the operator has one, so elsewhere such a workflow is refused here
    (``worker_kind_unavailable``), and a reload to it fails its runs with the same code.

    ``workers``: every run on this machine executes in a detached ``lorenz worker`` (on a
    single host and in the operator alike); ``False`` keeps agents in this process (only the
    test-only switch, :func:`runs_in_workers`).
    ``claim_store`` (when it records spawn intents) and ``generation`` (the controller's
    current leadership generation) go to detached runs: each records its worker's intent on its
    claim, under the generation that started it, before the worker starts. ``worker_env`` is
    the environment of local worker processes (``None``: this process's, tracker secrets
    stripped); ``leave_workers`` says when this runtime's stopped runs leave their workers
    running for the next controller (see ``WorkerRunner.leaving``). ``transport`` is the
    local workers' transport, when the caller built it (:func:`local_worker_transport`) to
    close its launcher at shutdown; ``None``: one is built here.

    ``base_env`` is the environment agents and hooks start from (tracker secrets are stripped
    from it for hooks); ``tracker`` is one already built by ``trackers`` (the host builds it
    first so a tracker error surfaces before any claim is touched), otherwise it is built here.
    """
    if pods is None and runs_in_pods(workflow.settings.worker):
        from lorenz.workers.placement import PodRunnerUnavailable

        raise PodRunnerUnavailable(
            "worker.kind: pod places runs in Pods, which only the Kubernetes operator does; "
            "use worker.kind: local (or run the workflow as a Workflow resource)"
        )
    return LorenzRuntime(
        workflow=workflow,
        orchestrator=orchestrator,
        tracker=tracker if tracker is not None else trackers(workflow.settings),
        workspaces=WorkspaceManager(
            settings=workflow.settings, secrets=TRACKER_SECRET_ENV, base_env=base_env
        ),
        runner_factory=_runner_factory(
            workflow,
            base_env=base_env,
            claim_store=claim_store,
            generation=generation,
            pods=pods,
            worker_env=worker_env,
            leave_workers=leave_workers,
            transport=transport,
            workers=workers,
        ),
        tracker_factory=trackers,
        reload_workflow=reload_workflow,
        source_stamp=source_stamp,
        prove_leadership=prove_leadership,
        base_env=base_env,
    )


def local_worker_transport(
    workflow: LoadedWorkflow,
    *,
    base_env: Mapping[str, str],
    worker_env: Mapping[str, str] | None = None,
) -> LocalTransport:
    """The transport of ``workflow``'s workers on this machine, its launcher warming up.

    Whoever builds it closes it (:meth:`LocalTransport.close`) once no run is in flight: the
    single host does, at the end of its shutdown; the operator's has no launcher to close.
    ``worker_env`` as in :func:`assemble_runtime`.
    """
    from lorenz.workers.handles import LocalTransport
    from lorenz.workers.states import state_root_of

    api_key = workflow.settings.tracker.api_key
    # NB: the operator passes its Workflows' allow-listed environment as ``worker_env``;
    # the single host gives its workers its own environment and the state root it names.
    transport = (
        LocalTransport(env=worker_env)
        if worker_env is not None
        else LocalTransport(
            state_root=state_root_of(base_env),
            env=base_env,
            secret_values=[api_key] if api_key else [],
            # NB: one warm launcher forks the single host's workers (a Python start-up
            # per run was most of a run's CPU); the operator keeps the launch command.
            forkserver=True,
            # NB: the protocols this workflow's agents speak, not every one (the ACP
            # SDK alone is most of the launcher's start-up and memory).
            preload=sorted(
                {kind.protocol.value for kind in workflow.settings.agents.values()}
            ),
        )
    )
    if not runs_in_pods(workflow.settings.worker):
        # NB: the launcher starts with the controller (in the background, on the running
        # loop), not at the first dispatch: its preload is off the first run's path.
        transport.warm_up()
    return transport


def _runner_factory(
    workflow: LoadedWorkflow,
    *,
    base_env: Mapping[str, str],
    claim_store: ClaimStore | None = None,
    generation: Callable[[], int | None] | None = None,
    pods: Callable[[RunPlacement], AgentRunner] | None = None,
    worker_env: Mapping[str, str] | None = None,
    leave_workers: Callable[[], str | None] | None = None,
    transport: LocalTransport | None = None,
    workers: bool,
) -> Callable[[AgentProtocol], AgentRunner]:
    """Runners that execute each run where the orchestrator placed it.

    On this machine: runners that place each run in a local worker (``workers``), else
    in-process runners. On a ``worker.ssh_hosts`` host: always a worker there, over ssh (the
    request's ``placement`` says which host). The SSH transports are shared by every run of the
    runtime; ssh and local workers run with ``base_env`` minus the tracker secrets, and local
    workers keep their state under the state root ``base_env`` names.

    NB: the worker runs the agent protocol itself (it reads it from the run's settings), so a
    detached runner is the same for every protocol.
    """
    path = str(workflow.path)
    journal_max_bytes = workflow.settings.worker.journal_max_bytes
    api_key = workflow.settings.tracker.api_key
    secret_values = [api_key] if api_key else []
    # The SSH transports, made at the first run that needs them and shared by every run.
    shared: dict[str, SshTransports] = {}
    local: Callable[[AgentProtocol], AgentRunner] = build_runner
    if workers:
        from lorenz.workers.runner import WorkerRunner

        if transport is None:
            transport = local_worker_transport(
                workflow, base_env=base_env, worker_env=worker_env
            )
        local_transport = transport

        # NB: asked once, not per dispatch: isinstance() against a runtime-checkable protocol
        # walks its members (~0.05 ms a run on the controller's loop), and the store is fixed.
        intents = claim_store if isinstance(claim_store, SpawnIntents) else None

        def detached(protocol: AgentProtocol) -> AgentRunner:
            del protocol  # the worker reads it from the request's agent settings
            # NB: read per run: a runner is built per dispatch, and the generation rotates on
            # every acquisition of leadership.
            current = generation() if generation is not None else None
            return WorkerRunner(
                workflow=path,
                transport=local_transport,
                generation=current or 0,
                intents=intents,
                leaving=leave_workers,
                journal_max_bytes=journal_max_bytes,
            )

        local = detached

    def placing(protocol: AgentProtocol) -> AgentRunner:
        # NB: imported at the first run, not at assembly: start-up stays free of the workers
        # package for workflows that never use it.
        from lorenz.workers.placement import PlacingRunner, SshTransports

        transports = shared.get("ssh")
        if transports is None:
            transports = shared["ssh"] = SshTransports(
                env=base_env, secret_values=secret_values
            )
        return PlacingRunner(
            workflow=path, protocol=protocol, local=local, transports=transports, pods=pods
        )

    return placing
