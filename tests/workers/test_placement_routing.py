"""The placing runner hands each run to the runner for where :mod:`lorenz.policies.placement`
says it executes: this machine, an SSH host, or a Pod of its own (the operator only)."""

from __future__ import annotations

import pytest

from lorenz.agents import AgentRunner, AgentRunRequest, AgentRunResult, RunPlacement
from lorenz.config import AgentProtocol, HooksSettings, WorkerSettings
from lorenz.workers.placement import (
    PlacingRunner,
    PodRunnerUnavailable,
    SshTransports,
    SshWorkerRunner,
)


class Named:
    """A runner that is never run here: the routing only picks it."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        raise AssertionError(f"{self.name} was run")


def placing(*, pods: bool) -> tuple[PlacingRunner, dict[str, list[object]]]:
    made: dict[str, list[object]] = {"local": [], "pods": []}

    def local(protocol: AgentProtocol) -> AgentRunner:
        made["local"].append(protocol)
        return Named("local")

    def pod(placement: RunPlacement) -> AgentRunner:
        made["pods"].append(placement)
        return Named("pod")

    runner = PlacingRunner(
        workflow="/w/WORKFLOW.md",
        protocol=AgentProtocol.COMMAND,
        local=local,
        transports=SshTransports(env={}),
        pods=pod if pods else None,
    )
    return runner, made


def placement(worker: WorkerSettings, *, host: str) -> RunPlacement:
    return RunPlacement(host=host, hooks=HooksSettings(), worker=worker)


def test_no_placement_runs_on_this_machine() -> None:
    runner, made = placing(pods=True)
    assert isinstance(runner._runner_for(None), Named)
    assert made == {"local": [AgentProtocol.COMMAND], "pods": []}


def test_an_ssh_placement_is_a_worker_on_that_host() -> None:
    runner, made = placing(pods=True)
    chosen = runner._runner_for(placement(WorkerSettings(ssh_hosts=("box",)), host="box"))
    assert isinstance(chosen, SshWorkerRunner)
    assert chosen.ssh.host == "box"
    assert made == {"local": [], "pods": []}


def test_a_pod_placement_goes_to_the_pod_runner_and_is_refused_without_one() -> None:
    worker = WorkerSettings.model_validate({"kind": "pod", "pod_template": {"image": "img"}})
    runner, made = placing(pods=True)
    where = placement(worker, host="pod")
    assert isinstance(runner._runner_for(where), Named)
    assert made["pods"] == [where]
    without, _ = placing(pods=False)
    with pytest.raises(PodRunnerUnavailable) as caught:
        without._runner_for(where)
    assert caught.value.code == "worker_kind_unavailable"
