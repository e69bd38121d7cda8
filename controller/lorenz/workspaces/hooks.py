"""Running one workspace hook: a trusted shell script from WORKFLOW.md, bounded in time.

Hooks are operator configuration, so they run with the full power of a login shell
(``sh -lc <script>``) in the workspace. What this module guarantees is containment of their
*lifetime* and of their *output*:

* each hook runs in its own session (hence its own process group), and the whole group is
  killed when the hook times out, when the caller is cancelled, and also when the hook's shell
  exits -- a hook is a step, not a way to start daemons. A hook that really must leave a
  service behind has to detach it into a session of its own (``setsid``);
* stdout and stderr are merged and captured, and only the first 2048 bytes are kept (with a
  truncation marker), because a chatty ``npm install`` must not flood logs or events.

What a failure *means* (abort the attempt, or log and carry on) is decided by the caller. The
child is started and watched by :mod:`lorenz.child_processes` (a Popen and a pidfd), not by
asyncio's subprocess layers, whose Python every run would pay for in memory (issue #35).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, Literal

from lorenz.child_processes import DEVNULL, STDOUT, start_child
from lorenz.codes import ErrorCode
from lorenz.secrets import strip_secrets
from lorenz.workspaces.errors import HOOK_FAILED_PREFIX, WorkspaceHookError

logger = logging.getLogger(__name__)

HookName = Literal["after_create", "before_run", "after_run", "before_remove"]

OUTPUT_LIMIT_BYTES = 2048
TRUNCATION_MARKER = "\n[... output truncated: {total} bytes in all, first {limit} kept]"

HOOK_SHELL: tuple[str, ...] = ("sh", "-lc")

@dataclasses.dataclass(frozen=True, slots=True)
class HookResult:
    """A hook that exited 0."""

    output: str
    """Merged stdout and stderr, cut to :data:`OUTPUT_LIMIT_BYTES` with a marker."""


def _read_capture(handle: BinaryIO, *, limit: int) -> str:
    """The first ``limit`` bytes of the captured output, with a marker if there was more."""
    total = os.fstat(handle.fileno()).st_size
    handle.seek(0)
    text = handle.read(limit).decode("utf-8", errors="replace")
    if total > limit:
        text += TRUNCATION_MARKER.format(total=total, limit=limit)
    return text


def _kill_group(pid: int) -> None:
    # NB: the group id is the shell's pid (start_new_session=True). While any member lives the
    # kernel cannot hand that number to another process, so this cannot hit a stranger; with no
    # member left it is simply ESRCH.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _exit_status(returncode: int) -> int:
    # Report a signal death the way shells do (128 + signal number), never as a negative number.
    return returncode if returncode >= 0 else 128 - returncode


def _one_line(text: str) -> str:
    return text.strip().replace("\r", "").replace("\n", "\\n")


async def run_hook(
    *,
    name: HookName,
    script: str,
    cwd: Path,
    env: Mapping[str, str],
    timeout_ms: int,
    log_context: Mapping[str, object] | None = None,
) -> HookResult:
    """Run ``script`` with ``sh -lc`` in ``cwd``; return on exit 0, raise otherwise.

    Raises :class:`WorkspaceHookError` with ``workspace_hook_failed`` (message prefix
    ``workspace hook failed with status <N>``), ``workspace_hook_timeout`` or
    ``workspace_hook_invalid_input`` (a NUL byte in the script or environment). Cancellation kills
    the hook's process group and propagates.
    """
    context = " ".join(f"{k}={v}" for k, v in (log_context or {}).items())
    logger.info("workspace hook started hook=%s workspace=%s %s", name, cwd, context)
    # NB: output goes to an unlinked temporary file, not a pipe: nobody has to read it while
    # the hook runs, a background process the hook left behind holding it cannot delay
    # anything, and a file bounds memory, however much a hook prints.
    with tempfile.TemporaryFile() as capture:
        try:
            child = start_child(
                (*HOOK_SHELL, script),
                cwd=cwd,
                env=env,
                stdin=DEVNULL,
                stdout=capture.fileno(),
                stderr=STDOUT,
            )
        except ValueError as exc:
            # NB: what subprocess says for a NUL byte in an argument or a variable (an issue
            # title or identifier with one): never retried, the same input fails the same way.
            raise WorkspaceHookError(
                f"workspace hook could not start: hooks.{name} in {cwd}: its environment or "
                f"script holds a NUL byte ({exc}); remove it from the issue or the hook",
                code=ErrorCode.WORKSPACE_HOOK_INVALID_INPUT,
                hook=name,
                path=cwd,
            ) from exc
        except OSError as exc:
            raise WorkspaceHookError(
                f"workspace hook could not start: hooks.{name} in {cwd} ({exc}); "
                "check that the workspace exists and that sh is installed",
                code=ErrorCode.WORKSPACE_HOOK_FAILED,
                hook=name,
                path=cwd,
            ) from exc
        timed_out = False
        try:
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    returncode = await child.wait()
            except TimeoutError:
                timed_out = True
        finally:
            # Runs on success, timeout and cancellation alike: nothing of the hook outlives it.
            _kill_group(child.pid)
            try:
                # NB: the exit after SIGKILL is near. A second cancellation landing here still
                # closes the watch; the Popen dropped then is reaped by the next one started.
                await child.wait()
            finally:
                child.close()
        output = _read_capture(capture, limit=OUTPUT_LIMIT_BYTES)

    if timed_out:
        logger.warning(
            "workspace hook timed out hook=%s workspace=%s timeout_ms=%d %s",
            name, cwd, timeout_ms, context,
        )
        raise WorkspaceHookError(
            f"workspace hook timed out after {timeout_ms} ms: hooks.{name} in {cwd}; "
            f"make the script finish sooner or raise hooks.timeout_ms "
            f"(output: {_one_line(output)})",
            code=ErrorCode.WORKSPACE_HOOK_TIMEOUT,
            hook=name,
            path=cwd,
            output=output,
            timeout_ms=timeout_ms,
        )
    status = _exit_status(returncode)
    if status != 0:
        logger.warning(
            "workspace hook failed hook=%s workspace=%s status=%d output=%r %s",
            name, cwd, status, output, context,
        )
        raise WorkspaceHookError(
            f"{HOOK_FAILED_PREFIX}{status}: hooks.{name} in {cwd}; fix the script "
            f"(output: {_one_line(output)})",
            code=ErrorCode.WORKSPACE_HOOK_FAILED,
            hook=name,
            path=cwd,
            status=status,
            output=output,
        )
    logger.info("workspace hook finished hook=%s workspace=%s %s", name, cwd, context)
    return HookResult(output=output)


def hook_environment(
    *,
    base: Mapping[str, str],
    strip_names: frozenset[str],
    strip_values: frozenset[str],
    variables: Mapping[str, str],
) -> dict[str, str]:
    """``base`` without tracker secrets (by name, or by a value equal to a secret), plus
    ``variables``."""
    env = strip_secrets(base=base, names=strip_names, values=strip_values)
    env.update(variables)
    return env
