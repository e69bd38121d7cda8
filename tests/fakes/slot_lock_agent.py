"""A command agent that proves a slot never runs twice at once: the frozen-worker tests' agent.

It holds a per-slot ``flock`` (in ``$AGENT_LOCKS``) while it lives and logs its start to
``$AGENT_LOG`` (one JSON line: its pid, its run's handle, ``dup`` when the lock was held by
another agent of the slot, which then exits 3). What it does then — tick, or work in silence
until killed — is the test's: :func:`slot_lock_agent` appends it.
"""

from __future__ import annotations

_HEAD = r'''
import fcntl, json, os, sys, time

LOG = os.environ["AGENT_LOG"]
SLOT = os.environ.get("LORENZ_ISSUE_ID", "") + "#" + os.environ.get("LORENZ_SLOT", "")


def record(**fields):
    line = dict(slot=SLOT, pid=os.getpid(), handle=os.environ.get("LORENZ_WORKER_HANDLE"),
                t=time.time(), **fields)
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


sys.stdin.read()
lock = os.open(os.path.join(os.environ["AGENT_LOCKS"], "slot.lock"), os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    dup = False
except BlockingIOError:
    dup = True
record(event="start", dup=dup)
if dup:
    sys.exit(3)
'''


def slot_lock_agent(*, then: str) -> str:
    """The agent's source: the lock and the start line, then ``then`` (Python, top level)."""
    return _HEAD + then
