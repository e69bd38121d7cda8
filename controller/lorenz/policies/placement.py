"""Where a run executes: this machine, a ``worker.ssh_hosts`` host, a worker pool's host, or a
Pod of its own — decided here, once, for every part that needs to know.

The answer is read at three moments, and each reads this module rather than the settings:

* **claim** (the orchestrator): :func:`claim_placement` says whether the slot goes straight to
  running (this machine, or an SSH host chosen now under its per-host cap) or is *reserved*
  first (a pool's host or a Pod, found after the claim: two-phase dispatch), or that no place
  is free (``worker_host_capacity``);
* **run** (the runtime, and the placing runner that hands a run to its worker):
  :func:`run_location` says where the claimed run's workspace and worker live;
* **assembly and the operator**: :func:`runs_in_pods` says whether runs go to Pods of their
  own (only the operator can place them; they outlive the runtime wherever it runs).

Rules, in order: ``worker.kind: pod`` places every run in a Pod (a reservation, bound once the
Pod's worker serves; no SSH host, no pool); a worker pool that governs dispatch makes a
reservation its ``has_capacity()`` must allow; an adopted run stays on the configured host its
worker runs on (its place there is already taken); otherwise, with ``worker.ssh_hosts``, the
retry's previous host while it has room (unless that host was unreachable), else the least
loaded host with room, and no run when every host is full — a run never falls back to this
machine; without hosts, this machine.

Pure: settings, the slot's retry and the host load in, a decision out. The pool is asked only
through its read-only :class:`~lorenz.model.CapacityProbe`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping

from lorenz.config import WorkerKind, WorkerSettings
from lorenz.model import CapacityProbe, RetryEntry
from lorenz.policies.concurrency import retry_host, select_worker_host


class RunLocation(enum.StrEnum):
    """Where one run executes."""

    LOCAL = "local"
    """This machine: a local worker (or an in-process runner); the workspace is prepared
    here."""
    SSH = "ssh"
    """A ``worker.ssh_hosts`` host: the worker there creates the workspace and runs every
    hook."""
    POOL = "pool"
    """A host a worker pool handed out: the workspace is prepared as for a local run."""
    POD = "pod"
    """A Pod of its own (``worker.kind: pod``, the operator only): the worker there creates
    the workspace on the Pod's volume and runs every hook."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimPlacement:
    """Where a claimed slot will run, as far as it is known at the claim."""

    location: RunLocation
    host: str | None = None
    """The SSH host chosen now (``None`` for every other location)."""
    acquire_timeout_ms: int = 0
    """How long finding the place may take (a reservation's acquire); ``0`` when it is known
    now."""

    @property
    def reserves(self) -> bool:
        """Whether the claim is a reservation bound later (two-phase dispatch)."""
        return self.location in (RunLocation.POD, RunLocation.POOL)


def runs_in_pods(worker: WorkerSettings) -> bool:
    """Whether runs go to Pods of their own (``worker.kind: pod``)."""
    return worker.kind is WorkerKind.POD


def claim_placement(
    worker: WorkerSettings,
    *,
    capacity: CapacityProbe,
    retry: RetryEntry | None,
    host_load: Callable[[], Mapping[str, int]],
) -> ClaimPlacement | None:
    """The placement of a slot being claimed, or ``None`` when no place is free now.

    ``retry`` is the slot's pending retry (``None`` for a first run): its adopted worker's
    placement and its last host steer the choice; ``host_load`` gives the running slots per
    SSH host (NB: asked only when hosts are chosen: it walks every running slot).
    """
    if runs_in_pods(worker):
        # NB: a Pod is placed in two phases like a pool's host: reserved while the Pod is
        # created and starts, bound once its worker serves.
        acquire_ms = max(worker.worker_pool.acquire_timeout_ms, worker.start_timeout_ms)
        return ClaimPlacement(location=RunLocation.POD, acquire_timeout_ms=acquire_ms)
    if capacity.governs():
        if not capacity.has_capacity():
            return None
        return ClaimPlacement(
            location=RunLocation.POOL, acquire_timeout_ms=worker.worker_pool.acquire_timeout_ms
        )
    hosts = worker.ssh_hosts
    if retry is not None and retry.resume is not None and retry.resume.placement in hosts:
        # NB: an adopted worker runs where it was started; it already occupies a place on
        # that host that no cap has counted since the restart.
        return ClaimPlacement(location=RunLocation.SSH, host=retry.resume.placement)
    if not hosts:
        return ClaimPlacement(location=RunLocation.LOCAL)
    host = select_worker_host(
        hosts,
        load=host_load(),
        per_host_cap=worker.max_concurrent_agents_per_host,
        preferred=(
            retry_host(retry.host, error_code=retry.error_code) if retry is not None else None
        ),
    )
    if host is None:
        return None
    return ClaimPlacement(location=RunLocation.SSH, host=host)


def run_location(worker: WorkerSettings, *, host: str | None, pooled: bool = False) -> RunLocation:
    """Where a claimed run executes: ``pooled`` when a worker pool handed it a host, ``host``
    the SSH host it was bound to (``None``: none)."""
    if pooled:
        return RunLocation.POOL
    if runs_in_pods(worker):
        return RunLocation.POD
    if host is not None:
        return RunLocation.SSH
    return RunLocation.LOCAL
