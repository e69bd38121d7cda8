"""Concurrency caps and worker-host choice: how many slots may be occupied, and where.

An occupied slot is a running *or reserved* one. Counting reservations is the point: while a
worker pool looks for a host, the reservation already holds a place under every cap, so dispatch
cannot overshoot ``agent.max_concurrent_agents`` during acquire windows.

Caps, checked in this order (the first one that is full names the skip reason):

* global: occupied < ``agent.max_concurrent_agents``;
* per state: occupied slots whose issue is in the same (normalized) state <
  ``agent.max_concurrent_agents_by_state[state]``, falling back to the global cap;
* per host (static path with ``worker.ssh_hosts`` only): a host with fewer running slots than
  ``worker.max_concurrent_agents_per_host`` (unset = unlimited).

An empty host list means "run locally" and no per-host cap applies. When hosts are configured
and every one is full there is no dispatch: a run never falls back to the local machine.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from lorenz.config import AgentSettings


class CapacityShortage(enum.StrEnum):
    """Which cap stopped a dispatch (also the orchestrator's skip reasons)."""

    GLOBAL = "global_capacity"
    STATE = "state_capacity"
    WORKER_HOST = "worker_host_capacity"


def state_limit(state_key: str, *, agent: AgentSettings) -> int:
    """The cap for a normalized state: its own entry, else the global cap."""
    return agent.max_concurrent_agents_by_state.get(state_key, agent.max_concurrent_agents)


def capacity_shortage(
    state_key: str,
    *,
    occupied: int,
    occupied_in_state: int,
    agent: AgentSettings,
) -> CapacityShortage | None:
    """Whether one more slot in ``state_key`` would break the global or the per-state cap."""
    if occupied >= agent.max_concurrent_agents:
        return CapacityShortage.GLOBAL
    if occupied_in_state >= state_limit(state_key, agent=agent):
        return CapacityShortage.STATE
    return None


def available_slots(*, occupied: int, agent: AgentSettings) -> int:
    """Free places under the global cap (never negative, even after a cap was lowered)."""
    return max(agent.max_concurrent_agents - occupied, 0)


def select_worker_host(
    hosts: Sequence[str],
    *,
    load: Mapping[str, int],
    per_host_cap: int | None,
    preferred: str | None = None,
) -> str | None:
    """The host for a new run, or ``None`` when every host is full.

    ``preferred`` (a retry's previous host) wins while it is configured and has room; otherwise
    the least-loaded host with room, ties broken by the order of ``hosts``. The caller handles the
    empty list (local run) before asking.
    """

    def has_room(host: str) -> bool:
        return per_host_cap is None or load.get(host, 0) < per_host_cap

    if preferred is not None and preferred in hosts and has_room(preferred):
        return preferred
    best: str | None = None
    best_load = 0
    for host in hosts:
        if not has_room(host):
            continue
        host_load = load.get(host, 0)
        if best is None or host_load < best_load:
            best, best_load = host, host_load
    return best
