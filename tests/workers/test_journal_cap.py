"""A capped journal: the head and the newest records are kept, the middle is counted.

An agent that talks a lot (60 MB of output once left a 90 MB journal, kept for days) must not
fill the worker's state root. The writer keeps the first half of ``worker.journal_max_bytes``
and the newest quarter, with one ``journal_dropped`` record between them; every reader —
``read_journal``, a controller catching up — accepts the jump it announces.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lorenz.workers.handles import LocalTransport, WorkerHandle, launch
from lorenz.workers.journal import (
    DROPPED,
    MIN_MAX_BYTES,
    RECORD_LIMIT_BYTES,
    JournalCorrupt,
    JournalWriter,
    Record,
    read_journal,
)
from lorenz.workers.spec import RunSpec
from tests.workers.conftest import Collected, SpecFactory, base_env

CAP = MIN_MAX_BYTES


def check_shape(records: list[Record], *, last_seq: int) -> Record:
    """Head from seq 1 without gaps, one marker, tail up to ``last_seq``; the marker."""
    markers = [r for r in records if r.kind == DROPPED]
    assert len(markers) == 1
    marker = markers[0]
    at = records.index(marker)
    head, tail = records[:at], records[at + 1 :]
    assert [r.seq for r in head] == list(range(1, len(head) + 1))
    assert marker.data["from_seq"] == len(head) + 1
    assert marker.data["records"] == marker.seq - len(head)
    assert [r.seq for r in tail] == list(range(marker.seq + 1, last_seq + 1))
    return marker


def test_a_journal_past_its_cap_keeps_head_and_tail_and_counts_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    writer = JournalWriter(path, max_bytes=CAP)
    payload = "x" * 1000
    count = 6000  # ~6 MB of records through a 1 MiB cap: several compactions
    for n in range(count):
        writer.append("agent_update", {"event": "notification", "n": n, "text": payload})
        assert path.stat().st_size <= CAP
    assert writer.compactions >= 3
    records = read_journal(path)
    marker = check_shape(records, last_seq=count)
    assert records[0].data["n"] == 0, "the head is kept"
    assert records[-1].data["n"] == count - 1, "the newest record is kept"
    kept_bytes = sum(len(line) + 1 for line in path.read_bytes().splitlines())
    assert marker.data["bytes"] > 4 * CAP
    assert kept_bytes <= CAP
    # The final record is never dropped, even right at the cap.
    writer.append("final", {"outcome": "success", "exit_status": 0})
    writer.close()
    assert read_journal(path)[-1].kind == "final"


def test_a_reopened_capped_journal_goes_on_counting(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    writer = JournalWriter(path, max_bytes=CAP)
    for n in range(2000):
        writer.append("agent_update", {"n": n, "text": "y" * 1000})
    writer.close()
    first = check_shape(read_journal(path), last_seq=2000)
    writer = JournalWriter(path, max_bytes=CAP)  # a restarted worker
    assert writer.last_seq == 2000
    for n in range(2000, 4000):
        writer.append("agent_update", {"n": n, "text": "y" * 1000})
    writer.close()
    second = check_shape(read_journal(path), last_seq=4000)
    assert second.data["from_seq"] == first.data["from_seq"]
    assert second.data["records"] > first.data["records"]
    assert read_journal(path, after_seq=second.seq - 1)[0] == second


def test_a_jump_without_its_marker_is_still_corruption(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    writer = JournalWriter(path, max_bytes=CAP)
    for n in range(1500):
        writer.append("agent_update", {"n": n, "text": "z" * 1000})
    writer.close()
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(line for line in lines if DROPPED.encode() not in line))
    with pytest.raises(JournalCorrupt):
        read_journal(path)


def test_a_cap_below_the_minimum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least"):
        JournalWriter(tmp_path / "journal.jsonl", max_bytes=CAP - 1)


async def test_a_worker_with_a_chatty_agent_keeps_its_journal_under_the_cap(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec(
        turns=[
            {
                "steps": [
                    {"message": "FIRST-WORDS"},
                    {"burst": 12000},
                    {"message": "LAST-WORDS"},
                    {"usage": 42},
                ]
            }
        ],
        journal_max_bytes=CAP,
    )
    assert isinstance(spec, RunSpec)
    transport = LocalTransport(state_root=state_root, env=base_env())
    handle, _ = await launch(spec, transport=transport)
    live = Collected()
    final = await handle.follow(live)
    assert final.data["outcome"] == "success"
    # Attached all along, the controller saw every record, in order.
    assert live.seqs() == list(range(1, final.seq + 1))

    journal = state_root / spec.handle / "journal.jsonl"
    assert journal.stat().st_size <= CAP + RECORD_LIMIT_BYTES
    on_disk = read_journal(journal)
    marker = check_shape(on_disk, last_seq=final.seq)
    assert marker.data["records"] == final.seq - len(on_disk) + 1
    texts = [str(r.data) for r in on_disk]
    assert any("FIRST-WORDS" in t for t in texts), "the head is kept"
    assert any("LAST-WORDS" in t for t in texts), "the tail is kept"
    assert on_disk[-1].kind == "final"
    assert on_disk[0].kind == "run_started"

    # A controller that comes later (it had collected nothing) catches up across the gap.
    late = WorkerHandle(transport=transport, handle=spec.handle, last_seq=0)
    caught_up = Collected()
    again = await late.follow(caught_up)
    assert again.seq == final.seq
    assert [r.seq for r in caught_up.records] == [r.seq for r in on_disk]


def test_the_runner_puts_the_configured_cap_in_every_spec(tmp_path: Path) -> None:
    from lorenz.config import WorkerSettings
    from lorenz.workers.runner import WorkerRunner
    from tests.workers.test_runner import Kit

    assert WorkerSettings().journal_max_bytes == 32 * 1024 * 1024
    request = Kit(tmp_path, [{"message": "hi"}]).request()
    default = WorkerRunner(workflow=str(tmp_path / "WORKFLOW.md")).spec_for(request)
    assert default.journal_max_bytes == WorkerSettings().journal_max_bytes
    capped = WorkerRunner(workflow=str(tmp_path / "WORKFLOW.md"), journal_max_bytes=CAP * 3)
    assert capped.spec_for(request).journal_max_bytes == CAP * 3
