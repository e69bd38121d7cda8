"""Run Pods on the real node: the issue's workspace claim across attempts, a hostile agent, and
what a Workflow's deletion takes along.

Storage: the test node has no provisioner (no StorageClass, no CSI driver), so the test makes
static ``hostPath`` PersistentVolumes of its own class (``lorenz-static``, owned by uid 10001,
reclaim ``Retain``) and the Workflow's ``volumeClaimTemplate`` names that class: the API
server's PersistentVolume binder binds each issue's claim to one of them, as a provisioner
would have made it. The Pods mount only the claim (``hostPath`` is refused by the namespace's
``restricted`` Pod Security Standard; a PersistentVolume is not a Pod volume).

The agent is the same image's Python with a script from its environment
(``python3 -c "$HOSTILE"``): its first attempt writes a file into the workspace and fails; the
second finds that file (the claim is kept across attempts), then tries to (a) read a
ServiceAccount token from the usual paths, (b) call the Kubernetes API (the
``KUBERNETES_SERVICE_HOST`` address and ``kubernetes.default``), (c) read another namespace's
workspace (a claim there whose volume holds a marker) and (d) find the tracker token (its
environment, its files, the spec Secret), and reports everything it saw to the test's recorder;
the test asserts each attempt failed from that report. The issue goes Done, so its claim is
deleted; then the Workflow's deletion removes its Pods, claims and spec Secrets.
"""

from __future__ import annotations

import json
import os
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cluster import Cluster, wait_until
from tests.cluster.node import Node
from tests.node.test_helm_operator import WORKFLOW, Install
from tests.node.test_pod_runs import diagnose, pod_workflow, run_pods
from tests.node.test_pod_runs import pod_install as pod_install

pytestmark = [pytest.mark.node, pytest.mark.cluster, pytest.mark.timeout(1800)]

STORAGE_CLASS = "lorenz-static"
MARKER_FILE = "attempt-0.txt"

HOSTILE = textwrap.dedent(
    """\
    import glob, json, os, socket, ssl, sys, urllib.request, uuid

    env = dict(os.environ)
    sys.stdin.read()
    run = uuid.uuid4().hex[:12]

    def post(what, **extra):
        body = {"what": what, "run": run, "pod": socket.gethostname(),
                "issue": env["LORENZ_ISSUE_ID"], **extra}
        request = urllib.request.Request(
            env["AGENT_RECORDER_URL"], data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=30).read()

    marker = os.path.join(os.getcwd(), "%(marker)s")
    if not os.path.exists(marker):
        with open(marker, "w") as out:
            out.write(run)
        post("first", cwd=os.getcwd())
        print("first attempt: failing on purpose", flush=True)
        sys.exit(3)

    report = {"cwd": os.getcwd(), "found": open(marker).read()}
    # (a) ServiceAccount tokens.
    tokens = {}
    for path in ["/var/run/secrets/kubernetes.io/serviceaccount/token",
                 "/run/secrets/kubernetes.io/serviceaccount/token",
                 *glob.glob("/var/run/secrets/**", recursive=True),
                 *glob.glob("/run/secrets/**", recursive=True)]:
        try:
            with open(path) as handle:
                tokens[path] = "read:" + handle.read(64)
        except OSError as exc:
            tokens[path] = type(exc).__name__
    report["tokens"] = tokens
    # (b) The Kubernetes API, as whatever this Pod is.
    api = {}
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    targets = [f"https://kubernetes.default.svc/api/v1/namespaces/{env['AGENT_NAMESPACE']}/secrets"]
    if host:
        targets += [
            f"https://{host}:{port}/api/v1/namespaces/{env['AGENT_NAMESPACE']}/secrets",
            f"https://{host}:{port}/api/v1/namespaces/{env['AGENT_NAMESPACE']}/secrets/linear",
            f"https://{host}:{port}/api/v1/namespaces/{env['AGENT_OTHER_NAMESPACE']}/pods",
        ]
    for url in targets:
        try:
            with urllib.request.urlopen(url, timeout=10, context=insecure) as answer:
                api[url] = f"status {answer.status}: " + answer.read(300).decode(errors="replace")
        except urllib.error.HTTPError as exc:
            api[url] = f"status {exc.code}"
        except Exception as exc:
            api[url] = f"error {type(exc).__name__}: {exc}"
    report["api"] = api
    # (c) Another namespace's workspace: its volume's folder on the node, and a search.
    other = env["AGENT_OTHER_PATH"]
    try:
        report["other_listing"] = os.listdir(other)
    except OSError as exc:
        report["other_listing"] = type(exc).__name__
    hits = []
    secret_word = env["AGENT_OTHER_MARKER_NAME"]
    for folder, dirs, files in os.walk("/", onerror=lambda e: None):
        if folder == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev", "usr")]
        if secret_word in files:
            hits.append(os.path.join(folder, secret_word))
    report["other_hits"] = hits
    report["mounts"] = open("/proc/self/mounts").read()
    # (d) The tracker token: everything this process can see of its environment and files.
    report["env"] = env
    spec = {}
    for path in glob.glob("/var/run/lorenz/spec/*"):
        try:
            spec[path] = open(path).read()
        except OSError as exc:
            spec[path] = type(exc).__name__
    report["spec"] = spec
    home = {}
    for folder, dirs, files in os.walk(os.path.expanduser("~")):
        for name in files:
            try:
                home[os.path.join(folder, name)] = open(os.path.join(folder, name)).read(2000)
            except Exception as exc:
                home[os.path.join(folder, name)] = type(exc).__name__
    report["home"] = home
    post("report", report=report)
    post("done")
    post("end")
    """
) % {"marker": MARKER_FILE}


