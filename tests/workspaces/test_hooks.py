"""Running one hook: status, merged output, truncation, timeouts, process groups."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from lorenz.workspaces import (
    HOOK_FAILED_PREFIX,
    OUTPUT_LIMIT_BYTES,
    WorkspaceHookError,
    run_hook,
)
from lorenz.workspaces.hooks import hook_environment
from tests.waiting import wait_until_async
from tests.workspaces.conftest import process_gone


async def run(script: str, cwd: Path, *, timeout_ms: int = 10000) -> str:
    result = await run_hook(
        name="before_run", script=script, cwd=cwd, env=dict(os.environ), timeout_ms=timeout_ms
    )
    return result.output


async def test_success_returns_merged_output_and_runs_in_cwd(tmp_path: Path) -> None:
    output = await run("pwd; echo to-stderr >&2", tmp_path)
    assert output.splitlines() == [str(tmp_path), "to-stderr"]


async def test_non_zero_exit_is_coded_with_the_status_prefix(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceHookError) as info:
        await run("echo something broke >&2; exit 7", tmp_path)
    error = info.value
    assert error.code == "workspace_hook_failed"
    assert error.message.startswith(f"{HOOK_FAILED_PREFIX}7")
    assert error.status == 7
    assert error.hook == "before_run"
    assert "something broke" in error.output
    assert "\n" not in error.message  # one line, output escaped


async def test_signal_death_reports_shell_style_status(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceHookError) as info:
        await run("kill -TERM $$", tmp_path)
    assert info.value.status == 128 + 15
    assert info.value.message.startswith(f"{HOOK_FAILED_PREFIX}143")


async def test_output_is_cut_with_a_truncation_marker(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceHookError) as info:
        await run("head -c 10000 /dev/zero | tr '\\0' x; exit 1", tmp_path)
    output = info.value.output
    assert output.startswith("x" * OUTPUT_LIMIT_BYTES)
    assert "x" * (OUTPUT_LIMIT_BYTES + 1) not in output
    assert "truncated: 10000 bytes" in output
    assert "truncated" in info.value.message


async def test_short_output_has_no_marker(tmp_path: Path) -> None:
    output = await run("printf short", tmp_path)
    assert output == "short"


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    script = "sleep 60 & echo $! > grandchild.pid; sh -c 'sleep 60' & wait"
    with pytest.raises(WorkspaceHookError) as info:
        await run(script, tmp_path, timeout_ms=500)
    error = info.value
    assert error.code == "workspace_hook_timeout"
    assert error.timeout_ms == 500
    assert "500 ms" in error.message
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    await wait_until_async(
        lambda: process_gone(grandchild),
        timeout=5.0,
        what="process_gone(grandchild)",
    )


async def test_leftover_background_processes_die_when_the_hook_exits(tmp_path: Path) -> None:
    output = await run("sleep 60 & echo $! > bg.pid; echo done", tmp_path)
    assert output.strip() == "done"
    background = int((tmp_path / "bg.pid").read_text())
    await wait_until_async(
        lambda: process_gone(background),
        timeout=5.0,
        what="process_gone(background)",
    )


async def test_cancellation_kills_the_hook(tmp_path: Path) -> None:
    task = asyncio.create_task(run("echo $$ > shell.pid; sleep 60 & echo $! > bg.pid; wait",
                                   tmp_path))
    pid_file = tmp_path / "bg.pid"
    await wait_until_async(
        lambda: pid_file.exists() and pid_file.read_text().strip() != "",
        timeout=5.0,
        what='pid_file.exists() and pid_file.read_text().strip() != ""',
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for name in ("shell.pid", "bg.pid"):
        pid = int((tmp_path / name).read_text())

        def gone(pid: int = pid) -> bool:
            return process_gone(pid)

        await wait_until_async(gone, timeout=5.0, what=f"process {pid} to be gone")


async def test_missing_cwd_is_a_coded_error(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceHookError) as info:
        await run("true", tmp_path / "missing")
    assert info.value.code == "workspace_hook_failed"
    assert "could not start" in info.value.message


async def test_hook_runs_in_a_login_shell(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text("export FROM_PROFILE=login\n")
    result = await run_hook(
        name="after_create", script="echo $FROM_PROFILE", cwd=tmp_path,
        env={**os.environ, "HOME": str(home), "ENV": ""}, timeout_ms=10000,
    )
    assert result.output.strip() == "login"


def test_environment_strips_secrets_by_name_and_value() -> None:
    env = hook_environment(
        base={"KEEP": "1", "LINEAR_API_KEY": "lin", "COPY": "tok", "EMPTY": ""},
        strip_names=frozenset({"LINEAR_API_KEY"}),
        strip_values=frozenset({"tok"}),
        variables={"LORENZ_SLOT": "0"},
    )
    assert env == {"KEEP": "1", "EMPTY": "", "LORENZ_SLOT": "0"}


async def test_a_nul_byte_in_the_environment_is_a_coded_error(tmp_path: Path) -> None:
    env = {**os.environ, "LORENZ_ISSUE_TITLE": "bad\x00title"}
    with pytest.raises(WorkspaceHookError) as info:
        await run_hook(name="after_create", script="true", cwd=tmp_path, env=env,
                       timeout_ms=10000)
    assert info.value.code == "workspace_hook_invalid_input"
    assert "NUL byte" in info.value.message
