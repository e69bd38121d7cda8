"""What a controller without durable claims inherits from its predecessor: its workers.

A durable claim store keeps each run's spawn intent, and a restarted controller adopts from it
at hydration (``adoption`` retries). The memory store keeps nothing across a restart, yet the
predecessor's workers live on — ``kill -9`` of a plain ``lorenz`` leaves them running. Their
state directories say everything the lost claims would have: the workflow, issue and slot (in
``spec.json``) and whether the run still goes (a probe). :func:`inherited_claims` turns each
run of the workflow that no controller collected, and whose worker is alive or has finished,
into the ``running`` claim with a spawn intent that a durable store would have held; the
composition root writes them into the fresh memory store before hydration, so every mode
follows the same path from there: adopt the run when its issue is dispatched again, settle a
finished one, and cancel the worker when its issue is no longer a candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from lorenz.model import ClaimPhase, ClaimRecord, SpawnIntent, SpawnPhase, slot_key
from lorenz.workers.states import (
    COLLECTED_NAME,
    SPEC_NAME,
    ProbeState,
    list_handles,
    probe_local,
)


async def inherited_claims(*, root: Path, workflow: str, owner: str) -> list[ClaimRecord]:
    """The claims a durable store would hold for ``workflow``'s uncollected runs under ``root``.

    One per slot: a live worker before a finished one, then the newest. A run whose worker died
    without a final record is left out (nothing to adopt; its state directory stays as
    evidence), and so is one whose spec cannot be read.
    """
    found = await asyncio.to_thread(_uncollected_specs, root, workflow)
    best: dict[str, tuple[int, float, ClaimRecord]] = {}
    for name, spec, mtime in found:
        probe = await probe_local(root / name)
        if probe.state not in (ProbeState.ALIVE, ProbeState.FINAL):
            continue
        record = _claim_of(name, spec, owner=owner)
        if record is None:
            continue
        rank = (1 if probe.state is ProbeState.ALIVE else 0, mtime)
        held = best.get(record.slot_key)
        if held is None or rank > held[:2]:
            best[record.slot_key] = (*rank, record)
    return [entry[2] for entry in sorted(best.values(), key=lambda e: e[2].slot_key)]


def _uncollected_specs(root: Path, workflow: str) -> list[tuple[str, dict[str, Any], float]]:
    out = []
    for name in list_handles(root):
        state_dir = root / name
        if (state_dir / COLLECTED_NAME).exists():
            continue
        with contextlib.suppress(OSError, ValueError):
            path = state_dir / SPEC_NAME
            spec = json.loads(path.read_bytes())
            if isinstance(spec, dict) and spec.get("workflow") == workflow:
                out.append((name, spec, path.stat().st_mtime))
    return out


def _claim_of(name: str, spec: dict[str, Any], *, owner: str) -> ClaimRecord | None:
    issue = spec.get("issue")
    slot = spec.get("slot_index")
    if not isinstance(issue, dict) or not isinstance(slot, int):
        return None
    issue_id, identifier = issue.get("id"), issue.get("identifier")
    if not isinstance(issue_id, str) or not isinstance(identifier, str):
        return None
    attempt = spec.get("attempt")
    workspace = spec.get("workspace")
    return ClaimRecord(
        slot_key=slot_key(issue_id, slot),
        issue_id=issue_id,
        identifier=identifier,
        slot_index=slot,
        phase=ClaimPhase.RUNNING,
        owner=owner,
        attempt=attempt if isinstance(attempt, int) else None,
        workspace_path=workspace if isinstance(workspace, str) else None,
        # NB: nothing was collected by anyone: the successor follows from the first record.
        intent=SpawnIntent(handle=name, phase=SpawnPhase.RUNNING, last_seq=0),
    )
