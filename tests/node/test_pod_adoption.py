"""Runs in Pods outlive their operator: adoption on failover, and stops that remove the Pod.

Two real ``lorenz operator`` processes on the host (as two replicas would be) lead one
Workflow that names no ``worker.kind`` (``pod``, the operator's default) against the test
cluster; its runs are Pods on the real node, their agent the recorder-reporting script of
:mod:`tests.node.test_helm_operator`, so every agent start is a mark of its own (counted,
never timed).

* ``kill -9`` of the leader's whole process group mid-turn: the other replica takes the shard
  Lease, finds the run's Pod through its Claim's spawn intent (the handle, which names the Pod,
  carries the generation of the term that started it), re-attaches through the exec channel
  after the collected sequence number, and the one agent ever started finishes the issue; the
  Pod and its spec Secret are deleted afterwards.
* Deleting the run's Claim stops its agent (cancelled over the control protocol: the agent
  says it was stopped) and deletes the Pod and its spec Secret; the issue, still active, runs
  again. The issue turning terminal stops that run the same way, and nothing runs after it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lorenz.kube.pods.manifests import pod_name
from tests.cluster.cluster import Cluster, wait_until
from tests.cluster.images import agent_image
from tests.cluster.node import NODE_TOLERATION, Node
from tests.fakes.linear_server import FakeLinearServer
from tests.kube.operators import Kube, OperatorProcess
from tests.node.pods import RESTRICTED_LABELS, recorder_egress
from tests.node.test_helm_operator import AGENT, AGENT_PATH, REPO, Recorder, Run

pytestmark = [pytest.mark.node, pytest.mark.cluster, pytest.mark.timeout(1800)]

LEASE = (6, 4.0, 1.0)
"""Lease duration, renew deadline, retry period of the replicas (as the node tests' chart)."""


@dataclass
class HostRig:
    cluster: Cluster
    namespace: str
    linear: FakeLinearServer
    recorder: Recorder
    recorder_url: str  # as the Pods reach it
    image: str


@pytest.fixture(scope="module")
def host_rig(
    kube_control_plane: Cluster,
    kube_node: Node,
    linear: FakeLinearServer,
    recorder: Recorder,
) -> Iterator[HostRig]:
    image = agent_image(AGENT)
    kube_node.import_image(image.archive)
    kube_control_plane.install_crds(REPO / "crds")
    namespace = kube_control_plane.create_namespace(labels=RESTRICTED_LABELS)
    recorder_host, recorder_port = kube_node.forward_to_host(port=recorder.port)
    kube_control_plane.kubectl(
        "create", "secret", "generic", "linear", "-n", namespace,
        f"--from-literal=token={linear.api_key}",
    )
    yield HostRig(
        cluster=kube_control_plane,
        namespace=namespace,
        linear=linear,
        recorder=recorder,
        recorder_url=f"http://{recorder_host}:{recorder_port}/",
        image=image.ref,
    )
    kube_control_plane.delete_namespace(namespace, wait=False)


@pytest.fixture
def replicas(
    host_rig: HostRig, tmp_path: Path
) -> Iterator[Callable[[str], OperatorProcess]]:
    """Start operator replicas on the host (one shard: one candidate leader at a time)."""
    started: list[OperatorProcess] = []

    def start(identity: str, prelude: str = "") -> OperatorProcess:
        operator = OperatorProcess(
            host_rig.cluster,
            identity=identity,
            workdir=tmp_path / "operators",
            namespaces=(host_rig.namespace,),
            lease=LEASE,
            lease_namespace=host_rig.namespace,
            shards=1,
            new_session=True,
            prelude=prelude,
        )
        started.append(operator)
        return operator.start()

    yield start
    for operator in started:
        operator.stop()


def pod_workflow(rig: HostRig, *, name: str, seconds: float) -> dict[str, Any]:
    """A Workflow whose runs are Pods: the operator (on the host) reads the fake Linear server
    directly; the agent (in the Pod) reports to the recorder through the node's forward."""
    return {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {
            "tracker": {
                "kind": "linear",
                "endpoint": rig.linear.url,
                "projectSlug": rig.linear.project_slug,
                "apiKeySecretRef": {"name": "linear", "key": "token"},
            },
            "polling": {"intervalMs": 500},
            "agent": {"kind": "script", "maxConcurrentAgents": 2},
            "agents": {
                "script": {
                    "protocol": "command",
                    "command": f"python3 {AGENT_PATH}",
                    "stallTimeoutMs": 60000,
                    "turnTimeoutMs": 900000,
                    "env": {
                        "AGENT_RECORDER_URL": rig.recorder_url,
                        "AGENT_SECONDS": str(seconds),
                    },
                }
            },
            "retry": {"backoff": {"initialMs": 1000}},
            "worker": {  # no kind: pod is the operator's default
                "podTemplate": {
                    "image": rig.image,
                    "imagePullPolicy": "Never",
                    "tolerations": [NODE_TOLERATION],
                    "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                                  "limits": {"memory": "512Mi"}},
                },
                "startTimeoutMs": 180000,
                "egress": recorder_egress(rig.recorder_url),
            },
            "prompt": "Work on {{ issue.identifier }}",
        },
    }


def running_claim(kube: Kube, *, owner: str) -> dict[str, Any] | None:
    """The Claim ``owner`` holds with its run's worker serving (intent phase ``running``)."""
    for claim in kube.items("claims"):
        status = claim.get("status") or {}
        intent = status.get("intent") or {}
        if status.get("owner") == owner and intent.get("phase") == "running":
            return claim
    return None


def pod_uid(rig: HostRig, name: str) -> str | None:
    """The uid of the Pod ``name`` (``None``: no such Pod)."""
    done = rig.cluster.kubectl(
        "get", "pod", name, "-n", rig.namespace, "-o", "jsonpath={.metadata.uid}", check=False
    )
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def secret_exists(rig: HostRig, name: str) -> bool:
    done = rig.cluster.kubectl("get", "secret", name, "-n", rig.namespace, check=False)
    if done.returncode != 0:
        assert "NotFound" in done.stderr, done.stderr
    return done.returncode == 0


def wait_pod_gone(rig: HostRig, name: str, uid: str) -> None:
    """Until the Pod ``name`` of ``uid`` is gone (a successor of the same name may live)."""
    wait_until(lambda: pod_uid(rig, name) != uid or None, timeout=180, interval=0.5,
               message=f"the run Pod {name} deleted")


def started_runs(rig: HostRig, issue: str) -> list[Run]:
    return [run for run in rig.recorder.runs_of(issue) if run.started]


def delete_workflow(rig: HostRig, name: str) -> None:
    rig.cluster.kubectl("delete", "workflow", name, "-n", rig.namespace, "--wait=true",
                        "--timeout=180s", timeout=240.0)


def diagnose(rig: HostRig, *operators: OperatorProcess) -> str:
    pods = rig.cluster.kubectl("describe", "pods", "-n", rig.namespace, check=False)
    logs = "\n".join(f"--- {o.identity}\n{o.log()[-6000:]}" for o in operators)
    return f"{logs}\n{pods.stdout[-4000:]}"


def test_a_killed_leaders_run_pod_is_adopted_by_the_other_replica_and_runs_once(
    host_rig: HostRig, replicas: Callable[[str], OperatorProcess]
) -> None:
    rig = host_rig
    kube = Kube(rig.cluster, rig.namespace, shards=1)
    a = replicas("pods-a")
    # NB: long enough to be mid-turn when A goes, however slow the machine; a second start
    # (a re-run) would show as a second start mark.
    kube.apply(pod_workflow(rig, name="adopt", seconds=45.0))
    issue = rig.linear.add_issue(title="adopted")
    try:
        claim = wait_until(lambda: running_claim(kube, owner="pods-a"), timeout=300,
                           interval=0.5, message="A's run Pod serving, its intent on the Claim")
        wait_until(lambda: started_runs(rig, issue.id) or None, timeout=120, interval=0.5,
                   message="the agent in the Pod started")
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig, a)}") from err
    status = claim["status"]
    handle = status["intent"]["handle"]
    name = pod_name(handle)
    # The handle carries the term's generation (from the shard Lease), as the Claim does.
    assert status["intent"]["generation"] == status["generation"]
    assert f"-g{status['generation']}-" in handle
    uid = pod_uid(rig, name)
    assert uid is not None
    b = replicas("pods-b")
    assert kube.holder("adopt") == "pods-a"

    a.kill_group(signal.SIGKILL)  # the operator and everything in its process group
    assert a.wait(timeout=30) == -signal.SIGKILL
    (agent,) = started_runs(rig, issue.id)
    assert not agent.ended, "the agent ended before its operator went: nothing to adopt"
    assert agent.pod == name

    try:
        wait_until(lambda: kube.holder("adopt") == "pods-b" or None, timeout=180,
                   interval=0.2, message="B takes over")
        wait_until(
            lambda: f"adopting the worker of a lost controller handle={handle}" in b.log()
            or None, timeout=180, message="B adopts A's run Pod",
        )
        adopted = kube.get("claims", claim["metadata"]["name"])["status"]
        assert adopted["owner"] == "pods-b"
        assert adopted["intent"]["handle"] == handle
        assert adopted["generation"] > status["generation"]
        wait_until(
            lambda: (rig.linear.state_of(issue.id) == "Done"
            and any(r.ended for r in rig.recorder.runs_of(issue.id))) or None,
            timeout=300, interval=0.5, message="the adopted run finishes the issue",
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig, a, b)}") from err
    (run,) = started_runs(rig, issue.id)  # one agent start, ever: nothing ran again
    assert (run.run, run.pod) == (agent.run, name)
    assert run.ended
    assert run.stopped_at is None
    # Settled by B: the Pod, its spec Secret and the Claim are gone.
    wait_pod_gone(rig, name, uid)
    wait_until(lambda: not secret_exists(rig, f"{name}-spec") or None, timeout=60,
               message="the spec Secret deleted")
    wait_until(lambda: kube.items("claims") == [] or None, timeout=120,
               message="the Claim released")
    assert "worker_gone" not in b.log()
    delete_workflow(rig, "adopt")


