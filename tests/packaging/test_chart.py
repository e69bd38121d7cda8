"""The Helm chart offline: lint --strict, what it renders for each option, its values schema,
and that its generated parts (RBAC from lorenz.kube.rbac, CRDs from crds/) are current.

The chart on a real API server is test_chart_install.py.
"""

from __future__ import annotations

import importlib.util
import json
import re
import tarfile
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

import lorenz
from lorenz.kube.rbac import OPERATOR_RULES, RULE_REASONS
from lorenz.kube.settings import ENV_PREFIX, OperatorSettings, load_settings
from tests.packaging.charts import CHART, REPO, by_kind, helm, one, render, template


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_generate", CHART / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generator = _load_generator()


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def _default_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


# --- metadata ---------------------------------------------------------------------------------


def test_chart_versions_follow_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    with (REPO / "pyproject.toml").open("rb") as file:
        version = tomllib.load(file)["project"]["version"]
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "lorenz"
    assert chart["appVersion"] == version == lorenz.__version__
    assert chart["version"] == version


def test_generated_parts_are_current() -> None:
    stale = generator.stale_files()
    assert stale == [], f"stale {stale}: run .venv/bin/python charts/lorenz/generate.py"


def test_generator_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    rbac = generator.RBAC_TEMPLATE
    original = rbac.read_text()
    try:
        rbac.write_text(original.replace('"patch"', '"update"', 1))
        assert generator.stale_files() == ["charts/lorenz/templates/rbac.yaml"]
        assert generator.main(["--check"]) == 1
    finally:
        rbac.write_text(original)
    assert generator.main(["--check"]) == 0


def test_chart_crds_are_copies_of_the_repository_crds() -> None:
    sources = sorted(path.name for path in (REPO / "crds").glob("*.yaml"))
    copies = sorted(path.name for path in (CHART / "crds").glob("*.yaml"))
    assert copies == sources
    for name in sources:
        assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes()


def test_packaged_chart_has_the_crds_and_not_the_generator(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("lorenz-*.tgz")
    assert archive.name == f"lorenz-{lorenz.__version__}.tgz"
    with tarfile.open(archive) as bundle:
        names = set(bundle.getnames())
    assert "lorenz/generate.py" not in names
    assert not [name for name in names if "__pycache__" in name]
    for path in (REPO / "crds").glob("*.yaml"):
        assert f"lorenz/crds/{path.name}" in names
    assert {"lorenz/values.schema.json", "lorenz/templates/NOTES.txt"} <= names


# --- lint -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        None,
        {"watchNamespace": "team-a"},
        {"workspaces": {"persistence": {"enabled": True, "storageClass": "fast"}}},
        {"metrics": {"serviceMonitor": {"enabled": True}}, "replicaCount": 3},
        {"serviceAccount": {"create": False, "name": "mine"}, "rbac": {"create": False}},
        {"runPods": {"networkPolicy": {"enabled": True, "egress": [{"ports": [{"port": 443}]}]}}},
    ],
    ids=["defaults", "namespaced", "persistence", "service-monitor", "own-account",
         "run-pod-policy"],
)
def test_lint_strict_is_clean(values: dict[str, Any] | None, tmp_path: Path) -> None:
    args = ["lint", "--strict", str(CHART)]
    if values:
        path = tmp_path / "values.json"
        path.write_text(json.dumps(values))
        args += ["--values", str(path)]
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout
    assert "[ERROR]" not in result.stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


# --- schema -----------------------------------------------------------------------------------


def test_schema_is_valid_draft7_and_accepts_the_defaults() -> None:
    schema = _schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(_default_values())


