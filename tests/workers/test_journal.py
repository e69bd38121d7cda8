"""The journal format: whole records only, torn tails tolerated, corruption reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorenz.workers.journal import (
    RECORD_LIMIT_BYTES,
    JournalCorrupt,
    JournalWriter,
    last_record,
    read_journal,
)
from lorenz.workers.states import ProbeState, probe_local


def write_three(path: Path) -> None:
    writer = JournalWriter(path)
    for n in range(3):
        writer.append("agent_update", {"event": "notification", "n": n})
    writer.close()


def test_records_are_numbered_from_one_and_read_after_a_seq(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write_three(path)
    assert [r.seq for r in read_journal(path)] == [1, 2, 3]
    assert [r.data["n"] for r in read_journal(path, after_seq=1)] == [1, 2]
    assert read_journal(tmp_path / "missing.jsonl") == []


@pytest.mark.parametrize(
    "tail",
    [b'{"seq":4,"kind":"agent_upd', b'{"seq":4,"kind":"x","t":1,"data":{}}', b"\x00\x00\x00\n"],
    ids=["half-a-line", "no-newline-yet", "garbled-last-line"],
)
def test_a_torn_last_line_is_skipped_and_cut_off_before_the_next_append(
    tmp_path: Path, tail: bytes
) -> None:
    path = tmp_path / "journal.jsonl"
    write_three(path)
    with path.open("ab") as handle:
        handle.write(tail)
    assert [r.seq for r in read_journal(path)] == [1, 2, 3]
    writer = JournalWriter(path)
    assert writer.last_seq == 3
    writer.append("final", {"outcome": "success"})
    writer.close()
    records = read_journal(path)
    assert [r.seq for r in records] == [1, 2, 3, 4]
    assert records[-1].is_final
    assert path.read_bytes().count(b"\n") == 4


def test_a_malformed_line_in_the_middle_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write_three(path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"not json\n" + b"".join(lines[1:]))
    with pytest.raises(JournalCorrupt) as caught:
        read_journal(path)
    assert caught.value.code == "worker_journal_corrupt"


def test_a_gap_in_sequence_numbers_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write_three(path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[2])
    with pytest.raises(JournalCorrupt):
        read_journal(path)


async def test_a_corrupt_journal_probes_unknown_never_gone(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write_three(path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"{]\n" + lines[2])
    probe = await probe_local(tmp_path)
    assert probe.state is ProbeState.UNKNOWN
    assert "malformed" in probe.detail


def test_nothing_may_follow_the_final_record(tmp_path: Path) -> None:
    writer = JournalWriter(tmp_path / "journal.jsonl")
    writer.append("final", {"outcome": "failed"})
    with pytest.raises(JournalCorrupt):
        writer.append("agent_update", {"event": "late"})


def test_an_oversized_record_is_kept_without_its_payload(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    writer = JournalWriter(path)
    writer.append(
        "agent_update", {"event": "notification", "payload": {"blob": "x" * RECORD_LIMIT_BYTES}}
    )
    writer.close()
    (record,) = read_journal(path)
    assert record.data["event"] == "notification"
    assert "payload" not in record.data
    assert record.data["payload_dropped_bytes"] > RECORD_LIMIT_BYTES
    assert len(path.read_bytes()) < RECORD_LIMIT_BYTES
    assert json.loads(path.read_bytes())["seq"] == 1


def test_the_last_record_is_read_from_the_tail_and_a_torn_line_is_skipped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.jsonl"
    assert last_record(path) is None
    write_three(path)
    with path.open("ab") as handle:
        handle.write(b'{"seq":4,"ki')
    record = last_record(path)
    assert record is not None
    assert record.seq == 3


def test_the_journal_is_synced_at_turn_boundaries_and_the_end_not_per_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.jsonl"
    writer = JournalWriter(path)
    writer.append("run_started", {"handle": "h"})
    writer.append("hook_started", {"hook": "before_run"})
    writer.append("hook_finished", {"hook": "before_run", "ok": True})
    assert writer.syncs == 0, "the start and the hooks are written, not synced"
    writer.append("agent_update", {"event": "session_started", "session_id": "s"})
    assert writer.syncs == 1
    for n in range(20):
        writer.append("agent_update", {"event": "notification", "message": f"m{n}"})
    assert writer.syncs == 1, "updates inside a turn are not synced one by one"
    writer.append("agent_update", {"event": "turn_completed"})
    writer.append("final", {"outcome": "success"})
    assert writer.syncs == 3
    writer.close()
    assert writer.syncs == 3, "nothing was left to sync at close"
    assert [r.kind for r in read_journal(path)][-1] == "final"


def test_closing_syncs_what_was_written_since_the_last_sync(tmp_path: Path) -> None:
    writer = JournalWriter(tmp_path / "journal.jsonl")
    writer.append("run_started", {"handle": "h"})
    writer.close()
    assert writer.syncs == 1
