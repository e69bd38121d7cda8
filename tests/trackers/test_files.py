"""The files tracker: Markdown issue files in a folder, re-read on every call."""

from __future__ import annotations

import datetime
import getpass
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lorenz.config import TrackerSettings
from lorenz.model import BlockerRef
from lorenz.trackers import TrackerError
from lorenz.trackers.files import (
    FilesTracker,
    parse_issue_file,
    replace_front_matter_value,
    set_issue_state,
    yaml_scalar,
)

UTC = datetime.UTC


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def issue_text(
    state: str = "Todo", *, title: str = "Do it", extra: str = "", body: str = ""
) -> str:
    return f"---\ntitle: {title}\nstate: {state}\n{extra}---\n{body}"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "issues"
    path.mkdir()
    return path


def tracker_for(folder: Path, **settings: object) -> FilesTracker:
    return FilesTracker(settings=TrackerSettings(kind="files", **settings), folder=folder)  # type: ignore[arg-type]


async def test_a_full_file_is_normalized(folder: Path) -> None:
    path = write(
        folder,
        "demo-1.md",
        "---\n"
        "id: uuid-1\n"
        "identifier: DEMO-1\n"
        "title: Add a greeting\n"
        "state: In Progress\n"
        "priority: 2\n"
        "labels: [Demo, ' Backend ', demo]\n"
        "assignee: alice\n"
        "branch_name: demo-1-greeting\n"
        "created_at: 2026-01-02T03:04:05Z\n"
        "updated_at: '2026-01-03T00:00:00+01:00'\n"
        "unknown_key: ignored\n"
        "---\n"
        "\n  The description.\n\n",
    )
    (issue,) = await tracker_for(folder).fetch_candidate_issues()
    assert issue.id == "uuid-1"
    assert issue.identifier == "DEMO-1"
    assert issue.title == "Add a greeting"
    assert issue.state == "In Progress"
    assert issue.priority == 2
    assert issue.labels == ("demo", "backend")
    assert issue.assignee_id == "alice"
    assert issue.branch_name == "demo-1-greeting"
    assert issue.description == "The description."
    assert issue.created_at == datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert issue.updated_at == datetime.datetime(2026, 1, 2, 23, 0, tzinfo=UTC)
    assert issue.url == path.absolute().as_uri()
    assert issue.native_ref == {"path": str(path)}
    assert issue.dispatchable


async def test_defaults_id_from_identifier_and_identifier_from_the_file_name(folder: Path) -> None:
    write(folder, "ABC-7.md", issue_text())
    write(folder, "b.md", issue_text(extra="identifier: XYZ-1\n"))
    a, b = await tracker_for(folder).fetch_candidate_issues()
    assert (a.id, a.identifier) == ("ABC-7", "ABC-7")
    assert (b.id, b.identifier) == ("XYZ-1", "XYZ-1")
    assert a.description is None
    assert a.created_at is None
    assert a.updated_at is not None  # the file's mtime when the file has none


def test_unusable_optional_metadata_becomes_empty_without_hiding_the_issue() -> None:
    record = parse_issue_file(
        "---\ntitle: No\nstate: On\npriority: high\nlabels: just-a-string\n"
        "created_at: yesterday\nassignee: [a, b]\nblocked_by: {x: 1}\n---\n",
        path=Path("x.md"),
    )
    assert record.issue is not None
    # NB: YAML 1.1 would read "No"/"On" as booleans; the tracker keeps them as text.
    assert (record.issue.title, record.issue.state) == ("No", "On")
    assert record.issue.priority is None
    assert record.issue.labels == ()
    assert record.issue.created_at is None
    assert record.issue.assignee_id is None
    assert record.blocker_refs == ()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("no front matter at all\n", "no front matter"),
        ("---\ntitle: [unclosed\n---\n", "bad YAML"),
        ("---\n- a list\n---\n", "not a mapping"),
        ("---\nstate: Todo\n---\n", "missing title"),
        ("---\ntitle: '   '\n---\n", "missing title and state"),
        ("---\ntitle: x\nstate: Todo\n", "no front matter"),  # never closed
    ],
)
def test_malformed_files_say_why(text: str, problem: str) -> None:
    record = parse_issue_file(text, path=Path("bad.md"))
    assert record.issue is None
    assert record.problem is not None
    assert problem in record.problem


async def test_candidate_reads_drop_malformed_files_and_log_them_once(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(folder, "good.md", issue_text())
    write(folder, "bad-yaml.md", "---\ntitle: [\n---\n")
    write(folder, "no-title.md", "---\nstate: Todo\n---\n")
    tracker = tracker_for(folder)
    with caplog.at_level(logging.DEBUG, logger="lorenz.trackers"):
        assert [i.id for i in await tracker.fetch_candidate_issues()] == ["good"]
        assert [i.id for i in await tracker.fetch_candidate_issues()] == ["good"]
    records = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.WARNING, logging.DEBUG]
    assert "count=2" in records[0].getMessage()
    assert "no-title.md: missing title" in records[0].getMessage()