def _closed_paths(schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Object schemas (by dotted path) that declare properties."""
    found = []
    if "properties" in schema:
        found.append(prefix)
        for key, sub in schema["properties"].items():
            found += _closed_paths(sub, f"{prefix}.{key}" if prefix else key)
    return found


def test_schema_closes_every_object_the_chart_owns() -> None:
    for path in _closed_paths(_schema()):
        node = _schema()
        for key in [k for k in path.split(".") if k]:
            node = node["properties"][key]
        assert node.get("additionalProperties") is False, path or "<root>"


def test_every_value_has_a_schema_entry_with_a_description() -> None:
    def walk(values: dict[str, Any], schema: dict[str, Any], prefix: str) -> None:
        for key, value in values.items():
            path = f"{prefix}{key}"
            assert key in schema.get("properties", {}), f"{path} missing from the schema"
            sub = schema["properties"][key]
            assert sub.get("description"), f"{path} has no description"
            if isinstance(value, dict) and "properties" in sub:
                walk(value, sub, f"{path}.")

    walk(_default_values(), _schema(), "")


def test_every_values_key_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    key_line = re.compile(r"^\s*[A-Za-z][A-Za-z0-9]*:")
    for number, line in enumerate(lines):
        if key_line.match(line):
            above = lines[number - 1].strip() if number else ""
            assert above.startswith("#"), f"values.yaml line {number + 1} has no comment: {line}"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("replicaCount=x", "at '/replicaCount': got string, want integer"),
        ("replicaCount=-1", "/replicaCount"),
        ("image.tags=1.0", "additional properties 'tags' not allowed"),
        ("typo=1", "additional properties 'typo' not allowed"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("watchNamespace=Not_A_Namespace", "/watchNamespace"),
        ("service.port=70000", "/service/port"),
        ("workspaces.persistence.size=lots", "/workspaces/persistence/size"),
        ("workspaces.persistence.accessModes[0]=ReadWriteSometimes", "accessModes/0"),
        ("probes.liveness.enabled=maybe", "/probes/liveness/enabled"),
        ("operator.logLevel=loud", "/operator/logLevel"),
        ("image.digest=latest", "/image/digest"),
    ],
)
def test_schema_rejects_bad_values(flag: str, message: str, tmp_path: Path) -> None:
    result = template(tmp=tmp_path, extra=["--set", flag], check=False)
    assert result.returncode != 0
    assert "don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr


def test_lint_fails_on_a_bad_value() -> None:
    result = helm("lint", "--strict", str(CHART), "--set", "replicaCount=x", check=False)
    assert result.returncode != 0
    assert "replicaCount" in result.stdout + result.stderr


# --- rendering --------------------------------------------------------------------------------


@pytest.fixture
def defaults(tmp_path: Path) -> list[dict[str, Any]]:
    return render(tmp=tmp_path)


def test_defaults_render_the_expected_objects(defaults: list[dict[str, Any]]) -> None:
    kinds = sorted(obj["kind"] for obj in defaults)
    assert kinds == [
        "ClusterRole",
        "ClusterRole",  # the API authentication's reviews
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "Deployment",
        "Job",  # the pre-delete teardown hook
        "NetworkPolicy",  # the operator's, on by default (#37)
        "Role",  # the Leases, in the release namespace only
        "Role",  # the teardown hook's (pre-delete)
        "RoleBinding",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    for obj in defaults:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "lorenz"
        assert labels["app.kubernetes.io/instance"] == "lorenz"
        assert labels["app.kubernetes.io/version"] == lorenz.__version__
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == f"lorenz-{lorenz.__version__}"
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "lorenz-system"


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_deployment_is_locked_down(defaults: list[dict[str, Any]]) -> None:
    pod = one(defaults, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = _container(defaults)["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 10001
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_deployment_image_probes_resources(defaults: list[dict[str, Any]]) -> None:
    deployment = one(defaults, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "lorenz"
    assert pod["shareProcessNamespace"] is True  # the pause process reaps orphans
    container = _container(defaults)
    assert container["image"] == f"lorenz:{lorenz.__version__}"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"probes": 8080, "http": 9090}
    assert container["args"] == ["operator"]
    assert set(container["resources"]) == {"requests", "limits"}


def _operator_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The LORENZ_OPERATOR_* variables of the operator container."""
    return {
        item["name"]: item["value"]
        for item in _container(objects)["env"]
        if item["name"].startswith(ENV_PREFIX)
    }


def test_operator_settings_come_from_the_environment(defaults: list[dict[str, Any]]) -> None:
    env = _operator_env(defaults)
    assert env == {
        "LORENZ_OPERATOR_NAMESPACES": "",
        "LORENZ_OPERATOR_WORKSPACE_ROOT": "/var/lib/lorenz/workspaces",
        "LORENZ_OPERATOR_LIVENESS_ENDPOINT": "http://0.0.0.0:8080/healthz",
        "LORENZ_OPERATOR_API_HOST": "0.0.0.0",
        "LORENZ_OPERATOR_API_PORT": "9090",
        "LORENZ_OPERATOR_ADVERTISE_URL": "http://$(POD_IP):9090",
        "LORENZ_OPERATOR_LOG_LEVEL": "info",
        "LORENZ_OPERATOR_LEASE_DURATION_SECONDS": "15",
        "LORENZ_OPERATOR_RENEW_DEADLINE_SECONDS": "10",
        "LORENZ_OPERATOR_RETRY_PERIOD_SECONDS": "3",
        "LORENZ_OPERATOR_SHARDS": "16",
        "LORENZ_OPERATOR_LEASE_NAMESPACE": "lorenz-system",
        "LORENZ_OPERATOR_LEASE_NAME_PREFIX": "lorenz",
        "LORENZ_OPERATOR_DRAIN_TIMEOUT_SECONDS": "30",
        "LORENZ_OPERATOR_API_AUTH": "kubernetes",
        "LORENZ_OPERATOR_API_OPEN_PATHS": "/healthz",
        # worker.kind: local (agents in the operator's Pod, with its token) is off (#37).
        "LORENZ_OPERATOR_LOCAL_RUNS": "false",
        "LORENZ_OPERATOR_LOCAL_RUNS_NAMESPACES": "",
        # The probe that tells whether NetworkPolicy is enforced where runs go (#37) is on.
        "LORENZ_OPERATOR_NETWORK_POLICY_PROBE": "true",
        "LORENZ_OPERATOR_NETWORK_POLICY_PROBE_INTERVAL_SECONDS": "3600",
        # Runs in Pods (worker.kind: pod) without an image of their own use the operator's.
        "LORENZ_OPERATOR_WORKER_IMAGE": "lorenz:0.1.0",
    }
    # The variables are what the operator itself would load (no unknown name, valid values).
    settings = load_settings(
        environ=env | {"LORENZ_OPERATOR_ADVERTISE_URL": "http://10.0.0.7:9090"}
    )
    assert settings.namespaces == ()
    assert settings.workspace_root == "/var/lib/lorenz/workspaces"
    assert settings.api_port == 9090
    assert settings.liveness_endpoint == "http://0.0.0.0:8080/healthz"
    assert settings.worker_image == "lorenz:0.1.0"
    assert settings.local_runs is False
    assert not settings.allows_local_runs("lorenz-system")
    for name in env:
        assert name.removeprefix(ENV_PREFIX).lower() in OperatorSettings.model_fields, name


def test_chart_defaults_are_the_operator_defaults() -> None:
    values = _default_values()["operator"]
    fields = OperatorSettings.model_fields
    assert values["lease"]["durationSeconds"] == fields["lease_duration_seconds"].default
    assert values["lease"]["renewDeadlineSeconds"] == fields["renew_deadline_seconds"].default
    assert values["lease"]["retryPeriodSeconds"] == fields["retry_period_seconds"].default
    assert values["drainTimeoutSeconds"] == fields["drain_timeout_seconds"].default
    assert values["logLevel"] == fields["log_level"].default
    assert _default_values()["service"]["port"] == fields["api_port"].default
    assert fields["liveness_endpoint"].default == "http://0.0.0.0:8080/healthz"
    assert _default_values()["probes"]["port"] == 8080


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"operator": {"lease": {"renewDeadlineSeconds": 15}}},
            "operator.lease: lease duration must be longer than the renew deadline",
        ),
        (
            {"operator": {"lease": {"retryPeriodSeconds": 10}}},
            "operator.lease: renew deadline must be longer than 1.2 x the retry period",
        ),
        ({"terminationGracePeriodSeconds": 30}, "must exceed operator.drainTimeoutSeconds"),
    ],
)
def test_inconsistent_timings_are_refused(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    result = template(tmp=tmp_path, values=values, check=False)
    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize(
    ("duration", "deadline", "period"),
    [(15, 10, 2), (15, 10, 9), (10, 10, 2), (3, 2, 0.5), (3, 2, 1.8), (2, 1.5, 1), (1, 0.5, 0.4)],
)
def test_the_chart_accepts_exactly_the_lease_timings_the_operator_accepts(
    duration: int, deadline: float, period: float, tmp_path: Path
) -> None:
    from lorenz.kube.errors import InvalidOperatorSettings
    from lorenz.kube.leaderelection.leases import LeaseTiming

    try:
        LeaseTiming(lease_duration_s=duration, renew_deadline_s=deadline, retry_period_s=period)
        operator_accepts = True
    except InvalidOperatorSettings:
        operator_accepts = False
    lease = {"durationSeconds": duration, "renewDeadlineSeconds": deadline,
             "retryPeriodSeconds": period}
    result = template(tmp=tmp_path, values={"operator": {"lease": lease}}, check=False)
    assert (result.returncode == 0) == operator_accepts, result.stderr


def test_notes_name_only_paths_that_exist_and_the_real_secret_field(tmp_path: Path) -> None:
    result = helm(
        "install", "demo", str(CHART), "--dry-run=client", "--namespace", "ops", check=False
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    named = [p.rstrip(".,;:") for p in re.findall(r"\b((?:deploy|docs|crds)/[\w./-]*)", notes)]
    assert named, notes
    for path in named:
        base = CHART if f"<chart>/{path}" in notes and path.startswith("crds") else REPO
        assert (base / path).exists(), path
    assert "apiKeySecretRef" in notes
    assert "secretKeyRef" not in notes.replace("apiKeySecretRef", "")


def test_local_runs_are_off_unless_turned_on_for_listed_namespaces(tmp_path: Path) -> None:
    assert _default_values()["operator"]["localRuns"] == {"enabled": False, "namespaces": []}
    assert OperatorSettings.model_fields["local_runs"].default is False
    objects = render(tmp=tmp_path, values={
        "operator": {"localRuns": {"enabled": True, "namespaces": ["team-a", "team-b"]}}
    })
    env = _operator_env(objects)
    assert env["LORENZ_OPERATOR_LOCAL_RUNS"] == "true"
    assert env["LORENZ_OPERATOR_LOCAL_RUNS_NAMESPACES"] == "team-a,team-b"
    settings = load_settings(environ={
        "LORENZ_OPERATOR_LOCAL_RUNS": env["LORENZ_OPERATOR_LOCAL_RUNS"],
        "LORENZ_OPERATOR_LOCAL_RUNS_NAMESPACES": env["LORENZ_OPERATOR_LOCAL_RUNS_NAMESPACES"],
    })
    assert settings.allows_local_runs("team-b")
    assert not settings.allows_local_runs("team-c")
    everywhere = load_settings(environ={"LORENZ_OPERATOR_LOCAL_RUNS": "true"})
    assert everywhere.allows_local_runs("team-c")
    bad = template(tmp=tmp_path, values={"operator": {"localRuns": {"namespaces": ["Team/A"]}}},
                   check=False)
    assert bad.returncode != 0


def test_the_network_policy_probe_is_on_unless_turned_off(tmp_path: Path) -> None:
    assert _default_values()["operator"]["networkPolicyProbe"] == {
        "enabled": True, "intervalSeconds": 3600,
    }
    assert OperatorSettings.model_fields["network_policy_probe"].default is True
    objects = render(tmp=tmp_path, values={
        "operator": {"networkPolicyProbe": {"enabled": False, "intervalSeconds": 600}}
    })
    env = _operator_env(objects)
    settings = load_settings(environ={
        key: env[key] for key in ("LORENZ_OPERATOR_NETWORK_POLICY_PROBE",
                                  "LORENZ_OPERATOR_NETWORK_POLICY_PROBE_INTERVAL_SECONDS")
    })
    assert settings.network_policy_probe is False
    assert settings.network_policy_probe_interval_seconds == 600
    bad = template(tmp=tmp_path, check=False,
                   values={"operator": {"networkPolicyProbe": {"intervalSeconds": 0}}})
    assert bad.returncode != 0


def test_notes_show_how_to_scrape_metrics_with_a_token(tmp_path: Path) -> None:
    def notes(*flags: str) -> str:
        result = helm("install", "demo", str(CHART), "--dry-run=client", "--namespace", "ops",
                      *flags, check=False)
        assert result.returncode == 0, result.stderr
        return result.stdout.split("NOTES:", 1)[1]

    secured = notes()
    assert 'curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:9090/metrics' in secured
    assert "kubectl -n ops create token metrics-reader" in secured
    assert "--non-resource-url=/metrics" in secured
    assert "curl http://127.0.0.1:9090/metrics" not in secured
    for flags in (("--set", "operator.apiAuth=none"),
                  ("--set", "operator.apiOpenPaths={/healthz,/metrics}")):
        open_notes = notes(*flags)
        assert "curl http://127.0.0.1:9090/metrics" in open_notes
        assert "Bearer" not in open_notes


def test_advertise_url_can_be_set(tmp_path: Path) -> None:
    objects = render(tmp=tmp_path, values={"operator": {"advertiseUrl": "http://[fd00::7]:9090"}})
    assert _operator_env(objects)["LORENZ_OPERATOR_ADVERTISE_URL"] == "http://[fd00::7]:9090"


def test_writable_paths_are_volumes(defaults: list[dict[str, Any]]) -> None:
    pod = one(defaults, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in _container(defaults)["volumeMounts"]}
    assert mounts == {
        "tmp": "/tmp",
        "home": "/home/lorenz",
        "workspaces": "/var/lib/lorenz/workspaces",
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "1Gi"}
    assert volumes["workspaces"]["emptyDir"] == {}


def test_image_digest_and_tag(tmp_path: Path) -> None:
    digest = "sha256:" + "0" * 64
    pinned = render(tmp=tmp_path, values={"image": {"repository": "reg/lorenz", "digest": digest}})
    assert _container(pinned)["image"] == f"reg/lorenz@{digest}"
    tagged = render(tmp=tmp_path, values={"image": {"tag": "dev"}})
    assert _container(tagged)["image"] == "lorenz:dev"


def _rules_of(role: dict[str, Any]) -> list[dict[str, Any]]:
    return list(role["rules"])


def _operator_objects(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one object of ``kind`` that is not the API authentication's."""
    (found,) = [o for o in by_kind(objects, kind) if not o["metadata"]["name"].endswith(
        "-api-auth")]
    return found


def test_cluster_wide_rbac_is_exactly_the_operator_rules(defaults: list[dict[str, Any]]) -> None:
    role = _operator_objects(defaults, "ClusterRole")
    assert _rules_of(role) == [dict(rule) for rule in OPERATOR_RULES]
    binding = _operator_objects(defaults, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "lorenz", "namespace": "lorenz-system"}
    ]
    # Cluster-scoped names carry the release namespace: two releases do not collide.
    assert role["metadata"]["name"] == "lorenz-lorenz-system"
    assert _operator_env(defaults)["LORENZ_OPERATOR_NAMESPACES"] == ""


def test_every_rule_is_commented_with_its_reason() -> None:
    text = generator.RBAC_TEMPLATE.read_text()
    for (group, resource), reason in RULE_REASONS.items():
        assert f"# {group or 'core'}/{resource}: {reason.split()[0]}" in text


def test_api_authentication_gets_only_the_two_reviews_cluster_wide(tmp_path: Path) -> None:
    from lorenz.kube.rbac import API_AUTH_RULES

    for values in ({}, {"watchNamespace": "team-a"}):
        objects = render(tmp=tmp_path, values=values)
        (role,) = [o for o in by_kind(objects, "ClusterRole")
                   if o["metadata"]["name"].endswith("-api-auth")]
        assert _rules_of(role) == [dict(rule) for rule in API_AUTH_RULES]
        (binding,) = [o for o in by_kind(objects, "ClusterRoleBinding")
                      if o["metadata"]["name"].endswith("-api-auth")]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
    unauthenticated = render(tmp=tmp_path, values={"operator": {"apiAuth": "none"}})
    assert len(by_kind(unauthenticated, "ClusterRole")) == 1


def test_a_network_policy_admits_only_the_api_and_probe_ports(tmp_path: Path) -> None:
    objects = render(tmp=tmp_path, values={"networkPolicy": {"enabled": True}})
    policy = one(objects, "NetworkPolicy")
    api, probes = policy["spec"]["ingress"]
    assert api["ports"] == [{"port": "http", "protocol": "TCP"}]
    # The release namespace's pods, but never a run Pod (#37).
    assert api["from"] == [{"podSelector": {"matchExpressions": [
        {"key": "lorenz.dev/handle", "operator": "DoesNotExist"}]}}]
    assert probes["ports"] == [{"port": "probes", "protocol": "TCP"}]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "lorenz"
    # On by default (#37); off on request.
    assert one(render(tmp=tmp_path), "NetworkPolicy") == policy
    assert not by_kind(render(tmp=tmp_path, values={"networkPolicy": {"enabled": False}}),
                       "NetworkPolicy")


def test_run_pods_get_a_network_policy_on_request(tmp_path: Path) -> None:
    from lorenz.kube.pods.manifests import LABEL_HANDLE, LABEL_MANAGED, pod_manifest
    from tests.kube.test_pods import WORKFLOW, pod_worker, run_spec

    assert not [
        o for o in by_kind(render(tmp=tmp_path), "NetworkPolicy")
        if o["metadata"]["name"].endswith("-run-pods")
    ]
    egress = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}],
              "ports": [{"port": 443, "protocol": "TCP"}]}
    objects = render(
        tmp=tmp_path,
        values={
            "watchNamespace": "team-a",
            "runPods": {"networkPolicy": {"enabled": True, "egress": [egress]}},
        },
    )
    (policy,) = [o for o in by_kind(objects, "NetworkPolicy")
                 if o["metadata"]["name"].endswith("-run-pods")]
    assert policy["metadata"]["namespace"] == "team-a"
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == []
    dns, extra = spec["egress"]
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    assert extra == egress
    # It selects what a run Pod carries, and not the operator's own Pods.
    selector = spec["podSelector"]
    pod = pod_manifest(spec=run_spec(), workflow=WORKFLOW, worker=pod_worker(), image="a:1")
    labels = pod["metadata"]["labels"]
    for key, value in selector["matchLabels"].items():
        assert labels[key] == value
    assert selector["matchLabels"] == {LABEL_MANAGED: "lorenz"}
    assert selector["matchExpressions"] == [{"key": LABEL_HANDLE, "operator": "Exists"}]
    (deployment,) = by_kind(objects, "Deployment")
    operator_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert LABEL_HANDLE not in operator_labels
    # Several namespaces, no DNS.
    many = render(
        tmp=tmp_path,
        values={"runPods": {"networkPolicy": {
            "enabled": True, "namespaces": ["a", "b"], "allowDNS": False,
        }}},
    )
    policies = [o for o in by_kind(many, "NetworkPolicy")
                if o["metadata"]["name"].endswith("-run-pods")]
    assert sorted(o["metadata"]["namespace"] for o in policies) == ["a", "b"]
    assert all(o["spec"]["egress"] == [] for o in policies)


