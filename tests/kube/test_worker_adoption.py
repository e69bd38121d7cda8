"""Operator failover with workers: the new leader adopts the live worker, 0 re-runs.

Two real ``lorenz operator`` processes share one workspace volume and one worker state root
(``LORENZ_WORKER_STATE``), as replicas on one host would. The Workflow's agent is the logging
script of :mod:`tests.kube.operators`, in a detached ``lorenz worker`` as every run of the
operator is by default (the Workflow says nothing about workers). The leader is
killed mid-turn — ``kill -9`` of its whole process group, as a crash would — or stopped with
SIGTERM (a graceful handover); the other replica takes the shard Lease, finds the Claim's spawn
intent, and re-attaches to the same worker after the collected ``lastSeq``. From the agent's
own marks: exactly one agent ever started and it ran to its normal end, the issue was
completed by it, once; the Claim shows the adoption (its new owner kept the worker's handle,
and the run is an ``adoption`` retry of the same attempt).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lorenz.workers.states import STATE_ROOT_ENV
from tests.cluster.cluster import wait_until
from tests.kube.operators import (
    Kube,
    OperatorProcess,
    Rig,
    completed_by,
    issue_state,
    write_issue,
)
from tests.workers.conftest import kill_workers_under

pytestmark = pytest.mark.cluster

RUNS_IN_WORKERS = True
"""The default path: no in-process switch for these operators (tests/kube/conftest.py)."""

LEASE = (3, 2.0, 0.5)


@pytest.fixture
def worker_state() -> Iterator[Path]:
    """A short state root shared by both replicas (socket paths must stay under 108 bytes);
    workers outlive operators by design, so the ones left are killed at teardown."""
    root = Path(tempfile.mkdtemp(prefix="lzo", dir="/tmp"))
    try:
        yield root
    finally:
        kill_workers_under(root)


def running_claim(kube: Kube, *, owner: str) -> dict[str, Any] | None:
    """The Claim ``owner`` holds with a worker serving (intent phase ``running``)."""
    for claim in kube.items("claims"):
        status = claim.get("status") or {}
        intent = status.get("intent") or {}
        if status.get("owner") == owner and intent.get("phase") == "running":
            return claim
    return None


def adopted_claim(kube: Kube, *, owner: str, handle: str) -> dict[str, Any] | None:
    """The Claim once ``owner`` re-attached to the worker ``handle``."""
    for claim in kube.items("claims"):
        status = claim.get("status") or {}
        intent = status.get("intent") or {}
        if (
            status.get("owner") == owner
            and status.get("retryKind") == "adoption"
            and intent.get("handle") == handle
            and intent.get("phase") in ("probing", "running")
        ):
            return claim
    return None


@pytest.mark.parametrize("stop", ["kill-9-group", "sigterm"])
def test_the_new_leader_adopts_the_live_worker_and_runs_nothing_again(
    kube: Kube,
    rig: Rig,
    operators: Callable[..., OperatorProcess],
    worker_state: Path,
    stop: str,
) -> None:
    kube.shards = 1  # one shard: exactly one candidate leader at a time
    env = {"LORENZ_WORKER_STATE": str(worker_state)}

    def replica(identity: str) -> OperatorProcess:
        return operators(identity, namespaces=(kube.namespace,), lease=LEASE,
                         shards=kube.shards, env=env, new_session=True)

    a = replica("adopt-a")
    write_issue(rig.issues_of("adopt"), "TASK-1")
    # NB: the first attempt works long enough to be mid-turn when A goes, however slow the
    # machine; had anything run it again, the retry (attempt 1) would finish in a second.
    kube.apply(rig.workflow("adopt", seconds=1.0, first_seconds=45.0))
    claim = wait_until(lambda: running_claim(kube, owner="adopt-a"), timeout=120,
                       message="A's run in a worker, its intent on the Claim")
    handle = claim["status"]["intent"]["handle"]
    generation_a = claim["status"]["generation"]
    assert claim["status"]["intent"]["generation"] == generation_a
    wait_until(lambda: rig.runs() or None, timeout=60, message="A's agent started")
    b = replica("adopt-b")
    assert kube.holder("adopt") == "adopt-a"

    if stop == "kill-9-group":
        a.kill_group(signal.SIGKILL)  # the operator and everything in its process group
        assert a.wait(timeout=30) == -signal.SIGKILL
    else:
        a.kill(signal.SIGTERM)
        assert a.wait(timeout=60) == 0
        assert "run left to its worker for the next controller" in a.log()
    left_at = time.time()
    (agent,) = rig.runs()
    assert not agent.ended, "the agent ended before its operator went: nothing to adopt"

    wait_until(lambda: kube.holder("adopt") == "adopt-b" or None, timeout=120, interval=0.05,
               message="B takes over")
    adopted = wait_until(lambda: adopted_claim(kube, owner="adopt-b", handle=handle),
                         timeout=120, message="B re-attached to A's worker")
    status = adopted["status"]
    assert status["generation"] > generation_a  # B's term, stamped on the Claim
    # The adopted run keeps the attempt it started as (a first run: 0 on the Claim), so a
    # failure after the adoption is numbered as without the failover.
    assert status["attempt"] == claim["status"]["attempt"] == 0
    wait_until(lambda: f"adopting the worker of a lost controller handle={handle}" in b.log()
               or None, timeout=60, message="B says it adopts")

    issues = rig.issues_of("adopt")
    wait_until(lambda: issue_state(issues, "TASK-1") == "Done" or None, timeout=180,
               message="the adopted run finishes the issue")
    wait_until(lambda: kube.items("claims") == [] or None, timeout=60,
               message="the Claim released")
    (run,) = rig.runs()  # one agent start, ever
    assert (run.pid, run.attempt) == (agent.pid, 0)
    assert run.ended
    assert run.last_seen > left_at  # it kept working after its operator went
    assert completed_by(issues, "TASK-1") == run.pid



@pytest.mark.timeout(900)  # NB: a two-minute run plus a takeover on a loaded machine
def test_a_paused_leader_leaves_its_worker_to_the_new_leader_and_writes_nothing(
    kube: Kube,
    rig: Rig,
    operators: Callable[..., OperatorProcess],
    worker_state: Path,
) -> None:
    """SIGSTOP (a frozen node): the other replica takes over and adopts the worker; the old
    leader, resumed, stops without a Claim request and without cancelling the worker."""
    kube.shards = 1
    env = {"LORENZ_WORKER_STATE": str(worker_state)}

    def replica(identity: str) -> OperatorProcess:
        return operators(identity, namespaces=(kube.namespace,), lease=LEASE,
                         shards=kube.shards, env=env)

    a = replica("frozen-a")
    write_issue(rig.issues_of("frozen"), "TASK-1")
    # NB: the run must outlast the takeover (a lease duration) and B's adoption: at load 28 a
    # 45 s run ended before a Claim showed B re-attached (B settled it from its final record).
    kube.apply(rig.workflow("frozen", seconds=1.0, first_seconds=120.0))
    claim = wait_until(lambda: running_claim(kube, owner="frozen-a"), timeout=120,
                       message="A's run in a worker, its intent on the Claim")
    handle = claim["status"]["intent"]["handle"]
    wait_until(lambda: rig.runs() or None, timeout=60, message="A's agent started")
    b = replica("frozen-b")
    assert kube.holder("frozen") == "frozen-a"

    a.kill(signal.SIGSTOP)
    time.sleep(0.5)  # NB: a log line being written when the signal came is complete by now
    paused_at = len(a.log())
    try:
        wait_until(lambda: kube.holder("frozen") == "frozen-b" or None, timeout=120,
                   interval=0.05, message="B takes over from the frozen A")
        wait_until(lambda: adopted_claim(kube, owner="frozen-b", handle=handle), timeout=120,
                   message="B re-attached to A's worker")
    finally:
        a.kill(signal.SIGCONT)
    wait_until(lambda: "Lease lost" in a.log() or None, timeout=60, message="A notices")
    wait_until(lambda: not a.leads(kube.namespace, "frozen") or None, timeout=60,
               message="A stopped its runtime")
    issues = rig.issues_of("frozen")
    wait_until(lambda: issue_state(issues, "TASK-1") == "Done" or None, timeout=300,
               message="the adopted run finishes the issue")
    # Whatever A's runtime did on waking (records relayed, intents to write, a run ending),
    # it sent no Claim request: every write is logged before it is sent.
    woken = a.log()[paused_at:]
    assert re.findall(r"API write verb=\S+ path=\S*/claims", woken) == []
    assert "Runtime abandoned" in woken
    (run,) = rig.runs()  # the worker was neither cancelled by A nor started again by B
    assert run.ended
    assert completed_by(issues, "TASK-1") == run.pid
    assert b.leads(kube.namespace, "frozen")


def test_with_its_private_default_state_root_a_replica_that_lets_go_cancels_its_workers(
    kube: Kube,
    rig: Rig,
    operators: Callable[..., OperatorProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No ``LORENZ_WORKER_STATE``: the state root is the replica's own (``~/.lorenz/workers``,
    in a cluster its Pod's), where no other replica could adopt a worker. So a replica stopped
    with SIGTERM cancels its run's worker (a continuation retry, as for a clean shutdown)
    instead of leaving it to go on beside the new leader's run of the same issue."""
    kube.shards = 1
    monkeypatch.delenv(STATE_ROOT_ENV, raising=False)
    home = Path(tempfile.mkdtemp(prefix="lzh", dir="/tmp"))  # NB: short: sockets live there
    root = home / ".lorenz" / "workers"
    try:
        a = operators("own-a", namespaces=(kube.namespace,), lease=LEASE, shards=kube.shards,
                      env={"HOME": str(home)})
        assert STATE_ROOT_ENV not in a.env
        write_issue(rig.issues_of("own"), "TASK-1")
        kube.apply(rig.workflow("own", seconds=1.0, first_seconds=45.0))
        claim = wait_until(lambda: running_claim(kube, owner="own-a"), timeout=120,
                           message="A's run in a worker, its intent on the Claim")
        handle = claim["status"]["intent"]["handle"]
        assert (root / handle / "journal.jsonl").exists(), "the worker keeps its state in HOME"
        wait_until(lambda: rig.runs() or None, timeout=60, message="A's agent started")
        a.kill(signal.SIGTERM)
        assert a.wait(timeout=60) == 0
        final = json.loads((root / handle / "journal.jsonl").read_text().splitlines()[-1])
        assert (final["kind"], final["data"]["outcome"]) == ("final", "canceled")
        (first,) = rig.runs()
        assert not first.ended, "the agent was stopped with its worker"

        b = operators("own-b", namespaces=(kube.namespace,), lease=LEASE, shards=kube.shards,
                      env={"HOME": str(home)})
        issues = rig.issues_of("own")
        wait_until(lambda: issue_state(issues, "TASK-1") == "Done" or None, timeout=180,
                   message="the next leader runs the issue again")
        assert "adopting the worker" not in b.log()
        earlier, later = rig.runs()
        assert later.started >= earlier.last_seen, "two agents of one issue at once"
        assert completed_by(issues, "TASK-1") == later.pid
    finally:
        kill_workers_under(root)
        shutil.rmtree(home, ignore_errors=True)
