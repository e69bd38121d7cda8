"""Workers forked by the launcher (``LocalTransport(forkserver=True)``, the single host's
transport): real ``lorenz worker --launcher`` processes, the scripted Codex agent."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from lorenz.config import AgentLaunch, AgentProtocol
from lorenz.model import LorenzError
from lorenz.workers.forkserver import LAUNCHER_MARK
from lorenz.workers.handles import LocalTransport, WorkerHandle
from lorenz.workers.spec import HookSpec, IssueSpec, RunSpec, decode_spec, encode_spec
from lorenz.workers.states import HANDLE_ENV, LOG_NAME, STATUS_NAME, create_state_dir, worker_pid
from tests.waiting import wait_until_async
from tests.workers.conftest import Collected, SpecFactory, base_env, process_gone

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the launcher needs PR_SET_PDEATHSIG (Linux)"
)


async def test_concurrent_launches_fork_their_workers_from_one_launcher(
    state_root: Path, make_spec: SpecFactory
) -> None:
    transport = LocalTransport(state_root=state_root, env=base_env(), forkserver=True)
    assert transport.launcher is not None
    specs = [make_spec()[0] for _ in range(3)]
    try:
        results = await asyncio.gather(*(transport.launch(spec) for spec in specs))
        finals = []
        for spec, result in zip(specs, results, strict=True):
            assert result.existing is None
            assert result.handle == spec.handle
            assert result.pid is not None
            worker = psutil.Process(result.pid)
            # Forked, not exec'd: the launcher's command line, no interpreter start per run.
            assert "--launcher" in worker.cmdline()
            assert "--spec" not in worker.cmdline()
            assert os.getsid(result.pid) == result.pid, "a session of its own"
            assert worker.ppid() != os.getpid(), "not the controller's child"
            # One fork a run: the launcher's fork is the worker (no launch child between).
            assert worker.ppid() == transport.launcher.pid
            # The orphan sweep passes it by; the leftovers scan never takes it for a run's.
            assert worker.environ().get(HANDLE_ENV) == LAUNCHER_MARK
            handle = WorkerHandle(transport=transport, handle=result.handle)
            finals.append(await handle.follow(Collected()))
        assert [f.data["outcome"] for f in finals] == ["success"] * 3
        assert transport.launcher.starts == 1
        launcher_pid = transport.launcher.pid
        assert launcher_pid is not None
    finally:
        await transport.close()
    await wait_until_async(
        lambda: process_gone(launcher_pid),
        timeout=60.0,
        what="process_gone(launcher_pid)",
    )


async def test_a_warmed_up_launcher_is_running_before_the_first_launch_and_serves_it(
    state_root: Path, make_spec: SpecFactory
) -> None:
    transport = LocalTransport(state_root=state_root, env=base_env(), forkserver=True)
    assert transport.launcher is not None
    try:
        assert transport.warm_up() is True
        assert transport.warm_up() is False, "started once"
        launcher = transport.launcher
        await wait_until_async(
            lambda: launcher.pid is not None and not process_gone(launcher.pid),
            timeout=60.0,
            what="launcher.pid is not None and not process_gone(launcher.pid)",
        )
        warmed = launcher.pid
        result = await transport.launch(make_spec()[0])
        assert launcher.pid == warmed
        assert launcher.starts == 1
        handle = WorkerHandle(transport=transport, handle=result.handle)
        assert (await handle.follow(Collected())).data["outcome"] == "success"
    finally:
        await transport.close()


async def test_a_launcher_preloads_only_the_named_protocols_and_still_runs_any(
    state_root: Path, make_spec: SpecFactory
) -> None:
    # The scripted agent speaks codex-app-server; the launcher preloaded only the command
    # runner: the worker imports the Codex runner after its fork, and the run succeeds.
    # NB: and the real entry (`lorenz worker --launcher`) loads asyncio and hashlib with ssl and
    # OpenSSL's hashes kept out (lorenz.workers.image_limits): neither the launcher nor its
    # worker maps a TLS library.
    transport = LocalTransport(state_root=state_root, env=base_env(), forkserver=True,
                               preload=["command"])
    assert transport.launcher is not None
    try:
        result = await transport.launch(make_spec()[0])
        assert transport.launcher.pid is not None
        cmdline = psutil.Process(transport.launcher.pid).cmdline()
        assert cmdline[cmdline.index("--preload") + 1] == "command"
        handle = WorkerHandle(transport=transport, handle=result.handle)
        launcher_maps = await asyncio.to_thread(_maps, transport.launcher.pid)
        worker_maps = await asyncio.to_thread(_maps, result.pid)
        assert (await handle.follow(Collected())).data["outcome"] == "success"
    finally:
        await transport.close()
    for maps in (launcher_maps, worker_maps):
        assert "libssl" not in maps
        assert "libcrypto" not in maps


async def test_a_forked_worker_logs_to_its_own_log_through_the_launchers_handler(
    state_root: Path, make_spec: SpecFactory
) -> None:
    # NB: the launcher configures logging once, before its forks (launch.configure_worker_
    # logging); each worker's stderr is its own log, and the inherited handler writes there.
    transport = LocalTransport(state_root=state_root, env=base_env(), forkserver=True,
                               preload=["codex-app-server"])
    try:
        results = [await transport.launch(make_spec(hooks=HookSpec(before_run="true"))[0])
                   for _ in range(2)]
        for result in results:
            handle = WorkerHandle(transport=transport, handle=result.handle)
            assert (await handle.follow(Collected())).data["outcome"] == "success"
    finally:
        await transport.close()
    for result in results:
        log = (Path(result.state_dir) / LOG_NAME).read_text()
        assert " INFO lorenz.workspaces.hooks workspace hook started hook=before_run" in log
        assert log.count("hook started hook=before_run") == 1, log


def _maps(pid: int | None) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_modules_kept_out_of_the_image_load_again_once_let_in() -> None:
    code = (
        "import sys\n"
        "from lorenz.workers import image_limits\n"
        "assert image_limits.keep_out()\n"
        "import asyncio, hashlib\n"
        "loaded = [m for m in image_limits.KEPT_OUT if sys.modules.get(m) is not None]\n"
        "digest = hashlib.sha256(b'lorenz').hexdigest()\n"
        "image_limits.let_in()\n"
        "import ssl\n"
        "print(loaded, digest, ssl.OPENSSL_VERSION.split()[0], image_limits.keep_out())\n"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120).stdout.split()
    import hashlib

    # Nothing of TLS loaded while kept out; Python's own sha256 gives OpenSSL's digest; once let
    # in, ssl loads; and marking again is refused (too late: ssl is loaded).
    assert output == ["[]", hashlib.sha256(b"lorenz").hexdigest(), "OpenSSL", "False"]


def test_the_preload_imports_the_named_runners_only() -> None:
    code = (
        "import sys\n"
        "from lorenz.workers.forkserver import _preload\n"
        "_preload(protocols=['command'])\n"
        "print(sorted(m for m in ('lorenz.agents.command', 'lorenz.agents.acp', "
        "'lorenz.agents.codex', 'lorenz.workers.worker') if m in sys.modules))\n"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120).stdout
    assert output.strip() == "['lorenz.agents.command', 'lorenz.workers.worker']"


@pytest.mark.parametrize("tmpdir_name", ["tmp", "t" * 100], ids=["tmp", "tmp-too-long"])
def test_the_preload_rehearses_the_workers_asyncio_and_leaves_nothing_behind(
    tmp_path: Path, tmpdir_name: str
) -> None:
    code = (
        "import asyncio, json, os, threading, warnings\n"
        "import psutil\n"
        "from lorenz.workers.forkserver import _preload\n"
        "fds = sorted(os.listdir('/proc/self/fd'))\n"
        "_preload(protocols=['command'])\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore', DeprecationWarning)\n"
        "    watcher = asyncio.get_event_loop_policy().get_child_watcher()\n"
        "print(json.dumps({'threads': threading.active_count(),\n"
        "                  'children': len(psutil.Process().children()),\n"
        "                  'fds_added': sorted(set(os.listdir('/proc/self/fd')) - set(fds)),\n"
        "                  'watcher': type(watcher).__name__}))\n"
    )
    # NB: under a long temporary directory the whole runs cannot bind their sockets (107 bytes):
    # they fail half-way, and must leave nothing open either.
    scratch = tmp_path / tmpdir_name
    scratch.mkdir()
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120, env={**os.environ, "TMPDIR": str(scratch)},
                            ).stdout
    # NB: the rehearsal ran the workers' subprocess path with their watcher (a pidfd, no
    # waiter thread), and left no thread, child, socket or other descriptor behind for the forks,
    # nor any file of its whole runs.
    assert json.loads(output) == {
        "threads": 1, "children": 0, "fds_added": [], "watcher": "PidfdChildWatcher"
    }
    assert list(scratch.iterdir()) == []


def test_the_preload_rehearses_whole_worker_runs_so_forks_do_not_warm_their_code() -> None:
    # NB: a code object the interpreter has quickened (specialised) reads differently with
    # ``adaptive=True``; one that never ran, or ran too few times, reads the same. Those below run
    # once a run, in the worker only: the preload must have run them often enough before the fork.
    code = (
        "import dis, json\n"
        "from lorenz.workers.forkserver import _preload\n"
        "from lorenz.workers.worker import Worker\n"
        "from lorenz.agents.command import CommandRunner\n"
        "def quickened(function):\n"
        "    pairs = zip(dis.get_instructions(function, adaptive=True),\n"
        "                dis.get_instructions(function))\n"
        "    return any(a.opname != b.opname for a, b in pairs)\n"
        "functions = {'Worker.run': Worker.run, 'Worker._execute': Worker._execute,\n"
        "             'Worker._handle': Worker._handle, 'Worker.close': Worker.close,\n"
        "             'CommandRunner.run': CommandRunner.run}\n"
        "before = {name: quickened(f) for name, f in functions.items()}\n"
        "_preload(protocols=['command'])\n"
        "print(json.dumps({'before': before,\n"
        "                  'after': {name: quickened(f) for name, f in functions.items()}}))\n"
    )
    output = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, check=True, timeout=120).stdout)
    assert not any(output["before"].values()), output
    assert all(output["after"].values()), output


def test_warming_up_without_a_running_loop_does_nothing(state_root: Path) -> None:
    transport = LocalTransport(state_root=state_root, env=base_env(), forkserver=True)
    assert transport.warm_up() is False
    assert LocalTransport(state_root=state_root, env=base_env()).warm_up() is False


async def test_a_warm_up_that_fails_leaves_the_error_to_the_first_launch(
    state_root: Path, make_spec: SpecFactory
) -> None:
    transport = LocalTransport(
        state_root=state_root, env=base_env(), forkserver=True,
        command=(str(state_root / "no-such-lorenz"), "worker"),
    )
    try:
        assert transport.warm_up() is True
        await asyncio.sleep(0.1)
        with pytest.raises(LorenzError) as caught:
            await transport.launch(make_spec()[0])
        assert caught.value.code == "worker_launch_failed"
    finally:
        await transport.close()


async def test_a_launch_error_comes_back_with_its_code(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec()
    deep = state_root / ("d" * 90)
    transport = LocalTransport(state_root=deep, env=base_env(), forkserver=True)
    try:
        with pytest.raises(LorenzError) as caught:
            await transport.launch(spec)
        assert caught.value.code == "worker_socket_path_too_long"
        # The launcher stays up for the next launch.
        assert transport.launcher is not None
        assert transport.launcher.starts == 1
        assert transport.launcher.pid is not None
        assert not process_gone(transport.launcher.pid)
    finally:
        await transport.close()


async def test_a_launcher_that_died_is_started_again_at_the_next_launch(
    state_root: Path, make_spec: SpecFactory
) -> None:
    transport = LocalTransport(state_root=state_root, env=base_env(), forkserver=True)
    assert transport.launcher is not None
    try:
        first = await transport.launch(make_spec()[0])
        dead = transport.launcher.pid
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        await wait_until_async(
            lambda: process_gone(dead),
            timeout=60.0,
            what="process_gone(dead)",
        )
        second = await transport.launch(make_spec()[0])
        assert transport.launcher.starts == 2
        for result in (first, second):
            handle = WorkerHandle(transport=transport, handle=result.handle)
            assert (await handle.follow(Collected())).data["outcome"] == "success"
    finally:
        await transport.close()


async def test_a_launcher_killed_before_the_loop_saw_it_is_replaced_by_the_next_launch(
    state_root: Path, make_spec: SpecFactory
) -> None:
    # The loop has not yet processed the launcher's exit (nothing yielded to it since the
    # kill), so the launcher still looks alive: the launch finds it gone when it writes, and
    # starts a new one instead of failing the run.
    transport = LocalTransport(state_root=state_root, env=base_env(), forkserver=True)
    assert transport.launcher is not None
    try:
        await transport.launch(make_spec()[0])
        dead = transport.launcher.pid
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not process_gone(dead) and time.monotonic() < deadline:
            time.sleep(0.01)  # noqa: ASYNC251 - blocking on purpose: the loop must not see the exit
        assert process_gone(dead)
        second = await transport.launch(make_spec()[0])
        assert transport.launcher.starts == 2
        handle = WorkerHandle(transport=transport, handle=second.handle)
        assert (await handle.follow(Collected())).data["outcome"] == "success"
    finally:
        await transport.close()


CONTROLLER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from lorenz.workers.handles import LocalTransport
    from lorenz.workers.spec import decode_spec

    async def main():
        spec = decode_spec(Path(sys.argv[2]).read_bytes())
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
        transport = LocalTransport(state_root=Path(sys.argv[1]), env=env, forkserver=True)
        await transport.launch(spec)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


async def test_a_controller_killed_mid_launch_takes_the_unserving_worker_along(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    """NB: a forked worker cannot carry its handle in ``/proc/<pid>/environ``, so the
    leftovers scan of a successor would not find it: it must die with its launch instead, as
    long as it does not serve. Here it is held before it binds its socket: its log is a FIFO
    nobody reads yet, and opening it for writing blocks."""
    spec, scenario = make_spec()
    spec_file = tmp_path / "spec.json"
    spec_file.write_bytes(encode_spec(spec))
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    state_dir = create_state_dir(state_root, spec.handle)
    os.mkfifo(state_dir / LOG_NAME, 0o600)
    controller = subprocess.Popen(  # noqa: ASYNC220 - killed with -9 below, never awaited
        [sys.executable, str(script), str(state_root), str(spec_file)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    reader: int | None = None
    try:
        chain: list[psutil.Process] = []

        def worker_forked() -> bool:
            with contextlib.suppress(psutil.Error):
                # controller -> launcher -> worker (the launcher's fork becomes the worker)
                chain[:] = psutil.Process(controller.pid).children(recursive=True)
                return len(chain) >= 2
            return False

        await wait_until_async(worker_forked, timeout=120, what="worker_forked")
        controller.kill()
        controller.wait(timeout=60)
        for pid in [process.pid for process in chain]:
            await wait_until_async(
                functools.partial(process_gone, pid),
                timeout=30,
                what="functools.partial(process_gone, pid)",
            )
        # A worker still alive would now get through its log and bind its socket.
        reader = os.open(state_dir / LOG_NAME, os.O_RDONLY | os.O_NONBLOCK)
        await asyncio.sleep(3.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            controller.kill()
        controller.wait(timeout=60)
        if reader is not None:
            os.close(reader)
    assert not (state_dir / STATUS_NAME).exists(), "a worker served after its launch died"
    assert worker_pid(state_dir) is None
    assert not scenario.marks.exists(), "the agent started"


def test_the_launcher_leaves_the_spec_to_its_fork(tmp_path: Path) -> None:
    # NB: a start request as the controller writes it is not decoded by the launcher (each page
    # it writes after a fork is one more page the fork owns; issue #35): its spec is the fork's
    # to parse. So a spec that is not JSON at all gets the fork's answer (worker_spec_invalid),
    # where a launcher that decoded the line itself could only drop it unanswered; a request in
    # the plain form is still served, and a line that is nothing is skipped.
    handle = "lzw-ABC-1-s0-a0-g0-0123456789ab"
    lines = [
        '{"id": 1, "handle": "' + handle + '", "spec": {not json}}',
        "not a request",
        json.dumps({"id": 2, "spec": {"version": 1}}),
        '{"id": 3, "handle": "' + handle + '", "spec": {"version": 1}}',
    ]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "lorenz.cli.worker", "--launcher", "--state-root",
         str(tmp_path), "--parent", str(os.getpid()), "--preload", "command"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        # NB: unbuffered: select() sees the pipe, not a buffer; a buffered readline would take
        # two answers that arrived together and leave the second where select() cannot see it.
        bufsize=0,
    )
    assert launcher.stdin is not None
    assert launcher.stdout is not None
    answers: dict[int, dict[str, Any]] = {}
    try:
        launcher.stdin.write("".join(line + "\n" for line in lines).encode())
        launcher.stdin.flush()
        # NB: the launcher answers while its stdin is open (its end means: the controller is
        # gone, nothing to answer): read the three answers first, with a bound.
        deadline = time.monotonic() + 120
        while len(answers) < 3 and time.monotonic() < deadline:
            ready, _, _ = select.select([launcher.stdout], [], [], 1.0)
            if ready:
                line = launcher.stdout.readline()
                if not line:
                    break
                answer = json.loads(line)
                answers[answer["id"]] = answer["answer"]
    finally:
        launcher.stdin.close()
        launcher.wait(timeout=60)
        launcher.stdout.close()
    assert sorted(answers) == [1, 2, 3], answers
    for answer in answers.values():
        assert answer["ok"] is False
        assert answer["code"] == "worker_spec_invalid"
    assert "JSON" in answers[1]["message"] or "json" in answers[1]["message"]
    assert list(tmp_path.iterdir()) == []


def test_a_forked_worker_keeps_the_spec_document_it_was_sent(
    tmp_path: Path, state_root: Path
) -> None:
    # NB: the fork writes spec.json from the request's own bytes (read and checked whole), not
    # encoded again (issue #35): a document laid out otherwise than the encoder's is kept as is.
    workspace = tmp_path / "ws"
    workspace.mkdir()
    spec = RunSpec(
        workflow=str(tmp_path / "WORKFLOW.md"),
        issue=IssueSpec(id="i-1", identifier="ABC-1", title="kept", state="Todo"),
        prompt="as sent",
        agent=AgentLaunch(protocol=AgentProtocol.COMMAND, command="true", login_shell=False),
        workspace=str(workspace),
        max_turns=1,
        linger_ms=0,
    )
    document = json.dumps(json.loads(encode_spec(spec)), indent=1)
    request = '{"id": 1, "handle": "' + spec.handle + '", "spec": ' + document + "}"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "lorenz.cli.worker", "--launcher", "--state-root",
         str(state_root), "--parent", str(os.getpid()), "--preload", "command"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
    )
    assert launcher.stdin is not None
    assert launcher.stdout is not None
    try:
        # NB: a start request is one line: the indented document's newlines become spaces.
        launcher.stdin.write(request.replace("\n", " ").encode() + b"\n")
        launcher.stdin.flush()
        ready, _, _ = select.select([launcher.stdout], [], [], 120)
        assert ready, "the launcher did not answer"
        answer = json.loads(launcher.stdout.readline())["answer"]
    finally:
        launcher.stdin.close()
        launcher.wait(timeout=60)
        launcher.stdout.close()
    assert answer["ok"] is True, answer
    written = (Path(answer["state_dir"]) / "spec.json").read_bytes()
    assert written == document.replace("\n", " ").encode()
    assert decode_spec(written) == spec


def test_the_launcher_refuses_to_run_for_a_parent_that_is_not_its_own(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lorenz.cli.worker", "--launcher", "--state-root",
         str(tmp_path), "--parent", "1"],
        input=json.dumps({"id": 1, "spec": {}}) + "\n",
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