def test_namespaced_rbac_is_a_role_in_the_watched_namespace(tmp_path: Path) -> None:
    objects = render(tmp=tmp_path, values={"watchNamespace": "team-a"})
    # Only the API authentication's reviews are cluster-scoped (they read nothing).
    assert [o["metadata"]["name"] for o in by_kind(objects, "ClusterRole")] == [
        "lorenz-lorenz-system-api-auth"
    ]
    (role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["namespace"] == "team-a"]
    assert _rules_of(role) == [dict(rule) for rule in OPERATOR_RULES]
    (binding,) = [b for b in by_kind(objects, "RoleBinding")
                  if b["metadata"]["namespace"] == "team-a"]
    assert binding["metadata"]["namespace"] == "team-a"
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"][0]["namespace"] == "lorenz-system"
    assert _operator_env(objects)["LORENZ_OPERATOR_NAMESPACES"] == "team-a"


def test_rbac_and_service_account_can_be_brought_by_the_user(tmp_path: Path) -> None:
    objects = render(
        tmp=tmp_path,
        values={"serviceAccount": {"create": False, "name": "mine"}, "rbac": {"create": False}},
    )
    kinds = {obj["kind"] for obj in objects}
    assert kinds == {"Deployment", "Service", "NetworkPolicy"}  # the policy: on by default
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "mine"


