"""The coded errors of daemon mode and of the commands that attach to a daemon.

Lease outcomes (``daemon_already_running``, ``daemon_lock_stale``, ``leadership_lost``, ...)
are :mod:`lorenz.leadership`'s; these are the ones this package adds: talking to a daemon from
the command line, the control socket's directory, and orphaned agents of a dead daemon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError


class DaemonError(LorenzError):
    """Base of this package's errors."""

    code = ErrorCode.DAEMON_ERROR


def _start_hint(workflow: Path | str | None) -> str:
    target = str(workflow) if workflow else "WORKFLOW.md"
    return f"start one with `lorenz {target} --feature daemon`"


class DaemonNotRunning(DaemonError):
    """No daemon holds the workflow's lease (or its last holder died)."""

    code = ErrorCode.DAEMON_NOT_RUNNING

    def __init__(
        self,
        *,
        workflow: Path | str | None,
        lease_path: Path | None,
        dead_pid: int | None = None,
    ) -> None:
        if dead_pid is not None:
            why = f"its last daemon (pid {dead_pid}) is gone; the lease {lease_path} is left over"
        else:
            why = f"there is no lease at {lease_path}"
        super().__init__(f"no Lorenz daemon runs {workflow} ({why}); {_start_hint(workflow)}")
        self.workflow = workflow
        self.lease_path = lease_path
        self.dead_pid = dead_pid


class DaemonUnreachable(DaemonError):
    """A daemon holds the lease, but its control endpoint does not answer."""

    code = ErrorCode.DAEMON_UNREACHABLE

    def __init__(
        self, *, endpoint: str | None, lease: Mapping[str, Any] | None, reason: str
    ) -> None:
        who = f"the daemon (pid {lease.get('pid')} on {lease.get('host')})" if lease else "it"
        where = f" at {endpoint}" if endpoint else ""
        super().__init__(
            f"cannot reach {who}{where}: {reason}; retry in a moment, or check the daemon's log"
        )
        self.endpoint = endpoint
        self.reason = reason


class DaemonRequestFailed(DaemonError):
    """The daemon answered with an error."""

    code = ErrorCode.DAEMON_REQUEST_FAILED

    def __init__(self, *, endpoint: str, path: str, status: int, error: Mapping[str, Any]) -> None:
        detail = error.get("message") or "no details"
        remote = error.get("code") or f"http_{status}"
        super().__init__(
            f"the daemon at {endpoint} refused {path} with {status} {remote}: {detail}"
        )
        self.status = status
        self.remote_code = remote


class ControlUrlInvalid(DaemonError):
    """``--url`` (or ``--port``) is not something a control client can talk to."""

    code = ErrorCode.CONTROL_URL_INVALID

    def __init__(self, *, url: str, reason: str) -> None:
        super().__init__(f"{url!r} is not a daemon endpoint: {reason}")
        self.url = url


class ControlDirUnsafe(DaemonError):
    """The per-user runtime directory for control sockets cannot be trusted."""

    code = ErrorCode.CONTROL_DIR_UNSAFE

    def __init__(self, *, path: Path, reason: str) -> None:
        super().__init__(
            f"the control socket directory {path} is unsafe ({reason}); remove it, or set "
            f"XDG_RUNTIME_DIR to a private directory, or serve over HTTP with --port"
        )
        self.path = path


class ControlSocketPathTooLong(DaemonError):
    """A unix socket path must fit in ``sun_path`` (107 bytes on Linux)."""

    code = ErrorCode.CONTROL_SOCKET_PATH_TOO_LONG

    def __init__(self, *, path: Path, limit: int) -> None:
        super().__init__(
            f"the control socket path {path} is longer than {limit} bytes; set XDG_RUNTIME_DIR "
            f"to a shorter directory, or serve over HTTP with --port"
        )
        self.path = path


class DaemonOrphansAlive(DaemonError):
    """Agents of a dead daemon outlived a SIGKILL: starting now could run an issue twice."""

    code = ErrorCode.DAEMON_ORPHANS_ALIVE

    def __init__(self, *, pids: Sequence[int], waited_s: float) -> None:
        listed = ", ".join(str(pid) for pid in pids)
        super().__init__(
            f"agent processes of a dead daemon (pids {listed}) still run {waited_s:.0f} s after "
            f"SIGKILL; find out why (stuck in the kernel? `ps -o stat,wchan -p {listed}`), then "
            f"start again"
        )
        self.pids = tuple(pids)


class DaemonStopTimeout(DaemonError):
    """``lorenz stop --wait`` gave up: the daemon accepted the stop but is still running."""

    code = ErrorCode.DAEMON_STOP_TIMEOUT

    def __init__(self, *, endpoint: str, waited_s: float) -> None:
        super().__init__(
            f"the daemon at {endpoint} accepted the stop but still runs after {waited_s:.0f} s "
            f"(runs may be slow to abort); wait longer (--timeout) or check its log"
        )
        self.endpoint = endpoint


class DaemonRunning(DaemonError):
    """A ``lorenz`` run (``--once``, plain, unmanaged) refused: a live daemon runs the workflow."""

    code = ErrorCode.DAEMON_RUNNING

    def __init__(
        self,
        *,
        workflow: Path | str | None,
        pid: int | None,
        host: str,
        endpoint: str | None,
        lease_path: Path,
    ) -> None:
        target = str(workflow) if workflow else "WORKFLOW.md"
        where = endpoint or "no endpoint yet"
        super().__init__(
            f"a Lorenz daemon (pid {pid} on {host}, {where}) runs {target}: a second process "
            f"would run its issues twice; ask it to poll now with `lorenz refresh {target}`, "
            f"see it with `lorenz status {target}` (lease {lease_path})"
        )
        self.workflow = workflow
        self.pid = pid
        self.host = host
        self.endpoint = endpoint
        self.lease_path = lease_path
