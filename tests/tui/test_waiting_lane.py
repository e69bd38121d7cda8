"""The waiting lane in the terminal view and in ``lorenz status``: who waits, since when, for
which question (shown only while something waits)."""

from __future__ import annotations

import dataclasses

from lorenz.cli.status import render
from lorenz.model.snapshots import WaitingRow
from tests.tui.test_rendering import _at, _snapshot, _text


def waiting_row() -> WaitingRow:
    return WaitingRow(
        slot_key="id-7#0", issue_id="id-7", identifier="LOR-7", slot_index=0,
        question="Which database should the cache use?\nRedis or Postgres?",
        options=("Redis", "Postgres"), session_id="thr-7", turn=1, asked_at=_at(-90),
        posted=True,
    )


def test_the_terminal_view_shows_the_waiting_lane_only_while_something_waits() -> None:
    assert "Waiting for an answer" not in _text(_snapshot())
    snapshot = _snapshot()
    snapshot = dataclasses.replace(
        snapshot, lanes=dataclasses.replace(snapshot.lanes, waiting=(waiting_row(),))
    )
    text = _text(snapshot)
    assert "Waiting for an answer 1" in text
    row = next(line for line in text.splitlines() if "LOR-7" in line)
    assert "1m 30s" in row
    assert "Which database should the cache use? Redis or Postgres?" in row


def test_lorenz_status_names_each_waiting_issue_and_its_question() -> None:
    text = render(
        {
            "endpoint": "unix:///run/lorenz.sock",
            "app_status": "running",
            "lanes": {"running": 0, "reserving": 0, "retrying": 0, "blocked": 0},
            "waiting": [
                {"identifier": "LOR-7", "question": "Which database?\nRedis or Postgres?",
                 "asked_at": "2026-01-01T00:00:00+00:00"},
            ],
        }
    )
    assert (
        "  waiting    LOR-7 (since 2026-01-01T00:00:00+00:00): Which database? Redis or Postgres?"
        in text.splitlines()
    )