def test_own_service_account_needs_a_name(tmp_path: Path) -> None:
    result = template(tmp=tmp_path, extra=["--set", "serviceAccount.create=false"], check=False)
    assert result.returncode != 0
    assert "serviceAccount.name is required" in result.stderr


def test_workspace_claim_is_created_and_mounted(tmp_path: Path) -> None:
    objects = render(
        tmp=tmp_path,
        values={
            "workspaces": {"persistence": {"enabled": True, "size": "50Gi", "storageClass": "fast"}}
        },
    )
    claim = one(objects, "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "lorenz-workspaces"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "fast",
        "resources": {"requests": {"storage": "50Gi"}},
    }
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["workspaces"] == {
        "name": "workspaces",
        "persistentVolumeClaim": {"claimName": "lorenz-workspaces"},
    }


def test_workspace_claim_storage_class_default_and_none(tmp_path: Path) -> None:
    default = render(tmp=tmp_path, values={"workspaces": {"persistence": {"enabled": True}}})
    assert "storageClassName" not in one(default, "PersistentVolumeClaim")["spec"]
    none = render(
        tmp=tmp_path, values={"workspaces": {"persistence": {"enabled": True, "storageClass": "-"}}}
    )
    assert one(none, "PersistentVolumeClaim")["spec"]["storageClassName"] == ""