async def test_id_refresh_fails_when_a_requested_issue_is_malformed(folder: Path) -> None:
    write(folder, "good.md", issue_text())
    write(folder, "broken.md", "---\nid: B-1\nstate: Todo\n---\n")
    write(folder, "garbled.md", "---\n: : :\n---\n")
    tracker = tracker_for(folder)
    # Not requested, so not a problem:
    assert [i.id for i in await tracker.fetch_issues_by_ids(["good", "gone"])] == ["good"]
    for wanted in ("B-1", "garbled"):
        with pytest.raises(TrackerError) as err:
            await tracker.fetch_issues_by_ids(["good", wanted])
        assert err.value.code == "files_malformed_issue"


async def test_duplicate_ids_keep_the_first_file(folder: Path) -> None:
    write(folder, "a.md", issue_text(extra="id: SAME\n", title="first"))
    write(folder, "b.md", issue_text(extra="id: SAME\n", title="second"))
    tracker = tracker_for(folder)
    assert [i.title for i in await tracker.fetch_candidate_issues()] == ["first"]
    scan = tracker.scan()
    assert scan.malformed[0].problem is not None
    assert "duplicate id" in scan.malformed[0].problem


async def test_empty_inputs_do_not_read_the_folder(folder: Path) -> None:
    tracker = tracker_for(folder / "missing")  # any read would fail
    assert await tracker.fetch_issues_by_ids([]) == []
    assert await tracker.fetch_issues_by_states([]) == []
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "files_folder_missing"
    assert err.value.key_path == "tracker.path"


async def test_blockers_resolve_by_id_or_identifier_and_unknown_ones_have_no_state(
    folder: Path,
) -> None:
    write(folder, "a.md", issue_text(extra="id: A\nblocked_by: [B-1, c-id, NOPE, B-1]\n"))
    write(folder, "b.md", issue_text("Done", extra="id: b-id\nidentifier: B-1\n"))
    write(folder, "c.md", issue_text("In Progress", extra="id: c-id\nidentifier: C-1\n"))
    tracker = tracker_for(folder)
    (a,) = await tracker.fetch_issues_by_ids(["A"])
    assert a.blocked_by == (
        BlockerRef(id="b-id", identifier="B-1", state="Done"),
        BlockerRef(id="c-id", identifier="C-1", state="In Progress"),
        BlockerRef(id=None, identifier="NOPE", state=None),
    )


async def test_a_single_blocker_may_be_a_plain_value(folder: Path) -> None:
    write(folder, "a.md", issue_text(extra="blocked_by: b\n"))
    write(folder, "b.md", issue_text("Done"))
    (a,) = await tracker_for(folder).fetch_issues_by_ids(["a"])
    assert a.blocked_by == (BlockerRef(id="b", identifier="b", state="Done"),)


async def test_edits_are_seen_on_the_next_call(folder: Path) -> None:
    path = write(folder, "a.md", issue_text("Todo"))
    tracker = tracker_for(folder)
    assert len(await tracker.fetch_candidate_issues()) == 1
    # A same-size rewrite through rename (as sed -i does), even with the old mtime restored.
    before = path.stat()
    replacement = folder / ".a.md.new"
    replacement.write_text(issue_text("Done"), encoding="utf-8")
    os.replace(replacement, path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert await tracker.fetch_candidate_issues() == []
    (done,) = await tracker.fetch_issues_by_states(["done"])
    assert done.id == "a"
    write(folder, "new.md", issue_text("In Progress"))
    path.unlink()
    assert [i.id for i in await tracker.fetch_candidate_issues()] == ["new"]


async def test_unchanged_files_are_not_parsed_again(folder: Path) -> None:
    write(folder, "a.md", issue_text())
    write(folder, "b.md", issue_text())
    tracker = tracker_for(folder)
    first = tracker.scan()
    write(folder, "b.md", issue_text("Done", body="changed"))
    second = tracker.scan()
    assert second.issues[0] is first.issues[0]
    assert second.issues[1] is not first.issues[1]
    assert second.issues[1].state == "Done"


async def test_ignored_names(folder: Path) -> None:
    write(folder, "a.md", issue_text())
    for name in (".hidden.md", "_template.md", "README.md", "notes.txt", ".a.md.x.tmp"):
        write(folder, name, issue_text())
    (folder / "sub.md").mkdir()
    assert [i.id for i in await tracker_for(folder).fetch_candidate_issues()] == ["a"]


async def test_assignee_routing(folder: Path) -> None:
    write(folder, "mine.md", issue_text(extra="assignee: Alice\n"))
    write(folder, "theirs.md", issue_text(extra="assignee: bob\n"))
    write(folder, "nobody.md", issue_text())
    got = await tracker_for(folder, assignee="alice").fetch_candidate_issues()
    assert {i.id: i.dispatchable for i in got} == {"mine": True, "nobody": False, "theirs": False}
    write(folder, "me.md", issue_text(extra=f"assignee: {getpass.getuser()}\n"))
    got = await tracker_for(folder, assignee="me").fetch_candidate_issues()
    assert [i.id for i in got if i.dispatchable] == ["me"]
    got = await tracker_for(folder).fetch_candidate_issues()
    assert all(i.dispatchable for i in got)


# -- writing -----------------------------------------------------------------------------------


def test_set_issue_state_changes_only_the_state_and_updated_at_lines(folder: Path) -> None:
    original = (
        "---\n"
        "# a comment the human wrote\n"
        "title: Keep me\n"
        "state: >\n"
        "  Todo\n"
        "updated_at: 2020-01-01T00:00:00Z\n"
        "labels: [x]\n"
        "---\n"
        "Body with state: Todo inside it.\n"
    )
    path = write(folder, "a.md", original)
    os.chmod(path, 0o640)
    now = datetime.datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert set_issue_state(path, "Done", now=now) == path
    assert path.read_text() == (
        "---\n"
        "# a comment the human wrote\n"
        "title: Keep me\n"
        "state: Done\n"
        "updated_at: 2026-05-06T07:08:09Z\n"
        "labels: [x]\n"
        "---\n"
        "Body with state: Todo inside it.\n"
    )
    assert path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in folder.iterdir()) == ["a.md"]  # no temp file left


