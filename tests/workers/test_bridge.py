"""``lorenz worker --bridge``: the control protocol through a command's stdio.

The operator reaches a worker in a Pod through the API's exec channel, which carries a
command's stdin and stdout. Here the same command runs as a local subprocess, and a real worker
is followed through its pipes from launch to final record, across a dropped bridge (the handle
reconnects through a new one, after its last seq); a bridge to a socket that is not there exits
1 at once.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from lorenz.workers.handles import LocalTransport, launch
from tests.workers.conftest import Collected, SpecFactory, base_env

LORENZ = Path(sys.executable).with_name("lorenz")


class BridgedTransport(LocalTransport):
    """A local worker reached only through ``lorenz worker --bridge`` subprocesses."""

    def __init__(self, *, state_root: Path) -> None:
        super().__init__(state_root=state_root, env=base_env())
        self.bridges: list[asyncio.subprocess.Process] = []

    async def connect(self, handle: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        process = await asyncio.create_subprocess_exec(
            str(LORENZ), "worker", "--state-dir", str(self.state_dir(handle)), "--bridge",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self.bridges.append(process)
        assert process.stdout is not None
        assert process.stdin is not None
        return process.stdout, process.stdin

    async def close(self) -> None:
        """Reap every bridge on the test's own loop (then close as a local transport does).

        NB: a subprocess transport left to the garbage collector is closed after its loop is
        (``RuntimeError: Event loop is closed`` in ``__del__``, reported against a later test).
        """
        for process in self.bridges:
            if process.stdin is not None:
                process.stdin.close()
            if process.returncode is None:
                try:
                    async with asyncio.timeout(30):
                        await process.wait()
                except TimeoutError:
                    process.kill()
                    await process.wait()
        await super().close()


async def test_a_run_is_followed_to_its_end_through_bridges(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(gate="go")
    transport = BridgedTransport(state_root=state_root)
    try:
        handle, _ = await launch(spec, transport=transport)
        collected = Collected()
        follow = asyncio.ensure_future(handle.follow(collected))
        await collected.wait_for(
            lambda records: any("waiting" in str(r.data.get("message")) for r in records)
        )
        # The exec channel drops (the bridge dies): the handle reconnects through a new
        # bridge and goes on after the last record it delivered.
        first = transport.bridges[0]
        first.kill()
        await first.wait()
        scenario.open_gate("go")
        async with asyncio.timeout(120):
            final = await follow
    finally:
        await transport.close()
    assert final.data["outcome"] == "success"
    assert collected.seqs() == list(range(1, final.seq + 1))
    assert len(transport.bridges) >= 2
    assert handle.attaches >= 2


def test_a_bridge_without_a_worker_exits_at_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(LORENZ), "worker", "--state-dir", str(tmp_path), "--bridge"],
        input=b"", capture_output=True, timeout=60, check=False,
    )
    assert done.returncode == 1
    assert b"cannot connect to" in done.stderr
