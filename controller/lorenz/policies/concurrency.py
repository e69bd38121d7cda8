"""Concurrency caps, agent-kind choice and worker-host choice: how many slots may be occupied,
by which agent kind, and where.

An occupied slot is a running *or reserved* one. Counting reservations is the point: while a
worker pool looks for a host, the reservation already holds a place under every cap, so dispatch
cannot overshoot ``agent.max_concurrent_agents`` during acquire windows.

Every issue runs one agent kind, chosen by :func:`agent_kind_for`: the first
``agent.kind_by_label`` label the issue carries, else its state's ``agent.kind_by_state``
entry, else ``agent.kind``. A workflow with one agent sets none of these and always gets
``agent.kind``.

Caps, checked in this order (the first one that is full names the skip reason):

* kind disabled: ``agent.concurrency[kind]`` is ``0`` (the issue waits; nothing else is asked);
* global: occupied < ``agent.max_concurrent_agents``;
* per state: occupied slots whose issue is in the same (normalized) state <
  ``agent.max_concurrent_agents_by_state[state]``, falling back to the global cap;
* per kind: occupied slots of the same agent kind < ``agent.concurrency[kind]``, falling back to
  ``agent.default_concurrency`` (unset = no per-kind cap);
* per host (static path with ``worker.ssh_hosts`` only): a host with fewer running slots than
  ``worker.max_concurrent_agents_per_host`` (unset = unlimited).

An empty host list means "run locally" and no per-host cap applies. When hosts are configured
and every one is full there is no dispatch: a run never falls back to the local machine.

The caps are checked by :mod:`.admission`; the host choice here is one step of
:mod:`.placement`, which decides where a run executes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from lorenz.codes import ErrorCode
from lorenz.config import AgentSettings
from lorenz.model import Issue

HOST_UNREACHABLE_CODE = ErrorCode.WORKER_HOST_UNREACHABLE
"""The failure code of a run whose SSH host could not be reached (see :func:`retry_host`)."""


class CapacityShortage(enum.StrEnum):
    """Which cap stopped a dispatch (also the orchestrator's skip reasons)."""

    GLOBAL = "global_capacity"
    STATE = "state_capacity"
    KIND = "kind_capacity"
    KIND_DISABLED = "kind_disabled"
    WORKER_HOST = "worker_host_capacity"


def state_limit(state_key: str, *, agent: AgentSettings) -> int:
    """The cap for a normalized state: its own entry, else the global cap."""
    return agent.max_concurrent_agents_by_state.get(state_key, agent.max_concurrent_agents)


def agent_kind_for(issue: Issue, *, agent: AgentSettings) -> str:
    """The agent kind that runs ``issue``: label rule, else state rule, else ``agent.kind``.

    Labels are tried in the order of ``agent.kind_by_label`` (the issue's labels and the rule
    keys are both normalized, trimmed and lowercased).
    """
    if agent.kind_by_label and issue.labels:
        carried = set(issue.labels)
        for label, kind in agent.kind_by_label.items():
            if label in carried:
                return kind
    if agent.kind_by_state:
        by_state = agent.kind_by_state.get(issue.state_key)
        if by_state is not None:
            return by_state
    return agent.kind


def kind_limit(kind: str, *, agent: AgentSettings) -> int | None:
    """The cap of an agent kind: its own entry, else ``agent.default_concurrency`` (``None``:
    no per-kind cap; ``0``: the kind is disabled)."""
    return agent.concurrency.get(kind, agent.default_concurrency)


def capacity_shortage(
    state_key: str,
    *,
    occupied: int,
    occupied_in_state: int,
    agent: AgentSettings,
    kind: str | None = None,
    occupied_of_kind: int = 0,
) -> CapacityShortage | None:
    """Whether one more slot in ``state_key`` (run by ``kind``, when given) would break a cap:
    the kind's being disabled, the global, the per-state or the per-kind cap, in that order."""
    kind_cap = kind_limit(kind, agent=agent) if kind is not None else None
    if kind_cap == 0:
        return CapacityShortage.KIND_DISABLED
    if occupied >= agent.max_concurrent_agents:
        return CapacityShortage.GLOBAL
    if occupied_in_state >= state_limit(state_key, agent=agent):
        return CapacityShortage.STATE
    if kind_cap is not None and occupied_of_kind >= kind_cap:
        return CapacityShortage.KIND
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


def retry_host(host: str | None, *, error_code: str | None) -> str | None:
    """The host a retry should prefer: the one its last run used (its workspace is there),
    unless that run failed because the host could not be reached — then any host will do.

    The decision reads the failure's code, never its text."""
    if host is None or error_code == HOST_UNREACHABLE_CODE:
        return None
    return host
