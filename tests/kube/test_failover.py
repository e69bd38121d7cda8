"""Several operator processes: Workflows are sharded by Lease, and a dead leader is replaced.

Each process is a real ``lorenz operator`` with short Lease timings (3 s / 2 s / 0.5 s), so a
takeover after ``kill -9`` is expected within lease duration plus a retry period or two (the
follower only *observes* the last renewal, up to one retry period after it happened). Every
agent run is logged with wall-clock times by the agent itself; a slot that ran twice at once
would show up as two overlapping intervals.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections.abc import Callable

import pytest

from tests.cluster.cluster import wait_until
from tests.kube.operators import (
    Kube,
    OperatorProcess,
    Rig,
    completed_by,
    issue_state,
    overlapping_runs,
    write_issue,
)

pytestmark = pytest.mark.cluster

LEASE = (3, 2.0, 0.5)


def leader_of(kube: Kube, workflow: str, candidates: list[OperatorProcess]) -> OperatorProcess:
    def found() -> OperatorProcess | None:
        holder = kube.holder(workflow)
        return next((o for o in candidates if o.identity == holder and o.alive), None)

    return wait_until(found, timeout=30, interval=0.05, message=f"a leader of {workflow}")


def test_workflows_are_sharded_each_led_by_exactly_one_replica(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    a = operators("shard-a", namespaces=(kube.namespace,), lease=LEASE)
    b = operators("shard-b", namespaces=(kube.namespace,), lease=LEASE)
    rig.issues.mkdir()
    names = [f"wf-{i}" for i in range(4)]
    for name in names:
        kube.apply(rig.workflow(name, interval_ms=1000))
    for name in names:
        leader = leader_of(kube, name, [a, b])
        other = b if leader is a else a
        wait_until(lambda n=name, lead=leader: lead.leads(kube.namespace, n) or None,
                   timeout=15, message="the holder leads")
        assert not other.leads(kube.namespace, name)
        status = wait_until(
            lambda n=name: (s := kube.get("workflow", n).get("status")) and s["leader"]["identity"]
            and s,
            timeout=15, message="status names the leader",
        )
        assert status["leader"]["identity"] == leader.identity


def test_sigterm_releases_the_lease_and_a_follower_resumes_at_once(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    a = operators("term-a", namespaces=(kube.namespace,), lease=LEASE)
    write_issue(rig.issues, "TASK-1")
    kube.apply(rig.workflow("graceful", seconds=3.0))
    wait_until(lambda: rig.runs() or None, timeout=30, message="a run on A")
    operators("term-b", namespaces=(kube.namespace,), lease=LEASE)
    assert kube.holder("graceful") == "term-a"

    a.kill(signal.SIGTERM)
    stopped_at = time.monotonic()
    assert a.wait(timeout=30) == 0
    wait_until(lambda: kube.holder("graceful") == "term-b" or None, timeout=10, interval=0.05,
               message="B takes over")
    takeover = time.monotonic() - stopped_at
    # Without the release B would wait a full lease duration (3 s) after A's last renewal.
    assert takeover < 3.0, takeover
    print(f"\ngraceful handover after SIGTERM: {takeover:.2f} s (lease duration 3 s)")
    wait_until(lambda: issue_state(rig.issues, "TASK-1") == "Done" or None, timeout=30,
               message="B finishes the issue")
    runs = rig.runs()
    assert len(runs) == 2
    assert runs[0].attempt == 0
    assert runs[1].attempt == 1  # the continuation retry A's shutdown left in the Claim
    assert overlapping_runs(runs) == []
    assert "Lease released" in a.log()


@pytest.mark.parametrize("failovers", [10, pytest.param(30, marks=pytest.mark.soak)])
def test_kill_9_failovers_resume_from_claims_and_never_run_a_slot_twice(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess], failovers: int
) -> None:
    identities = iter(f"fo-{i}" for i in range(100))
    live = [operators(next(identities), namespaces=(kube.namespace,), lease=LEASE)
            for _ in range(2)]
    # Enough work that every kill lands on a leader with runs in flight.
    issues = [f"TASK-{i}" for i in range(3 * failovers)]
    for identifier in issues:
        write_issue(rig.issues, identifier)
    kube.apply(rig.workflow("failover", seconds=3.0, max_backoff_ms=10000, concurrency=3))

    times: list[float] = []
    for _ in range(failovers):
        leader = leader_of(kube, "failover", live)
        # Let the leader work (and renew) for a moment, so it dies holding Claims.
        time.sleep(1.0)
        leader.kill(signal.SIGKILL)
        killed_at = time.monotonic()
        leader.wait(timeout=10)
        live.remove(leader)
        survivor = live[0]
        wait_until(lambda s=survivor: kube.holder("failover") == s.identity or None,
                   timeout=15, interval=0.02, message="the survivor takes over")
        times.append(time.monotonic() - killed_at)
        live.append(operators(next(identities), namespaces=(kube.namespace,), lease=LEASE))

    wait_until(
        lambda: all(issue_state(rig.issues, i) == "Done" for i in issues) or None,
        timeout=240, interval=0.5, message="every issue done after the failovers",
    )
    wait_until(lambda: kube.items("claims") == [] or None, timeout=30, message="Claims released")
    runs = rig.runs()
    assert overlapping_runs(runs) == []
    # A slot whose run completed (moved its issue to Done) never ran again.
    for identifier in issues:
        slot = f"{identifier}#0"
        of_slot = [r for r in runs if r.slot == slot]
        (completing,) = [r for r in of_slot if r.pid == completed_by(rig.issues, identifier)]
        assert all(r.started <= completing.started for r in of_slot), of_slot
    # Interrupted runs were resumed from their Claims as failure retries.
    interrupted = [r for r in runs if r.pid != completed_by(rig.issues, r.slot.split("#")[0])]
    assert len(interrupted) >= failovers // 2, (len(interrupted), failovers)
    assert sum(r.attempt >= 1 for r in runs) >= len(interrupted)
    for run in runs:
        with pytest.raises(ProcessLookupError):
            os.kill(run.pid, 0)
    duration, _, period = LEASE
    # The last renewal is observed up to a (jittered) retry period late; the follower then
    # tries again right at the observed expiry.
    assert statistics.median(times) <= duration + period, times
    assert max(times) <= duration + 2 * period + 0.5, times
    print(
        f"\nfailover after kill -9 ({len(times)}x, lease {duration} s, retry {period} s): "
        f"min {min(times):.2f} s, median {statistics.median(times):.2f} s, "
        f"max {max(times):.2f} s; {len(issues)} issues, {len(runs)} runs, "
        f"{len(interrupted)} interrupted and retried"
    )


def owner_of_first_claim(kube: Kube) -> str | None:
    claims = kube.items("claims")
    return claims[0]["status"]["owner"] if claims else None


def claim_writes(operator: OperatorProcess) -> float:
    total = 0.0
    for line in operator.get("/metrics").splitlines():
        if line.startswith("lorenz_operator_api_requests_total{") and 'resource="claims' in line:
            total += float(line.rpartition(" ")[2])
    return total


def test_a_paused_leader_that_lost_its_lease_stops_before_writing_anything(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    a = operators("pause-a", namespaces=(kube.namespace,), lease=LEASE)
    write_issue(rig.issues, "TASK-1")
    kube.apply(rig.workflow("paused", seconds=8.0, max_backoff_ms=10000))
    wait_until(lambda: rig.runs() or None, timeout=30, message="A runs the issue")
    b = operators("pause-b", namespaces=(kube.namespace,), lease=LEASE)
    assert kube.holder("paused") == "pause-a"
    writes_before = claim_writes(a)

    a.kill(signal.SIGSTOP)  # a GC pause, a frozen node: A cannot renew, and does not know
    try:
        wait_until(lambda: kube.holder("paused") == "pause-b" or None, timeout=15,
                   interval=0.05, message="B takes over from the frozen A")
        wait_until(
            lambda: owner_of_first_claim(kube) == "pause-b" or None,
            timeout=15, message="B re-owns the Claim",
        )
    finally:
        a.kill(signal.SIGCONT)
    wait_until(lambda: "Lease lost" in a.log() or None, timeout=15, message="A notices")
    wait_until(lambda: not a.leads(kube.namespace, "paused") or None, timeout=15,
               message="A stopped its runtime")
    # Whatever A's runtime did when it woke up (a run ending, a tick), the fenced store sent
    # nothing: every Claim write since the pause came from B.
    assert claim_writes(a) == writes_before
    assert b.leads(kube.namespace, "paused")
    first = rig.runs()[0]
    wait_until(
        lambda: (lambda r: r if len(r) >= 2 else None)(rig.runs()), timeout=40,
        message="B retries the interrupted run",
    )
    runs = rig.runs()
    assert not first.ended
    assert overlapping_runs(runs) == []
    assert runs[1].attempt == 1
