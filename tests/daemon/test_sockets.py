"""The control socket's directory and file are private to our user, and checked for it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from lorenz.daemon.errors import ControlDirUnsafe
from lorenz.daemon.sockets import (
    DIR_MODE,
    ensure_private_dir,
    runtime_dir,
    socket_path_for,
)
from lorenz.leadership import lease_path
from tests.daemon.harness import DaemonProcess, write_daemon_workflow


def test_runtime_dir_prefers_xdg_runtime_dir() -> None:
    assert runtime_dir(environ={"XDG_RUNTIME_DIR": "/run/user/7"}) == Path("/run/user/7/lorenz")
    fallback = Path(f"/tmp/lorenz-{os.getuid()}")
    assert runtime_dir(environ={}) == fallback
    assert runtime_dir(environ={"XDG_RUNTIME_DIR": "relative"}) == fallback


def test_socket_name_is_a_short_digest_of_the_workflow(tmp_path: Path) -> None:
    one = socket_path_for(tmp_path / "a" / "WORKFLOW.md", environ={"XDG_RUNTIME_DIR": "/r"})
    two = socket_path_for(tmp_path / "b" / "WORKFLOW.md", environ={"XDG_RUNTIME_DIR": "/r"})
    assert one.parent == Path("/r/lorenz")
    assert one != two
    assert len(one.name) == len("0" * 24 + ".sock")
    # the same digest as the lease, shortened
    assert lease_path(tmp_path / "a" / "WORKFLOW.md").name.startswith(one.stem)


def test_private_dir_is_created_0700_and_tightened(tmp_path: Path) -> None:
    made = ensure_private_dir(tmp_path / "run" / "lorenz")
    assert stat.S_IMODE(made.stat().st_mode) == DIR_MODE
    os.chmod(made, 0o755)
    ensure_private_dir(made)
    assert stat.S_IMODE(made.stat().st_mode) == DIR_MODE


def test_private_dir_refuses_symlinks_files_and_strangers(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(ControlDirUnsafe, match="symlink") as caught:
        ensure_private_dir(link)
    assert caught.value.code == "control_dir_unsafe"
    plain = tmp_path / "file"
    plain.write_text("")
    with pytest.raises(ControlDirUnsafe, match="not a directory"):
        ensure_private_dir(plain)
    if os.getuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 4321, -1)
        with pytest.raises(ControlDirUnsafe, match="uid 4321"):
            ensure_private_dir(foreign)


def test_a_real_daemon_socket_is_0600_in_a_0700_dir(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], runtime_dir: Path
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    daemon = DaemonProcess(
        workflow, env=daemon_env, args=["--feature", "daemon"], output=root / "d.log"
    )
    daemons.append(daemon.start())
    lease = daemon.wait_ready()
    socket_file = Path(lease["endpoint"].removeprefix("unix://"))
    assert socket_file.parent == runtime_dir / "lorenz"
    info = socket_file.lstat()
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.getuid()
    assert stat.S_IMODE(socket_file.parent.stat().st_mode) == 0o700
    daemon.terminate()
    assert daemon.wait() == 0
    assert not socket_file.exists()


def test_a_daemon_refuses_an_unsafe_socket_dir(
    root: Path, daemon_env: dict[str, str], runtime_dir: Path
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    (runtime_dir / "lorenz").symlink_to(elsewhere)
    daemon = DaemonProcess(
        workflow, env=daemon_env, args=["--feature", "daemon"], output=root / "d.log"
    ).start()
    assert daemon.wait() == 1
    assert "control_dir_unsafe" in daemon.log()
    assert not lease_path(workflow).exists()  # the lease was given back on the way out
