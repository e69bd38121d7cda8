"""The marks controllers leave in worker state directories, and what a state root holds.

A run's state directory says which controller follows its worker (:data:`CONTROLLER_NAME`,
written on start and on adoption) and whether a controller collected its end (the collected
mark of :mod:`lorenz.workers.states`). The runner (:mod:`lorenz.workers.runner`) reads both
before it starts or adopts a worker, so that a slot never runs twice and another live
controller's worker is never taken over; the daemon reads the controller mark at shutdown.
Apart from the runner because these are facts of the files on disk, shared by both readers,
not of one run being driven.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Final

from lorenz.claims.owners import Liveness, default_owner_id, owner_liveness
from lorenz.workers.spec import is_handle
from lorenz.workers.states import COLLECTED_NAME, SPEC_NAME

logger = logging.getLogger(__name__)

CONTROLLER_NAME: Final = "controller"
"""File in a run's state directory: the owner id (``<host>:<pid>:<start time>``) of the
controller that follows the run — the one that started it, or the last to adopt it."""

CONTROLLER_MARK_LIMIT: Final = 512
"""Bytes of a controller file read at most (an owner id is far shorter)."""


class StateRootIndex:
    """What this process has learnt about a state root's runs, so that looking for a slot's
    predecessor does not walk every run of the retention window again.

    NB: it keeps only what never changes once seen: a run that has its collected mark stays
    collected (the mark is never removed; a pruned directory leaves the listing and the
    index), and the workflow, issue and slot a run's spec names never change. Every call still
    lists the root and checks each run not known collected for its mark, so a worker that
    appeared since (a predecessor's, one of this process's own that was left uncollected) is
    found exactly as by a full walk. Before it, each dispatch stat'ed and built paths for every
    handle of the root: ~80 ms of a worker thread per 100 runs in the tracker bench, growing
    with the root.
    """

    def __init__(self, root: Path) -> None:
        self._root = str(root)
        self._lock = threading.Lock()
        self._collected: set[str] = set()
        self._slots: dict[str, tuple[object, object, object]] = {}

    def uncollected(self, *, workflow: str, issue_id: str, slot: int) -> list[str]:
        """Handles (sorted) of uncollected runs whose spec names this workflow, issue, slot."""
        try:
            names = os.listdir(self._root)
        except FileNotFoundError:
            return []
        wanted = (workflow, issue_id, slot)
        found = []
        with self._lock:
            listed = set(names)
            self._collected &= listed
            for name in [n for n in self._slots if n not in listed]:
                del self._slots[name]
            for name in names:
                if name in self._collected or not is_handle(name):
                    continue
                state_dir = os.path.join(self._root, name)
                if os.path.exists(os.path.join(state_dir, COLLECTED_NAME)):
                    self._collected.add(name)
                    self._slots.pop(name, None)
                    continue
                identity = self._slots.get(name)
                if identity is None:
                    spec = read_spec(Path(state_dir))
                    if spec is None:
                        continue  # NB: not a run directory, or its spec is not written yet
                    identity = (
                        spec.get("workflow"),
                        (spec.get("issue") or {}).get("id"),
                        spec.get("slot_index"),
                    )
                    self._slots[name] = identity
                if identity == wanted:
                    found.append(name)
        return sorted(found)


_indexes: dict[Path, StateRootIndex] = {}


def index_of(root: Path) -> StateRootIndex:
    # NB: setdefault is atomic under the GIL; callers are worker threads of to_thread.
    return _indexes.setdefault(root, StateRootIndex(root))


def record_controller(state_dir: Path, *, owner: str) -> None:
    """Name ``owner`` as the controller following the run in ``state_dir`` (atomic replace).

    NB: best effort: a mark that cannot be written (the run's directory is gone, a full disk)
    leaves the run unmarked, which is how runs of earlier versions look.
    """
    temp = state_dir / f".{CONTROLLER_NAME}.{os.getpid()}.tmp"
    try:
        temp.write_text(owner, encoding="utf-8")
        os.replace(temp, state_dir / CONTROLLER_NAME)
    except OSError as exc:
        logger.warning("controller mark not written state_dir=%s: %s", state_dir, exc)
        with contextlib.suppress(OSError):
            temp.unlink()


_controller_ids: dict[int, str] = {}


def controller_id() -> str:
    """This process's owner id, computed once per pid (a runner is built per dispatch).

    NB: keyed by pid: a forked child is another process, with an id of its own."""
    pid = os.getpid()
    known = _controller_ids.get(pid)
    if known is None:
        known = _controller_ids[pid] = default_owner_id()
    return known


def live_controller_of(state_dir: Path, *, me: str) -> str | None:
    """The owner id of another controller that follows the run in ``state_dir`` and is
    provably alive on this host; ``None`` when it is us, dead, unknown or unmarked."""
    try:
        with open(state_dir / CONTROLLER_NAME, "rb") as mark:
            owner = mark.read(CONTROLLER_MARK_LIMIT).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not owner or owner == me:
        return None
    return owner if owner_liveness(owner) is Liveness.ALIVE else None

def read_spec(state_dir: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads((state_dir / SPEC_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None