def test_existing_workspace_claim_is_mounted_not_created(tmp_path: Path) -> None:
    objects = render(
        tmp=tmp_path,
        values={"workspaces": {"persistence": {"enabled": True, "existingClaim": "shared-ws"}}},
    )
    assert not by_kind(objects, "PersistentVolumeClaim")
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["workspaces"]["persistentVolumeClaim"] == {"claimName": "shared-ws"}


def test_read_write_once_claim_is_refused_for_several_replicas(tmp_path: Path) -> None:
    values = {"replicaCount": 2, "workspaces": {"persistence": {"enabled": True}}}
    result = template(tmp=tmp_path, values=values, check=False)
    assert result.returncode != 0
    assert "needs accessModes [ReadWriteMany]" in result.stderr
    shared = {
        "replicaCount": 2,
        "workspaces": {"persistence": {"enabled": True, "accessModes": ["ReadWriteMany"]}},
    }
    assert one(render(tmp=tmp_path, values=shared), "Deployment")["spec"]["replicas"] == 2


def test_service_targets_the_pods(defaults: list[dict[str, Any]]) -> None:
    service = one(defaults, "Service")
    selector = one(defaults, "Deployment")["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 9090, "targetPort": "http", "protocol": "TCP"}
    ]


def test_service_monitor_is_optional(tmp_path: Path, defaults: list[dict[str, Any]]) -> None:
    assert not by_kind(defaults, "ServiceMonitor")
    objects = render(
        tmp=tmp_path,
        values={"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    )
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == one(objects, "Service")["spec"]["selector"]
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]


def test_service_monitor_needs_the_service(tmp_path: Path) -> None:
    values = {"service": {"enabled": False}, "metrics": {"serviceMonitor": {"enabled": True}}}
    result = template(tmp=tmp_path, values=values, check=False)
    assert result.returncode != 0
    assert "needs service.enabled" in result.stderr


def test_names_are_truncated_to_63_characters(tmp_path: Path) -> None:
    release, namespace = "r" * 53, "n" * 63  # helm's and Kubernetes' longest
    values = {"workspaces": {"persistence": {"enabled": True}}}
    for extra_values in ({}, {"watchNamespace": "w" * 63}):
        objects = render(
            tmp=tmp_path, release=release, namespace=namespace, values=values | extra_values
        )
        for obj in objects:
            name = obj["metadata"]["name"]
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                # Cluster-scoped RBAC names are DNS subdomains (253) and carry the namespace.
                assert len(name) <= 253
                assert name.endswith(("-" + namespace, f"-{namespace}-api-auth"))
            else:
                assert len(name) <= 63, name
        claim = one(objects, "PersistentVolumeClaim")
        assert claim["metadata"]["name"].endswith("-workspaces")


def test_extra_env_and_args_reach_the_container(tmp_path: Path) -> None:
    objects = render(
        tmp=tmp_path,
        values={
            "operator": {
                "extraArgs": ["--events-per-minute", "5"],
                "env": [{"name": "LORENZ_OPERATOR_STATUS_INTERVAL_SECONDS", "value": "2"}],
            }
        },
    )
    container = _container(objects)
    assert container["args"] == ["operator", "--events-per-minute", "5"]
    env = {item["name"]: item for item in container["env"]}
    assert env["LORENZ_OPERATOR_STATUS_INTERVAL_SECONDS"]["value"] == "2"
    assert env["POD_NAME"]["valueFrom"] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}
    }


