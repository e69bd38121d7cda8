"""Workspace keys and branch names."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from lorenz.workspaces import WorkspaceError, branch_name, workspace_key
from lorenz.workspaces.keys import identifier_from_key, parse_slot_dir_name, slot_dir_name


def test_safe_identifier_keeps_its_plain_key() -> None:
    assert workspace_key("ABC-1") == "ABC-1"
    assert workspace_key("a.b_c-D9") == "a.b_c-D9"


def test_changed_identifier_gets_hash_of_the_original() -> None:
    digest = hashlib.sha256(b"A/B").hexdigest()[:16]
    assert workspace_key("A/B") == f"A_B--{digest}"


def test_identifiers_that_sanitize_alike_get_distinct_keys() -> None:
    keys = {workspace_key(i) for i in ("A/B", "A?B", "A B", "A_B")}
    assert len(keys) == 4
    assert "A_B" in keys  # the one that needed no change


def test_key_is_deterministic() -> None:
    # NB: a fixed value, not f(x) == f(x): the key names directories that outlive the process,
    # so a changed rule (or a salted hash) would orphan every existing workspace.
    assert workspace_key("X:Y/Z") == "X_Y_Z--870c070021cf9cd6"
    assert workspace_key("ABC-123") == "ABC-123"
    variants = ["X:Y/Z", "X/Y:Z", "X_Y_Z", "x:y/z", "X:Y/Z "]
    assert len({workspace_key(identifier) for identifier in variants}) == len(variants)


@pytest.mark.parametrize("identifier", [".", "..", ".lorenz", ".LORENZ"])
def test_reserved_names_are_never_used_plainly(identifier: str) -> None:
    key = workspace_key(identifier)
    assert key != identifier
    assert key.startswith(identifier + "--")


@pytest.mark.parametrize("identifier", ["../../etc", "/etc/passwd", "a/../../b"])
def test_path_like_identifiers_become_one_segment(identifier: str) -> None:
    key = workspace_key(identifier)
    assert "/" not in key
    assert key not in (".", "..")


def test_unicode_is_replaced_and_hashed() -> None:
    key = workspace_key("ÄBC-1")
    assert key.startswith("_BC-1--")


def test_very_long_identifier_is_cut_and_hashed() -> None:
    key = workspace_key("A" * 400)
    assert len(key.encode()) < 255
    assert key != workspace_key("A" * 401)


def test_blank_identifier_is_a_coded_error() -> None:
    with pytest.raises(WorkspaceError) as info:
        workspace_key("")
    assert info.value.code == "workspace_identifier_blank"


def test_identifier_is_recovered_only_from_unhashed_keys() -> None:
    assert identifier_from_key("ABC-1") == "ABC-1"
    assert identifier_from_key(workspace_key("A/B")) is None
    assert identifier_from_key(".lorenz") is None


def test_slot_dir_names_round_trip() -> None:
    assert slot_dir_name(3) == "slot-3"
    assert parse_slot_dir_name("slot-3") == 3
    assert parse_slot_dir_name("slot-03") is None
    assert parse_slot_dir_name("slot-x") is None
    with pytest.raises(ValueError, match="negative"):
        slot_dir_name(-1)


@pytest.mark.parametrize(
    "identifier", ["ABC-1", "a..b", ".hidden", "x.lock", "trail.", "A/B", "...", "-dash"]
)
def test_branch_names_are_valid_git_refs(identifier: str) -> None:
    key = workspace_key(identifier)
    for slot in (None, 0, 2):
        name = branch_name(key, slot_index=slot)
        assert name.startswith("lorenz/")
        result = subprocess.run(["git", "check-ref-format", "--branch", name], capture_output=True)
        assert result.returncode == 0, name


def test_branch_names_do_not_collide() -> None:
    names = {
        branch_name(workspace_key("a..b"), slot_index=None),
        branch_name(workspace_key("a_.b"), slot_index=None),
        branch_name(workspace_key("ABC-1"), slot_index=1),
        branch_name(workspace_key("ABC-1-slot-1"), slot_index=None),
        branch_name(workspace_key("ABC-1"), slot_index=None),
    }
    assert len(names) == 5
    assert branch_name("ABC-1", slot_index=None) == "lorenz/ABC-1"
    assert branch_name("ABC-1", slot_index=2) == "lorenz/ABC-1+slot-2"