async def test_set_issue_state_by_id_is_seen_by_the_tracker(folder: Path) -> None:
    write(folder, "a.md", issue_text(extra="id: uuid-a\nidentifier: A-1\n"))
    write(folder, "b.md", issue_text())
    tracker = tracker_for(folder)
    assert tracker.set_issue_state("A-1", "In Progress") == folder / "a.md"
    set_issue_state("b", "Done", folder=folder)
    (a,) = await tracker.fetch_candidate_issues()
    assert (a.id, a.state) == ("uuid-a", "In Progress")
    with pytest.raises(TrackerError) as err:
        tracker.set_issue_state("nope", "Done")
    assert err.value.code == "files_issue_not_found"


def test_set_issue_state_adds_a_missing_state_and_keeps_crlf(folder: Path) -> None:
    path = folder / "a.md"
    path.write_bytes(b"---\r\ntitle: T\r\n---\r\nbody\r\n")
    set_issue_state(path, "Todo")
    assert path.read_bytes() == b"---\r\ntitle: T\r\nstate: Todo\r\n---\r\nbody\r\n"


@pytest.mark.parametrize("state", ["Done", "In Progress", "yes", "Done: really", "#1", "10", " x "])
def test_states_are_written_so_they_read_back_the_same(folder: Path, state: str) -> None:
    path = write(folder, "a.md", issue_text())
    set_issue_state(path, state)
    record = parse_issue_file(path.read_text(), path=path)
    assert record.issue is not None
    assert record.issue.state == state.strip()


def test_yaml_scalar_is_plain_when_safe() -> None:
    assert yaml_scalar("In Progress") == "In Progress"
    assert yaml_scalar("null") == '"null"'
    assert yaml_scalar("a: b") == '"a: b"'


def test_set_issue_state_errors(folder: Path) -> None:
    no_front_matter = write(folder, "plain.md", "just text\n")
    with pytest.raises(TrackerError) as err:
        set_issue_state(no_front_matter, "Done")
    assert err.value.code == "files_malformed_issue"
    with pytest.raises(TrackerError) as err:
        set_issue_state(folder / "missing.md", "Done")
    assert err.value.code == "files_issue_not_found"
    with pytest.raises(TrackerError) as err:
        set_issue_state(no_front_matter, "  ")
    assert err.value.code == "files_invalid_state"
    with pytest.raises(ValueError, match="front matter"):
        replace_front_matter_value("x", "state", "y")


def test_the_command_line_moves_an_issue(folder: Path) -> None:
    write(folder, "a.md", issue_text(extra="identifier: A-1\n"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "controller")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lorenz.trackers",
            "set-state",
            "A-1",
            "Done",
            "--folder",
            folder,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(folder / "a.md")
    assert "state: Done\n" in (folder / "a.md").read_text()
    failed = subprocess.run(
        [
            sys.executable,
            "-m",
            "lorenz.trackers",
            "set-state",
            "B-9",
            "Done",
            "--folder",
            folder,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert failed.returncode == 2
    assert failed.stderr.startswith("files_issue_not_found:")