LAUNCH_NEVER_ANSWERS = """
import asyncio
from lorenz.kube.pods import transport as _transport
_launch = _transport.PodTransport.launch
async def _launch_that_never_answers(self, spec):
    await _launch(self, spec)
    # NB: the Pod is created and its worker serves (its agent runs); the controller never
    # learns it, so the slot is never bound: the Claim stays Reserved / spawn_requested.
    await asyncio.Event().wait()
_transport.PodTransport.launch = _launch_that_never_answers
"""
"""A replica whose Pod launches never answer: a run stays reserved while its agent works."""


def reserved_claim(kube: Kube, *, owner: str) -> dict[str, Any] | None:
    """The Claim ``owner`` holds still ``Reserved``, its intent naming the run's Pod."""
    for claim in kube.items("claims"):
        status = claim.get("status") or {}
        intent = status.get("intent") or {}
        if (status.get("owner") == owner and status.get("phase") == "Reserved"
                and intent.get("phase") == "spawn_requested"):
            return claim
    return None


def test_a_run_still_reserved_when_its_operator_stops_is_adopted_not_run_again(
    host_rig: HostRig, replicas: Callable[..., OperatorProcess]
) -> None:
    """#37 point 3: the operator stops (SIGTERM, as when its Pod is deleted) while a run's Pod
    runs its agent and the Claim still says ``Reserved / spawn_requested`` (here: a launch
    that never answers). The next leader adopts that Pod; the agent is started once."""
    rig = host_rig
    kube = Kube(rig.cluster, rig.namespace, shards=1)
    a = replicas("reserved-a", prelude=LAUNCH_NEVER_ANSWERS)
    kube.apply(pod_workflow(rig, name="reserved", seconds=40.0))
    issue = rig.linear.add_issue(title="reserved when its operator stops")
    try:
        claim = wait_until(lambda: reserved_claim(kube, owner="reserved-a"), timeout=300,
                           interval=0.5, message="A's run reserved, its spawn intent recorded")
        wait_until(lambda: started_runs(rig, issue.id) or None, timeout=300, interval=0.5,
                   message="the agent in the Pod started")
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig, a)}") from err
    handle = claim["status"]["intent"]["handle"]
    name = pod_name(handle)
    uid = pod_uid(rig, name)
    assert uid is not None
    (agent,) = started_runs(rig, issue.id)
    assert agent.pod == name
    assert kube.get("claims", claim["metadata"]["name"])["status"]["phase"] == "Reserved"
    b = replicas("reserved-b")

    a.kill_group(signal.SIGTERM)  # a graceful stop: A hands the Workflow over
    a.wait(timeout=90)
    assert not agent.ended, "the agent ended before its operator went: nothing to adopt"
    try:
        wait_until(lambda: kube.holder("reserved") == "reserved-b" or None, timeout=180,
                   interval=0.2, message="B takes over")
        wait_until(
            lambda: f"adopting the worker of a lost controller handle={handle}" in b.log()
            or None, timeout=180, message="B adopts A's run Pod",
        )
        wait_until(
            lambda: (rig.linear.state_of(issue.id) == "Done"
            and any(r.ended for r in rig.recorder.runs_of(issue.id))) or None,
            timeout=300, interval=0.5, message="the adopted run finishes the issue",
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig, a, b)}") from err
    assert "orphan run Pods deleted" not in b.log()
    (run,) = started_runs(rig, issue.id)  # one agent start for the attempt
    assert (run.run, run.pod) == (agent.run, name)
    assert run.ended
    assert run.stopped_at is None
    wait_pod_gone(rig, name, uid)
    delete_workflow(rig, "reserved")


