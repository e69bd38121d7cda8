"""Ask, answer, resume with runs in Pods on the real node (issue #33's operator part).

A ``worker.kind: pod`` Workflow with a workspace claim (a static ``hostPath``
PersistentVolume, as in tests/node/test_pod_security.py, so the test reads what the Pods wrote)
runs the scripted Codex app-server (tests/fakes/codex_agent.py, passed to the image's Python
through the agent's environment). The first run's agent leaves a file in the workspace, starts
its thread and asks; its Pod ends, the Claim shows ``WaitingForInput`` with the question, the
answer comes by the ``lorenz.dev/answer`` annotation on the Claim, and a new Pod resumes the
same thread (``thread/resume``: the fake keeps its threads under ``CODEX_HOME`` and refuses an
unknown one, as Codex does) with the answer in the turn's input, in the same workspace, where
it finds the first run's file.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cluster import wait_until
from tests.node.test_helm_operator import Install
from tests.node.test_pod_runs import diagnose, pod_workflow
from tests.node.test_pod_runs import pod_install as pod_install
from tests.node.test_pod_security import STORAGE_CLASS
from tests.node.test_pod_security import static_volumes as static_volumes
from tests.runtime.questions_rig import ASKING_TURN, FAKE_CODEX

pytestmark = [pytest.mark.node, pytest.mark.cluster, pytest.mark.timeout(1800)]

THREAD = "thr-pod"
VOLUME_ROOT = "/var/lib/lorenz/workspaces"
RECORD = f"{VOLUME_ROOT}/codex-record.jsonl"
SEEN = f"{VOLUME_ROOT}/pods-seen.txt"

# NB: the agent's command, in its workspace: the first Pod leaves its name in `first-pod`;
# every Pod appends "<its name> <the name it found>" to a file on the volume's root (outside
# the workspace), then becomes the scripted Codex.
COMMAND = textwrap.dedent(
    f"""\
    [ -e first-pod ] || cat /etc/hostname > first-pod
    echo "$(cat /etc/hostname) $(cat first-pod)" >> {SEEN}
    printf '%s' "$FAKE_CODEX_SCENARIO_JSON" > /tmp/scenario.json
    exec python3 -c "$FAKE_CODEX_SOURCE" /tmp/scenario.json"""
)


def codex_workflow(rig: Install) -> dict[str, Any]:
    body = pod_workflow(
        rig,
        seconds=1.0,
        workspace={"volumeClaimTemplate": {"storage": "1Gi", "storageClassName": STORAGE_CLASS}},
    )
    scenario = {
        "thread_id": THREAD,
        "record": RECORD,
        "turns": [ASKING_TURN],
        "resumed_turns": [{"steps": [{"agent_message": "resumed and done"}]}],
    }
    spec = body["spec"]
    spec["agent"] = {"kind": "codex", "maxConcurrentAgents": 1, "maxTurns": 1}
    spec["agents"] = {
        "codex": {
            "protocol": "codex-app-server",
            "command": COMMAND,
            "stallTimeoutMs": 120000,
            "turnTimeoutMs": 120000,
            "env": {
                "FAKE_CODEX_SOURCE": FAKE_CODEX.read_text(encoding="utf-8"),
                "FAKE_CODEX_SCENARIO_JSON": json.dumps(scenario),
            },
        }
    }
    spec["input"] = {"answerTemplate": "Answer: {{ answer }}"}
    return body


def received(record: Path, method: str) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    rows = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    return [
        row["received"].get("params") or {}
        for row in rows
        if isinstance(row.get("received"), dict) and row["received"].get("method") == method
    ]


def claims_of(rig: Install) -> list[dict[str, Any]]:
    body = rig.cluster.kubectl_json("get", "claims", "-n", rig.namespace)
    return list(body["items"])


def test_a_pod_run_asks_the_answer_comes_through_the_claim_and_a_new_pod_resumes_the_thread(
    pod_install: Install, static_volumes: list[tuple[str, Path]]
) -> None:
    rig = pod_install
    rig.cluster.apply(codex_workflow(rig), namespace=rig.namespace)
    issue = rig.linear.add_issue(title="asks in a pod")

    def waiting() -> dict[str, Any] | None:
        return next(
            (c for c in claims_of(rig)
             if (c.get("status") or {}).get("phase") == "WaitingForInput"),
            None,
        )

    try:
        claim = wait_until(waiting, timeout=420, interval=1.0, message="a WaitingForInput Claim")
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig)}") from err
    question = claim["status"]["question"]
    assert question["text"] == "Database — Which database should the cache use?"
    assert question["sessionId"] == THREAD

    # The volume the workspace claim is bound to: what the first Pod wrote is there.
    (volume,) = [
        path for _, path in static_volumes if (path / "codex-record.jsonl").exists()
    ]
    record = volume / "codex-record.jsonl"
    (started,) = received(record, "thread/start")
    workspace = started["cwd"]
    assert workspace.startswith(f"{VOLUME_ROOT}/")
    assert (volume / ".lorenz-sessions" / "codex" / "sessions" / f"{THREAD}.json").exists()
    ((first_pod, found),) = [
        line.split() for line in (volume / "pods-seen.txt").read_text().splitlines()
    ]
    assert found == first_pod
    # The question went to the tracker while the slot waits.
    wait_until(
        lambda: any("Which database" in c for c in rig.linear.comments_on(issue.id)) or None,
        timeout=120, message="the question on the tracker",
    )

    rig.cluster.kubectl(
        "annotate", "claim", claim["metadata"]["name"], "-n", rig.namespace,
        "lorenz.dev/answer=Postgres, please.",
    )
    try:
        resumed = wait_until(
            lambda: received(record, "thread/resume") or None,
            timeout=420, interval=1.0, message="the thread resumed in a new Pod",
        )
        wait_until(
            lambda: len(received(record, "turn/start")) >= 2 or None,
            timeout=120, message="the resumed turn",
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig)}") from err
    assert resumed[0]["threadId"] == THREAD
    assert resumed[0]["cwd"] == workspace
    assert len(received(record, "thread/start")) == 1, "the session was resumed, not restarted"
    rows = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert not [row for row in rows if "violation" in row], rows
    turns = received(record, "turn/start")
    assert turns[-1]["threadId"] == THREAD
    assert "Answer: Postgres, please." in json.dumps(turns[-1].get("input"))
    seen = [line.split() for line in (volume / "pods-seen.txt").read_text().splitlines()]
    assert len(seen) >= 2
    second_pod, found = seen[1]
    assert second_pod != first_pod
    assert found == first_pod, "the resumed run found the first run's file in its workspace"
    rig.linear.set_state(issue.id, "Done")
