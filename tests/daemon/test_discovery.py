"""Finding a daemon without importing the leadership package: same path rule, same format."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lorenz.claims.owners import default_owner_id
from lorenz.daemon.discovery import find_target, lease_file_for, parse_endpoint, read_lease
from lorenz.daemon.errors import ControlUrlInvalid, DaemonNotRunning, DaemonUnreachable
from lorenz.leadership import DaemonLockUnreadable, FileLeaseProvider, current_process, lease_path


def test_lease_path_rule_matches_the_leadership_package(tmp_path: Path) -> None:
    workflow = tmp_path / "repo" / "WORKFLOW.md"
    workflow.parent.mkdir()
    workflow.write_text("---\n---\n")
    link = tmp_path / "link.md"
    link.symlink_to(workflow)
    for spelling in (workflow, link, tmp_path / "repo" / "." / "WORKFLOW.md"):
        assert lease_file_for(spelling) == lease_path(spelling) == lease_path(workflow)
    cwd = Path.cwd()
    os.chdir(workflow.parent)
    try:
        assert lease_file_for("WORKFLOW.md") == lease_path(workflow)
    finally:
        os.chdir(cwd)


async def test_reads_what_the_file_provider_writes(tmp_path: Path) -> None:
    workflow = tmp_path / "WORKFLOW.md"
    workflow.write_text("---\n---\n")
    provider = FileLeaseProvider(workflow_path=workflow, endpoint="unix:///tmp/x.sock")
    record = await provider.acquire()
    try:
        lease = read_lease(lease_file_for(workflow))
        assert lease is not None
        assert lease["holder"] == record.holder
        assert lease["pid"] == os.getpid()
        target = find_target(workflow=str(workflow))
        assert target.endpoint.socket_path == "/tmp/x.sock"
        assert target.lease_path == provider.path
    finally:
        await provider.release()


def test_claim_owner_id_is_the_lease_holder_id() -> None:
    """The dead predecessor's lease holder names its claims: both ids must be the same string."""
    assert default_owner_id() == current_process().holder


def test_missing_and_endpointless_and_garbled_leases(tmp_path: Path) -> None:
    workflow = tmp_path / "WORKFLOW.md"
    with pytest.raises(DaemonNotRunning) as missing:
        find_target(workflow=str(workflow))
    assert missing.value.code == "daemon_not_running"
    assert str(lease_file_for(workflow)) in missing.value.message
    path = lease_file_for(workflow)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"holder": "h:1:2", "pid": 1, "host": "h", "endpoint": None}))
    with pytest.raises(DaemonUnreachable) as unpublished:
        find_target(workflow=str(workflow))
    assert unpublished.value.code == "daemon_unreachable"
    path.write_text("[1, 2]")
    with pytest.raises(DaemonLockUnreadable):
        read_lease(path)
    path.write_text("{")
    with pytest.raises(DaemonLockUnreadable):
        find_target(workflow=str(workflow))


@pytest.mark.parametrize(
    ("text", "socket_path", "host", "port", "base"),
    [
        ("unix:///run/user/1/lorenz/a.sock", "/run/user/1/lorenz/a.sock", None, None, ""),
        ("/tmp/a.sock", "/tmp/a.sock", None, None, ""),
        ("http://127.0.0.1:8080", None, "127.0.0.1", 8080, ""),
        ("http://example.com:9/lorenz/", None, "example.com", 9, "/lorenz"),
        ("http://[::1]:7", None, "::1", 7, ""),
        ("http://localhost", None, "localhost", 80, ""),
    ],
)
def test_parse_endpoint(
    text: str, socket_path: str | None, host: str | None, port: int | None, base: str
) -> None:
    endpoint = parse_endpoint(text)
    assert (endpoint.socket_path, endpoint.host, endpoint.port, endpoint.base_path) == (
        socket_path,
        host,
        port,
        base,
    )


@pytest.mark.parametrize(
    "text", ["ftp://x", "unix://relative.sock", "unix:relative", "http://:80", "http://h:99999"]
)
def test_invalid_endpoints_are_coded(text: str) -> None:
    with pytest.raises(ControlUrlInvalid) as caught:
        parse_endpoint(text)
    assert caught.value.code == "control_url_invalid"


def test_port_target_and_bad_port() -> None:
    assert find_target(workflow=None, port=8123).endpoint.url == "http://127.0.0.1:8123"
    with pytest.raises(ControlUrlInvalid):
        find_target(workflow=None, port=0)