def test_a_deleted_claim_or_a_terminal_issue_stops_the_agent_and_removes_pod_and_secret(
    host_rig: HostRig, replicas: Callable[[str], OperatorProcess]
) -> None:
    rig = host_rig
    kube = Kube(rig.cluster, rig.namespace, shards=1)
    a = replicas("stops-a")
    kube.apply(pod_workflow(rig, name="stops", seconds=900.0))
    issue = rig.linear.add_issue(title="stopped twice")
    try:
        claim = wait_until(lambda: running_claim(kube, owner="stops-a"), timeout=300,
                           interval=0.5, message="the run Pod serving")
        wait_until(lambda: started_runs(rig, issue.id) or None, timeout=120, interval=0.5,
                   message="the agent in the Pod started")
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig, a)}") from err
    name = pod_name(claim["status"]["intent"]["handle"])
    uid = pod_uid(rig, name)
    assert uid is not None
    assert secret_exists(rig, f"{name}-spec")
    (first,) = started_runs(rig, issue.id)

    # -- the Claim deleted: the agent is told to stop, the Pod and its Secret go.
    rig.cluster.kubectl("delete", "claim", claim["metadata"]["name"], "-n", rig.namespace)
    try:
        wait_until(
            lambda: next((r.stopped_at for r in rig.recorder.runs_of(issue.id)
                          if r.run == first.run), None),
            timeout=180, interval=0.5, message="the agent stopped (cancelled by its worker)",
        )
        wait_pod_gone(rig, name, uid)
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig, a)}") from err
    wait_until(lambda: not secret_exists(rig, f"{name}-spec") or None, timeout=60,
               message="the spec Secret deleted")
    assert "ClaimDeleted" in kube.reasons("stops")

    # -- the issue is still active: it runs again, in a Pod of its own.
    try:
        claim = wait_until(lambda: running_claim(kube, owner="stops-a"), timeout=300,
                           interval=0.5, message="the issue runs again")
        wait_until(lambda: len(started_runs(rig, issue.id)) == 2 or None, timeout=120,
                   interval=0.5, message="the second agent started")
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig, a)}") from err
    second = started_runs(rig, issue.id)[1]
    name = pod_name(claim["status"]["intent"]["handle"])
    assert second.pod == name
    uid = pod_uid(rig, name)
    assert uid is not None

    # -- the issue turns terminal: that run stops the same way, and nothing runs after it.
    rig.linear.set_state(issue.id, "Done")
    try:
        wait_until(
            lambda: next((r.stopped_at for r in rig.recorder.runs_of(issue.id)
                          if r.run == second.run), None),
            timeout=180, interval=0.5, message="the second agent stopped",
        )
        wait_pod_gone(rig, name, uid)
        wait_until(lambda: not secret_exists(rig, f"{name}-spec") or None, timeout=60,
                   message="the spec Secret deleted")
        wait_until(lambda: kube.items("claims") == [] or None, timeout=120,
                   message="the Claim released")
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig, a)}") from err
    delete_workflow(rig, "stops")
    assert len(started_runs(rig, issue.id)) == 2
    assert rig.cluster.kubectl_json(
        "get", "pods", "-n", rig.namespace, "-l", "lorenz.dev/workflow=stops"
    )["items"] == []