def static_volume(name: str, path: Path, *, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"lorenz.test/static": "true"}},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(path), "type": "Directory"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]},
            ]}]}},
        },
    }


@pytest.fixture
def static_volumes(
    kube_control_plane: Cluster, kube_node: Node, tmp_path: Path
) -> Iterator[list[tuple[str, Path]]]:
    """Four static hostPath PersistentVolumes of STORAGE_CLASS, writable by uid 10001."""
    paths = []
    names = []
    for index in range(4):
        path = tmp_path / f"pv-{index}"
        path.mkdir()
        os.chown(path, 10001, 10001)
        paths.append(path)
        name = f"lorenz-static-{uuid.uuid4().hex[:8]}"
        names.append(name)
        kube_control_plane.apply(static_volume(name, path, node=kube_node.name))
    # NB: pytest's basetemp folders are 0700; the kubelet (root) bind-mounts the leaf, so only
    # the leaf's owner matters.
    yield list(zip(names, paths, strict=True))
    for name in names:
        kube_control_plane.kubectl("delete", "pv", name, "--wait=false", check=False)


def claims(rig: Install, namespace: str | None = None) -> list[dict[str, Any]]:
    body = rig.cluster.kubectl_json(
        "get", "pvc", "-n", namespace or rig.namespace, "-l", f"lorenz.dev/workflow={WORKFLOW}"
    )
    return [c for c in body["items"] if not c["metadata"].get("deletionTimestamp")]


def marks(rig: Install, issue: str, what: str) -> list[dict[str, Any]]:
    return [m for m in list(rig.recorder.marks) if m["issue"] == issue and m["what"] == what]