def test_notes_name_the_release_and_the_crd_upgrade_step(tmp_path: Path) -> None:
    result = helm(
        "install", "demo", str(CHART), "--dry-run=client", "--namespace", "ops", check=False
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert 'release "demo" in namespace "ops"' in notes
    assert "kubectl apply --server-side -f <chart>/crds/" in notes


def _hooks(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]


def test_uninstall_runs_the_teardown_first_with_the_rights_it_needs(
    defaults: list[dict[str, Any]], tmp_path: Path
) -> None:
    hooks = _hooks(defaults)
    assert sorted(o["kind"] for o in hooks) == ["Job", "Role", "RoleBinding"]
    for hook in hooks:
        annotations = hook["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    weights = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in hooks}
    assert weights["Role"] < weights["Job"]
    assert weights["RoleBinding"] < weights["Job"]
    job = one(hooks, "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "lorenz"
    (container,) = pod["containers"]
    assert container["args"] == ["teardown", "--deployment", "lorenz", "--timeout", "90"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["LORENZ_OPERATOR_LEASE_NAMESPACE"] == "lorenz-system"
    assert env["LORENZ_OPERATOR_LEASE_NAME_PREFIX"] == "lorenz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # NB: the teardown waits for the Deployment's Pods: its own must not be one of them.
    selector = one(defaults, "Deployment")["spec"]["selector"]["matchLabels"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in selector.items())
    role = one([o for o in hooks if o["kind"] == "Role"], "Role")
    rules = {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in role["rules"]}
    assert rules == {
        ("apps", "deployments"): ["get"],
        ("apps", "deployments/scale"): ["get", "patch"],
        ("", "pods"): ["list"],
        ("coordination.k8s.io", "leases"): ["list", "delete"],
    }
    off = render(tmp=tmp_path, values={"uninstall": {"teardown": False}})
    assert not _hooks(off)
    later = one(_hooks(render(tmp=tmp_path, values={"uninstall": {"timeoutSeconds": 300}})),
                "Job")
    assert later["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "300"


def test_the_webhook_service_is_off_by_default_and_routes_to_the_webhook_port(
    defaults: list[dict[str, Any]], tmp_path: Path
) -> None:
    assert len(by_kind(defaults, "Service")) == 1
    assert "LORENZ_OPERATOR_WEBHOOK_PORT" not in {e["name"] for e in _container(defaults)["env"]}
    objects = render(tmp=tmp_path, values={"webhooks": {"enabled": True},
                                           "networkPolicy": {"enabled": True}})
    service = next(s for s in by_kind(objects, "Service")
                   if s["metadata"]["name"] == "lorenz-webhooks")
    assert service["spec"]["ports"] == [
        {"name": "webhooks", "port": 8090, "targetPort": "webhooks", "protocol": "TCP"}
    ]
    container = _container(objects)
    assert {"name": "webhooks", "containerPort": 8090, "protocol": "TCP"} in container["ports"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LORENZ_OPERATOR_WEBHOOK_PORT"] == "8090"
    ingress = one(objects, "NetworkPolicy")["spec"]["ingress"]
    assert {"ports": [{"port": "webhooks", "protocol": "TCP"}]} in ingress  # from anywhere

