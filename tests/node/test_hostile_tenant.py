"""A hostile tenant on the real node (#37 point 5): every attempt of the two-team journey, and
the test fails if any succeeds.

Team-b is the chart's operator's namespace (``pod_install``: helm install, ``restricted`` Pod
Security, runs in Pods of their own); team-a is another namespace with its own tracker Secret,
a Workflow, and a Pod that listens on a port (another team's run, to the network). Team-b's
agent is hostile: from its run Pod it tries to

* read a ServiceAccount token (none is mounted);
* use the Kubernetes API anonymously: list namespaces, read team-a's Secret, Workflows and
  Claims, its own namespace's Secrets (401/403, or not reached at all);
* call the operator's API without a token (401) and learn from ``/healthz`` (only ``ok``);
* connect to team-a's Pod;
* write outside its workspace (read-only root filesystem, the spec Secret's read-only mount);
* find its tracker token anywhere it can look.

At admission, team-b tries to hand its run Pod the tracker Secret (``envFromSecrets``, a
``secret`` volume: refused by the CRD) and to run its agent inside the operator
(``worker.kind: local``: ``Degraded`` ``local_runs_forbidden``, no run).

The network attempts depend on the node: where it enforces NetworkPolicy
(:func:`~tests.node.conftest.node_enforces_network_policy`: the enforcer beside its kubelet
runs), the operator and team-a are not reached and the Workflow's ``NetworkPolicyEnforced`` is
``True``; where it does not, they are reached — the operator still answers 401 and
``/healthz`` only ``ok`` — and the operator's probe must say so: ``NetworkPolicyEnforced=False``
with a ``NetworkPolicyNotEnforced`` Warning. The probe is checked both ways: with the enforcer
running, then stopped and the operator restarted (a new leader probes again).
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.cluster import wait_until
from tests.cluster.node import Node
from tests.node.conftest import node_enforces_network_policy
from tests.node.pods import RESTRICTED_LABELS, pod, wait_for_phase
from tests.node.test_helm_operator import WORKFLOW, Install
from tests.node.test_pod_runs import applied, diagnose, events_of, pod_workflow
from tests.node.test_pod_runs import pod_install as pod_install

pytestmark = [pytest.mark.node, pytest.mark.cluster, pytest.mark.timeout(1800)]

TEAM_A_PORT = 8000

HOSTILE = textwrap.dedent(
    """\
    import json, os, socket, ssl, sys, urllib.error, urllib.request, uuid

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

    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE

    def get(url):
        try:
            with urllib.request.urlopen(url, timeout=4, context=insecure) as answer:
                return f"status {answer.status}: " + answer.read(400).decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return f"status {exc.code}"
        except Exception as exc:
            return f"error {type(exc).__name__}: {exc}"

    def connect(host, port):
        try:
            socket.create_connection((host, port), timeout=4).close()
            return "connected"
        except OSError as exc:
            return f"error {type(exc).__name__}: {exc}"

    report = {}
    tokens = {}
    for path in ["/var/run/secrets/kubernetes.io/serviceaccount/token",
                 "/run/secrets/kubernetes.io/serviceaccount/token"]:
        try:
            tokens[path] = "read:" + open(path).read(64)
        except OSError as exc:
            tokens[path] = type(exc).__name__
    report["tokens"] = tokens

    api = "https://{}:{}".format(env.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc"),
                                 env.get("KUBERNETES_SERVICE_PORT", "443"))
    team_a, team_b = env["AGENT_TEAM_A"], env["AGENT_NAMESPACE"]
    report["api"] = {url: get(api + url) for url in [
        "/api/v1/namespaces",
        f"/api/v1/namespaces/{team_a}/secrets/linear-a",
        f"/apis/lorenz.dev/v1alpha1/namespaces/{team_a}/workflows",
        f"/apis/lorenz.dev/v1alpha1/namespaces/{team_a}/claims",
        f"/api/v1/namespaces/{team_b}/secrets",
    ]}

    operator = env["AGENT_OPERATOR"]
    report["operator_connect"] = connect(operator, 9090)
    report["operator"] = {path: get(f"http://{operator}:9090{path}")
                          for path in ["/api/v1/workflows", "/metrics", "/healthz"]}
    report["team_a_pod"] = connect(env["AGENT_TEAM_A_POD"], int(env["AGENT_TEAM_A_PORT"]))

    writes = {}
    for path in ["/lorenz-x", "/etc/lorenz-x", "/usr/lorenz-x", "/opt/lorenz-x",
                 "/var/run/lorenz/spec/lorenz-x", os.path.join(os.getcwd(), "mine")]:
        try:
            with open(path, "w") as out:
                out.write("x")
            writes[path] = "wrote"
        except OSError as exc:
            writes[path] = type(exc).__name__
    report["writes"] = writes
    report["cwd"] = os.getcwd()

    report["env"] = env
    seen = {}
    for root in ["/var/run/lorenz/spec", os.path.expanduser("~"), "/tmp"]:
        for folder, dirs, files in os.walk(root):
            for name in files:
                try:
                    seen[os.path.join(folder, name)] = open(os.path.join(folder, name)).read(4000)
                except Exception as exc:
                    seen[os.path.join(folder, name)] = type(exc).__name__
    report["files"] = seen
    post("report", report=report)
    post("done")
    post("end")
    """
)


def team_a(rig: Install) -> Iterator[tuple[str, str]]:
    """Team-a's namespace (its tracker Secret, a Workflow) and the IP of a Pod of it that
    listens on :data:`TEAM_A_PORT`."""
    cluster = rig.cluster
    namespace = cluster.create_namespace(labels=RESTRICTED_LABELS)
    cluster.kubectl("create", "secret", "generic", "linear-a", "-n", namespace,
                    "--from-literal=token=team-a-secret-token")
    body = pod_workflow(rig, seconds=1.0)
    body["spec"]["tracker"]["apiKeySecretRef"] = {"name": "linear-a", "key": "token"}
    # NB: an object to read, not to run: no operator serves team-a's namespace here.
    cluster.apply(body, namespace=namespace)
    listener = pod("team-a-run", image=rig.image, ports=(TEAM_A_PORT,),
                   command=["python3", "-m", "http.server", str(TEAM_A_PORT), "-d", "/tmp"])
    listener["spec"]["volumes"] = [{"name": "tmp", "emptyDir": {}}]
    listener["spec"]["containers"][0]["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
    cluster.apply(listener, namespace=namespace)
    running = wait_for_phase(cluster, namespace=namespace, name="team-a-run", phases=("Running",))
    yield namespace, str(running["status"]["podIP"])
    cluster.delete_namespace(namespace, wait=False)


@pytest.fixture(scope="module")
def other_team(pod_install: Install) -> Iterator[tuple[str, str]]:
    yield from team_a(pod_install)


def operator_ip(rig: Install) -> str:
    (operator,) = [p for p in rig.pods() if not p["metadata"].get("deletionTimestamp")]
    return str(operator["status"]["podIP"])


def hostile_workflow(rig: Install, *, team_a: str, team_a_pod: str) -> dict[str, Any]:
    body = pod_workflow(rig, seconds=1.0)
    script = body["spec"]["agents"]["script"]
    script["command"] = 'python3 -c "$HOSTILE"'
    # NB: on an enforcing node each refused attempt is a SYN dropped until its timeout: the
    # agent is silent for ~40 s, longer than a loaded machine's share of the default stall.
    script["stallTimeoutMs"] = 600_000
    script["env"].update({
        "HOSTILE": HOSTILE,
        "AGENT_NAMESPACE": rig.namespace,
        "AGENT_TEAM_A": team_a,
        "AGENT_TEAM_A_POD": team_a_pod,
        "AGENT_TEAM_A_PORT": str(TEAM_A_PORT),
        "AGENT_OPERATOR": operator_ip(rig),
    })
    return body


def network_policy_condition(rig: Install, name: str = WORKFLOW) -> dict[str, Any] | None:
    found = rig.cluster.kubectl_json("get", "workflow", name, "-n", rig.namespace)
    for entry in (found.get("status") or {}).get("conditions") or ():
        if entry["type"] == "NetworkPolicyEnforced":
            return dict(entry)
    return None


def not_enforced(rig: Install) -> dict[str, Any] | None:
    """The ``NetworkPolicyEnforced`` condition once it says ``False``."""
    found = network_policy_condition(rig)
    return found if found is not None and found["status"] == "False" else None


def answered(rig: Install) -> dict[str, Any] | None:
    """The ``NetworkPolicyEnforced`` condition once the probe answered (not ``Unknown``)."""
    found = network_policy_condition(rig)
    return found if found is not None and found["status"] != "Unknown" else None


def test_the_operator_says_whether_the_node_enforces_network_policy(
    pod_install: Install, other_team: tuple[str, str], kube_node: Node
) -> None:
    """The probe Pod of a Workflow whose runs go to Pods: on the node as it is (enforcing:
    ``NetworkPolicyEnforced=True``), then with its enforcer stopped and the operator restarted
    (``False`` with a ``NetworkPolicyNotEnforced`` Warning)."""
    rig = pod_install
    namespace, pod_ip = other_team
    began = time.monotonic()
    applied(rig, hostile_workflow(rig, team_a=namespace, team_a_pod=pod_ip))
    try:
        found = wait_until(lambda: answered(rig), timeout=180, interval=1.0,
                           message="the probe's answer")
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{network_policy_condition(rig)}\n{diagnose(rig)}") from err
    print(f"\nprobe answer in {time.monotonic() - began:.1f} s: {found}")
    if node_enforces_network_policy(kube_node):
        assert (found["status"], found["reason"]) == ("True", "ConnectionRefused"), found
        assert events_of(rig, "NetworkPolicyNotEnforced") == []
    else:
        assert (found["status"], found["reason"]) == ("False", "network_policy_not_enforced")
        assert "enforcing CNI" in found["message"]
        warnings = wait_until(lambda: events_of(rig, "NetworkPolicyNotEnforced") or None,
                              timeout=60, message="the NetworkPolicyNotEnforced Warning")
        assert "enforcing CNI" in warnings[0]
    # The probe Pod is gone, and it made the Workflow no worse.
    wait_until(
        lambda: rig.cluster.kubectl_json(
            "get", "pods", "-n", rig.namespace, "-l", "lorenz.dev/probe=network-policy"
        )["items"] == [] or None,
        timeout=60, message="the probe Pod deleted",
    )
    workflow = rig.cluster.kubectl_json("get", "workflow", WORKFLOW, "-n", rig.namespace)
    degraded = [c for c in workflow["status"]["conditions"] if c["type"] == "Degraded"]
    assert degraded[0]["status"] == "False", degraded
    if not node_enforces_network_policy(kube_node):
        return  # NB: the other way round needs an enforcing node to stop

    # The same cluster without enforcement: a new leader probes again and warns.
    kube_node.stop_network_policy_enforcer()
    try:
        before = [p["metadata"]["name"] for p in rig.pods()]
        rig.cluster.kubectl("delete", "pod", "-n", rig.namespace, *before, "--wait=false")
        rig.wait_ready_pods(len(before), exclude=before)
        try:
            found = wait_until(
                lambda: not_enforced(rig), timeout=300, interval=1.0,
                message="the new leader's probe: not enforced",
            )
        except TimeoutError as err:
            raise AssertionError(
                f"{err}\n{network_policy_condition(rig)}\n{diagnose(rig)}"
            ) from err
        assert found["reason"] == "network_policy_not_enforced", found
        assert "enforcing CNI" in found["message"]
        warnings = wait_until(lambda: events_of(rig, "NetworkPolicyNotEnforced") or None,
                              timeout=60, message="the NetworkPolicyNotEnforced Warning")
        assert "enforcing CNI" in warnings[0]
    finally:
        kube_node.start_network_policy_enforcer()


def test_every_attempt_of_a_hostile_tenant_fails(
    pod_install: Install, other_team: tuple[str, str], kube_node: Node
) -> None:
    rig = pod_install
    cluster = rig.cluster
    namespace, pod_ip = other_team
    body = hostile_workflow(rig, team_a=namespace, team_a_pod=pod_ip)
    applied(rig, body)

    # -- Admission: the tracker Secret into the run Pod, by env or by a volume.
    for worker_change in (
        {"envFromSecrets": ["linear"]},
        {"volumes": [{"name": "trk", "mountPath": "/home/lorenz/trk", "secret": "linear"}]},
    ):
        sneaky = json.loads(json.dumps(body))
        sneaky["metadata"]["name"] = "sneaky"
        sneaky["spec"]["worker"]["podTemplate"].update(worker_change)
        refused = cluster.kubectl(
            "apply", "--server-side", "--field-manager=lorenz-tests", "-n", rig.namespace,
            "-f", "-", input=json.dumps(sneaky), check=False,
        )
        assert refused.returncode != 0, worker_change
        assert "tracker" in refused.stderr, refused.stderr

    # -- The hostile run.
    issue = rig.linear.add_issue(title="hostile tenant")
    try:
        wait_until(
            lambda: [m for m in list(rig.recorder.marks)
                     if m["issue"] == issue.id and m["what"] == "report"] or None,
            timeout=300, interval=1.0, message="the hostile agent's report",
        )
        rig.wait_done(issue.id, timeout=120)
    except (TimeoutError, AssertionError) as err:
        raise AssertionError(f"{err}\n{diagnose(rig)}") from err
    (mark,) = [m for m in list(rig.recorder.marks)
               if m["issue"] == issue.id and m["what"] == "report"]
    report = mark["report"]
    print(f"\nhostile tenant: api {report['api']}\noperator {report['operator_connect']} "
          f"{report['operator']}\nteam-a pod {report['team_a_pod']}\nwrites {report['writes']}")

    # No ServiceAccount token.
    assert set(report["tokens"].values()) == {"FileNotFoundError"}, report["tokens"]
    # The API answers it as nobody, or not at all.
    for url, outcome in report["api"].items():
        assert outcome.startswith(("status 401", "status 403", "error")), (url, outcome)
    # Nothing outside the workspace is writable; the workspace is.
    writes = report["writes"]
    mine = writes.pop(f"{report['cwd']}/mine")
    assert mine == "wrote"
    assert "wrote" not in writes.values(), writes
    # The tracker token is nowhere it looked, by name or by value.
    seen = json.dumps(report)
    assert rig.linear.api_key not in seen
    assert "team-a-secret-token" not in seen
    assert not [k for k in report["env"] if "LINEAR" in k.upper()]

    # The network: refused where the node enforces NetworkPolicy; where it does not, the
    # operator's probe says so, and what is reached gives nothing away.
    operator = report["operator"]
    if node_enforces_network_policy(kube_node):
        assert report["operator_connect"].startswith("error"), report["operator_connect"]
        assert report["team_a_pod"].startswith("error"), report["team_a_pod"]
        assert all(o.startswith("error") for o in operator.values()), operator
    else:
        found = network_policy_condition(rig)
        assert found is not None
        assert (found["status"], found["reason"]) == ("False", "network_policy_not_enforced")
        assert report["operator_connect"] == "connected"
        assert report["team_a_pod"] == "connected"
        assert operator["/api/v1/workflows"] == "status 401", operator
        assert operator["/metrics"] == "status 401", operator
        assert operator["/healthz"].startswith("status 200"), operator
        assert json.loads(operator["/healthz"].split(": ", 1)[1]) == {"status": "ok"}

    # -- worker.kind: local (the agent inside the operator, with its token): refused.
    local = json.loads(json.dumps(body))
    local["metadata"]["name"] = "inside"
    local["spec"]["worker"] = {"kind": "local"}
    cluster.apply(local, namespace=rig.namespace)

    def refused_local() -> dict[str, Any] | None:
        found = cluster.kubectl_json("get", "workflow", "inside", "-n", rig.namespace)
        for entry in (found.get("status") or {}).get("conditions") or ():
            if entry["type"] == "Degraded" and entry["status"] == "True":
                return dict(entry)
        return None

    # NB: that no run starts then is tests/kube/test_worker_kinds.py; an issue here would be
    # the hostile Workflow's too (one tracker project).
    degraded = wait_until(refused_local, timeout=120, message="worker.kind local refused")
    assert degraded["reason"] == "local_runs_forbidden"
    assert "--local-runs" in degraded["message"]
    cluster.kubectl("delete", "workflow", "inside", "-n", rig.namespace, "--wait=false")