def test_claims_across_attempts_a_hostile_agent_and_the_workflows_deletion(
    pod_install: Install,
    static_volumes: list[tuple[str, Path]],
) -> None:
    rig = pod_install
    cluster = rig.cluster

    # Another namespace's workspace: a claim there, bound to a volume that holds a marker.
    other = cluster.create_namespace()
    marker_name = f"other-{uuid.uuid4().hex[:8]}"
    other_volume, other_path = static_volumes[3]
    (other_path / marker_name).write_text("another namespace's work")
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "their-workspace", "namespace": other},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": STORAGE_CLASS,
                "resources": {"requests": {"storage": "1Gi"}},
                "volumeName": other_volume,
            },
        }
    )

    body = pod_workflow(
        rig,
        seconds=1.0,
        workspace={"volumeClaimTemplate": {"storage": "1Gi", "storageClassName": STORAGE_CLASS}},
    )
    script = body["spec"]["agents"]["script"]
    script["command"] = 'python3 -c "$HOSTILE"'
    script["env"].update(
        {
            "HOSTILE": HOSTILE,
            "AGENT_NAMESPACE": rig.namespace,
            "AGENT_OTHER_NAMESPACE": other,
            "AGENT_OTHER_PATH": str(other_path),
            "AGENT_OTHER_MARKER_NAME": marker_name,
        }
    )
    cluster.apply(body, namespace=rig.namespace)
    issue = rig.linear.add_issue(title="hostile")
    try:
        wait_until(lambda: marks(rig, issue.id, "report") or None, timeout=420, interval=1.0,
                   message="the second attempt's report")
        rig.wait_done(issue.id, timeout=120)
    except (TimeoutError, AssertionError) as err:
        raise AssertionError(f"{err}\n{diagnose(rig)}") from err

    # The claim kept the first attempt's file for the second, in another Pod.
    (first,) = marks(rig, issue.id, "first")
    (report_mark,) = marks(rig, issue.id, "report")
    report = report_mark["report"]
    assert report["found"] == first["run"]
    assert report["cwd"] == first["cwd"]
    assert report_mark["pod"] != first["pod"]

    print(f"\nhostile agent: tokens {report['tokens']}\napi {report['api']}\n"
          f"other {report['other_listing']} {report['other_hits']}")
    # (a) No ServiceAccount token anywhere.
    tokens = report["tokens"]
    assert tokens["/var/run/secrets/kubernetes.io/serviceaccount/token"] == "FileNotFoundError"
    assert tokens["/run/secrets/kubernetes.io/serviceaccount/token"] == "FileNotFoundError"
    assert not [p for p, v in tokens.items() if v.startswith("read:")], tokens
    # (b) The API answers it as nobody: 401/403, or it cannot be reached at all.
    api = report["api"]
    assert len(api) >= 4, api
    for url, outcome in api.items():
        assert outcome.startswith(("status 401", "status 403", "error")), (url, outcome)
    assert not any('"kind": "Secret"' in o or "SecretList" in o for o in api.values())
    # (c) Another namespace's workspace is neither there nor found.
    assert report["other_listing"] == "FileNotFoundError"
    assert report["other_hits"] == []
    assert str(other_path) not in report["mounts"]
    # (d) The tracker token is nowhere the agent can look.
    token = rig.linear.api_key
    seen = json.dumps(report)
    assert token not in seen
    assert report["spec"], "the spec Secret is mounted and readable"
    assert not [k for k in report["env"] if "LINEAR" in k.upper()]

    # The issue is Done: its claim goes.
    wait_until(lambda: claims(rig) == [] or None, timeout=180, message="the Done issue's claim")

    # The Workflow's deletion takes a running issue's Pod, claim and spec Secret along.
    script["env"]["HOSTILE"] = "import time, sys; sys.stdin.read(); time.sleep(600)"
    cluster.apply(body, namespace=rig.namespace)
    rig.linear.add_issue(title="still running")
    wait_until(
        lambda: (claims(rig) and [p for p in run_pods(rig)
                                  if p["status"].get("phase") == "Running"]) or None,
        timeout=240, interval=1.0, message="a running Pod with its claim",
    )
    cluster.kubectl("delete", "workflow", WORKFLOW, "-n", rig.namespace, "--wait=true",
                    "--timeout=180s")
    wait_until(lambda: run_pods(rig) == [] or None, timeout=120, message="run Pods deleted")
    wait_until(lambda: claims(rig) == [] or None, timeout=120, message="claims deleted")
    secrets = cluster.kubectl_json(
        "get", "secrets", "-n", rig.namespace, "-l", f"lorenz.dev/workflow={WORKFLOW}"
    )
    assert secrets["items"] == []
    cluster.delete_namespace(other, wait=False)
