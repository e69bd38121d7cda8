"""The generated parts of the Kubernetes shape, without a cluster: key mapping, schema
conversion, names, operator settings, Event rate limits, spec loading, statuses."""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from lorenz.config import WorkerKind, WorkflowSettings
from lorenz.kube.api import crds, resources
from lorenz.kube.api.casing import (
    camel,
    field_names,
    front_matter_from_spec,
    spec_from_front_matter,
)
from lorenz.kube.api.schemas import PRESERVE, SchemaConversionError, structural_schema
from lorenz.kube.api.statuses import (
    CLAIM_SPEC_FIELDS,
    PLACEMENTS_SHOWN,
    ClaimSpec,
    ClaimStatus,
    condition,
    status_from_snapshot,
)
from lorenz.kube.controller.posting import REPEAT_WINDOW_S, EventPoster
from lorenz.kube.controller.specs import failed_stamp, workflow_from_spec
from lorenz.kube.errors import InvalidOperatorSettings
from lorenz.kube.settings import OperatorSettings, load_settings
from lorenz.model import ClaimPhase, ClaimRecord, EventType, RuntimeEvent, SlotKey, UsageTotals
from lorenz.workflow import InvalidWorkflowConfig, TemplateParseError, load_workflow
from lorenz.workflow.documents import parse_front_matter, split_front_matter
from lorenz.workflow.schema import iter_fields
from tests.kube.conftest import ManualMonotonic
from tests.kube.snapshots import AT, runtime_snapshot

REPO = Path(__file__).resolve().parents[2]
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


# -- casing -------------------------------------------------------------------------------


def example_front_matter() -> dict[str, Any]:
    text = (REPO / "examples" / "WORKFLOW.md").read_text()
    front = parse_front_matter(split_front_matter(text).front_matter, path=Path("WORKFLOW.md"))
    return {str(k): v for k, v in front.items()}


def test_no_two_fields_of_a_section_share_a_camel_case_key() -> None:
    models = {WorkflowSettings} | {f.section for f in iter_fields() if f.section is not None}
    for model in models:
        table = field_names(model)
        assert len(set(table.values())) == len(table)


def test_the_example_workflow_round_trips_through_a_spec() -> None:
    front = example_front_matter()
    spec = spec_from_front_matter(front)
    assert spec["tracker"]["projectSlug"] == front["tracker"]["project_slug"]
    assert spec["agent"]["maxConcurrentAgentsByState"] == {"In Progress": 3}
    assert front_matter_from_spec(spec) == front


def test_user_keys_and_pass_through_maps_are_never_renamed() -> None:
    front = {
        "agents": {
            "my_agent": {
                "command": "x",
                "turn_timeout_ms": 5,
                "env": {"SOME_VAR": "1", "lower_case": "2"},
                "turn_sandbox_policy": {"network_access": True},
            }
        },
        "agent": {"kind": "my_agent", "max_concurrent_agents_by_state": {"in_review": 1}},
        "tracker": {"kind": "files", "provider": {"page_size": 5, "nested_map": {"a_b": 1}}},
        "not_a_section": {"keep_me": 1},
    }
    spec = spec_from_front_matter(front)
    agent = spec["agents"]["my_agent"]
    assert agent["turnTimeoutMs"] == 5
    assert agent["env"] == {"SOME_VAR": "1", "lower_case": "2"}
    assert agent["turnSandboxPolicy"] == {"network_access": True}
    assert spec["agent"]["maxConcurrentAgentsByState"] == {"in_review": 1}
    assert spec["tracker"]["provider"] == {"page_size": 5, "nested_map": {"a_b": 1}}
    assert spec["not_a_section"] == {"keep_me": 1}
    assert front_matter_from_spec(spec) == front


def test_a_snake_case_key_in_a_spec_stays_as_written_so_validation_names_it() -> None:
    spec = {"polling": {"interval_ms": 5}}
    front = front_matter_from_spec(spec)
    assert front == {"polling": {"interval_ms": 5}}  # not silently accepted as intervalMs
    with pytest.raises(pydantic.ValidationError):
        WorkflowSettings.model_validate({"polling": {"intervalMs": 5}})


@pytest.mark.parametrize(
    ("snake", "expected"), [("a", "a"), ("max_turns", "maxTurns"), ("a_b_c", "aBC")]
)
def test_camel(snake: str, expected: str) -> None:
    assert camel(snake) == expected


# -- schemas ------------------------------------------------------------------------------


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        if "type" in node or PRESERVE in node:
            found.append((path, node))
        for key, value in node.get("properties", {}).items():
            found.extend(walk(value, f"{path}.{key}"))
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                found.extend(walk(node[key], f"{path}[{key}]"))
    return found


@pytest.mark.parametrize("crd", crds.all_crds(), ids=lambda c: c["metadata"]["name"])
def test_generated_schemas_are_structural(crd: dict[str, Any]) -> None:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    forbidden_keys = (
        "$ref", "anyOf", "allOf", "title:", "x-lorenz-", "additionalProperties: false"
    )
    for forbidden in forbidden_keys:
        assert forbidden not in text, forbidden
    nodes = walk(schema)
    assert len(nodes) > 10
    for path, node in nodes:
        assert "type" in node or node.get(PRESERVE) is True, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if "exclusiveMinimum" in node:
            assert isinstance(node["exclusiveMinimum"], bool), path


def test_only_pass_through_fields_preserve_unknown_fields() -> None:
    spec = crds.workflow_spec_schema()
    preserved = sorted(path for path, node in walk(spec) if node.get(PRESERVE))
    assert preserved == [
        ".agents[additionalProperties].approvalPolicy",
        ".agents[additionalProperties].turnSandboxPolicy",
        ".codex.approvalPolicy",
        ".codex.turnSandboxPolicy",
        ".tracker.provider",
        ".worker.podTemplate.affinity",
    ]


def test_operator_owned_keys_are_left_out_and_defaults_described() -> None:
    spec = crds.workflow_spec_schema()
    assert set(spec["properties"]) >= {"tracker", "agent", "agents", "prompt"}
    for owned in ("claimStore", "daemon", "server", "logging"):
        assert owned not in spec["properties"]
    assert "root" not in spec["properties"]["workspace"]["properties"]
    assert "Default: 30000." in spec["properties"]["polling"]["properties"]["intervalMs"][
        "description"
    ]
    interval = spec["properties"]["polling"]["properties"]["intervalMs"]
    assert interval["minimum"] == 1
    assert "default" not in interval
    assert "nullable" not in spec["properties"]["workspace"]["properties"]["repo"]


class Untyped(pydantic.BaseModel):
    anything: Any = None


class Union(pydantic.BaseModel):
    either: int | str = 0


class Bounds(pydantic.BaseModel):
    ratio: float = pydantic.Field(default=0.5, gt=0, lt=1)
    maybe: int | None = None


def test_the_converter_refuses_what_it_cannot_express() -> None:
    with pytest.raises(SchemaConversionError, match="anything"):
        structural_schema(Untyped, rename=camel)
    with pytest.raises(SchemaConversionError, match="either"):
        structural_schema(Union, rename=camel)


def test_number_bounds_and_nullable() -> None:
    schema = structural_schema(Bounds, rename=camel)
    ratio = schema["properties"]["ratio"]
    assert ratio == {
        "type": "number",
        "description": "Default: 0.5.",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 1,
        "exclusiveMaximum": True,
    }
    assert schema["properties"]["maybe"] == {"type": "integer", "nullable": True}
    strict = structural_schema(Bounds, rename=camel, nullable=False)
    assert strict["properties"]["maybe"] == {"type": "integer"}


# -- names --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "slot", ["ABC-123#0", "abc-123#0", "gh/owner/repo#42#1", "ÜBER#0", "--#0", "x" * 400 + "#2"]
)
def test_claim_names_are_valid_deterministic_and_distinct(slot: str) -> None:
    name = resources.claim_name("My_Workflow", slot)
    assert DNS_SUBDOMAIN.match(name), name
    assert len(name) <= 253
    assert resources.claim_name("My_Workflow", slot) == name
    assert resources.claim_name("My_Workflow", slot + "x") != name
    assert LABEL_VALUE.match(resources.label_value(slot))
    assert len(resources.label_value(slot)) <= 63


def test_case_variants_get_different_claim_names() -> None:
    assert resources.claim_name("wf", "A#0") != resources.claim_name("wf", "a#0")


def test_long_workflow_names_keep_lease_and_label_within_limits() -> None:
    long = "w" * 250
    assert len(resources.lease_name(long)) <= 253
    assert resources.lease_name("demo") == "lorenz-wf-demo"
    assert resources.workflow_label("demo") == "demo"
    label = resources.workflow_label(long)
    assert len(label) <= 63
    assert LABEL_VALUE.match(label)
    assert resources.workflow_label(long) != resources.workflow_label(long + "x")


# -- operator settings --------------------------------------------------------------------


def test_flags_win_over_the_environment_over_defaults() -> None:
    env = {"LORENZ_OPERATOR_LEASE_DURATION_SECONDS": "20", "LORENZ_OPERATOR_NAMESPACES": "a, b"}
    settings = load_settings(flags={"lease_duration_seconds": "30"}, environ=env)
    assert settings.lease_duration_seconds == 30
    assert settings.namespaces == ("a", "b")
    assert settings.renew_deadline_seconds == 10.0
    assert load_settings(environ=env).lease_duration_seconds == 20
    assert load_settings(environ={}).lease_duration_seconds == 15


def test_bad_settings_name_the_flag_or_variable() -> None:
    with pytest.raises(InvalidOperatorSettings) as caught:
        load_settings(
            flags={"api_port": "http"}, environ={"LORENZ_OPERATOR_EVENTS_PER_MINUTE": "-1"}
        )
    assert caught.value.code == "invalid_operator_settings"
    assert "--api-port" in str(caught.value)
    assert "LORENZ_OPERATOR_EVENTS_PER_MINUTE" in str(caught.value)
    with pytest.raises(InvalidOperatorSettings, match="renew deadline"):
        load_settings(flags={"renew_deadline_seconds": "20"}, environ={})


def test_identities_are_unique_per_process() -> None:
    assert OperatorSettings().identity != OperatorSettings().identity


def test_every_setting_has_a_docstring() -> None:
    for name, info in OperatorSettings.model_fields.items():
        assert info.description, name


# -- events -------------------------------------------------------------------------------


def test_events_are_rate_limited_and_repeats_dropped() -> None:
    posted: list[tuple[str, str, str]] = []
    clock = ManualMonotonic()
    poster = EventPoster(
        reference={"kind": "Workflow"},
        per_minute=3,
        post=lambda ref, kind, reason, message: posted.append((kind, reason, message)),
        monotonic=clock,
    )
    assert poster.post("Normal", "A", "1")
    assert not poster.post("Normal", "A", "1")  # the same again: dropped
    assert poster.post("Normal", "A", "2")
    assert poster.post("Normal", "B", "3")
    assert not poster.post("Normal", "C", "4")  # bucket empty
    clock.advance(20.0)  # 3/min → one token back
    assert poster.post("Normal", "C", "4")
    clock.advance(REPEAT_WINDOW_S)
    assert poster.post("Normal", "C", "4")  # a repeat after the window
    assert poster.dropped == 2
    assert [p[1] for p in posted] == ["A", "A", "B", "C", "C"]


def _runtime_event(kind: EventType, **fields: Any) -> RuntimeEvent:
    return RuntimeEvent(type=kind, at=datetime.datetime.now(datetime.UTC), **fields)


def test_a_silenced_poster_posts_nothing_more() -> None:
    posted: list[str] = []
    poster = EventPoster(
        reference={}, per_minute=60,
        post=lambda ref, kind, reason, message: posted.append(reason),
    )
    assert poster.post("Normal", "Before", "1")
    poster.silence()  # the Workflow is being deleted
    assert not poster.post("Warning", "After", "2")
    assert not poster.runtime_event(
        _runtime_event(EventType.RUN_FAILED, identifier="X-1", message="x")
    )
    assert posted == ["Before"]
    assert (poster.posted, poster.dropped) == (1, 2)


def test_runtime_events_map_to_event_reasons() -> None:
    posted: list[tuple[str, str, str]] = []
    poster = EventPoster(
        reference={}, per_minute=60,
        post=lambda ref, kind, reason, message: posted.append((kind, reason, message)),
    )
    assert poster.runtime_event(
        _runtime_event(EventType.RUN_FAILED, identifier="X-1", slot=0, attempt=2, message="boom")
    )
    assert not poster.runtime_event(_runtime_event(EventType.POLL_COMPLETED))
    assert posted == [("Warning", "RunFailed", "X-1 slot 0 attempt 2: boom")]


# -- specs --------------------------------------------------------------------------------


def body(spec: dict[str, Any], *, generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "wf", "namespace": "ns", "uid": "u-1", "generation": generation},
        "spec": spec,
    }


def test_a_spec_and_a_file_with_the_same_content_load_the_same_settings(tmp_path: Path) -> None:
    front = {
        "tracker": {"kind": "files", "path": "issues", "active_states": ["Todo"]},
        "polling": {"interval_ms": 1234},
        "agent": {"kind": "sh", "max_concurrent_agents": 2},
        "agents": {"sh": {"command": "true", "protocol": "command", "env": {"A_B": "1"}}},
        "hooks": {"before_run": "echo hi"},
        # NB: written out: the operator's default kind (pod) is not a single host's (local).
        "worker": {"kind": "local"},
    }
    prompt = "Do {{ issue.identifier }}"
    workflow_dir = tmp_path / "ns" / "wf"
    workflow_dir.mkdir(parents=True)
    file = workflow_dir / "WORKFLOW.md"
    front_with_root = {**front, "workspace": {"root": str(workflow_dir / "workspaces")}}
    file.write_text(f"---\n{yaml.safe_dump(front_with_root)}---\n{prompt}\n")
    from_file = load_workflow(file, environ={})
    from_spec = workflow_from_spec(
        body({**spec_from_front_matter(front), "prompt": prompt}),
        workflow_dir=workflow_dir,
        api_key=None,
    )
    assert from_spec.settings == from_file.settings
    assert from_spec.prompt_template == from_file.prompt_template
    assert from_spec.path == workflow_dir / "WORKFLOW.md"


def test_a_workflow_without_worker_kind_runs_in_pods_and_local_is_chosen_explicitly(
    tmp_path: Path,
) -> None:
    tracker = {"kind": "files", "path": "issues"}
    unset = workflow_from_spec(body({"tracker": tracker}), workflow_dir=tmp_path, api_key=None)
    assert unset.settings.worker.kind is WorkerKind.POD
    assert "worker" not in unset.raw  # the rendered WORKFLOW.md shows what the spec says
    for worker in ({"kind": None}, {"startTimeoutMs": 5000, "podTemplate": {"image": "a:1"}}):
        loaded = workflow_from_spec(
            body({"tracker": tracker, "worker": worker}), workflow_dir=tmp_path, api_key=None
        )
        assert loaded.settings.worker.kind is WorkerKind.POD
    local = workflow_from_spec(
        body({"tracker": tracker, "worker": {"kind": "local", "sshHosts": ["build1"]}}),
        workflow_dir=tmp_path,
        api_key=None,
    )
    assert local.settings.worker.kind is WorkerKind.LOCAL
    assert local.settings.worker.ssh_hosts == ("build1",)
    # The settings model's own default stays local: a single host has nothing else.
    assert WorkflowSettings().worker.kind is WorkerKind.LOCAL


@pytest.mark.parametrize(
    ("asked", "ceiling", "effective"),
    [
        (None, 0, 10),  # the core's default
        (None, 2, 2),  # the operator's flag bounds the default
        (5, 2, 2),  # ... and a spec that asks for more
        (0, 2, 2),  # ... and one that asks for none
        (1, 2, 1),  # a spec may ask for fewer
        (0, 0, 0),  # no ceiling: the spec's own "never"
        (25, 0, 25),
    ],
)
def test_the_operators_continuation_flag_is_a_ceiling_on_the_workflows_limit(
    tmp_path: Path, asked: int | None, ceiling: int, effective: int
) -> None:
    spec: dict[str, Any] = {"tracker": {"kind": "files", "path": "issues"}}
    if asked is not None:
        spec["agent"] = {"maxContinuationRuns": asked}
    loaded = workflow_from_spec(
        body(spec), workflow_dir=tmp_path, api_key=None, continuation_ceiling=ceiling
    )
    assert loaded.settings.agent.max_continuation_runs == effective
    # The rendered WORKFLOW.md shows what the spec says, not the bound.
    assert loaded.raw.get("agent", {}).get("max_continuation_runs") == asked


@pytest.mark.parametrize(
    ("spec", "key_path"),
    [
        ({"worker": {"sshHosts": ["build1"]}}, "worker.ssh_hosts"),
        ({"worker": {"detached": True}}, "worker.detached"),
        ({"workspace": {"kind": "worktree", "repo": "/src/repo"}}, "workspace.kind"),
    ],
)
def test_local_only_settings_without_worker_kind_are_a_coded_error(
    tmp_path: Path, spec: dict[str, Any], key_path: str
) -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        workflow_from_spec(
            body({"tracker": {"kind": "files", "path": "issues"}, **spec}),
            workflow_dir=tmp_path,
            api_key=None,
        )
    (problem,) = caught.value.problems()
    assert (problem.code, problem.key_path) == ("worker_kind_conflict", key_path)
    assert "the operator's default" in problem.reason


def test_the_environment_never_reaches_a_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LINEAR_API_KEY", "from-the-operator-env")
    monkeypatch.setenv("LORENZ_FLAG_CLAIM_STORE__BACKEND", "sqlite")
    spec = {
        "tracker": {"kind": "linear", "projectSlug": "p", "assignee": "$HOME"},
        "agent": {"kind": "codex"},
    }
    loaded = workflow_from_spec(body(spec), workflow_dir=tmp_path, api_key=None)
    assert loaded.settings.tracker.api_key is None
    assert loaded.settings.tracker.assignee is None  # $HOME is not looked up: missing
    assert str(loaded.settings.claim_store.backend) == "memory"
    with_key = workflow_from_spec(body(spec), workflow_dir=tmp_path, api_key="lin_123")
    assert with_key.settings.tracker.api_key == "lin_123"
    assert "lin_123" not in str(with_key.raw)


def test_the_stamp_follows_the_spec_and_the_secret(tmp_path: Path) -> None:
    spec = {"tracker": {"kind": "memory"}}
    one = workflow_from_spec(body(spec), workflow_dir=tmp_path, api_key=None)
    same = workflow_from_spec(body(spec), workflow_dir=tmp_path, api_key=None)
    assert one.stamp == same.stamp
    changed = workflow_from_spec(
        body({**spec, "polling": {"intervalMs": 5}}, generation=2), workflow_dir=tmp_path,
        api_key=None,
    )
    assert changed.stamp != one.stamp
    rotated = workflow_from_spec(
        body(spec), workflow_dir=tmp_path, api_key=None, secret_digest="new"
    )
    assert rotated.stamp != one.stamp
    assert failed_stamp(body(spec), ValueError("x")) not in (one.stamp, changed.stamp)


def test_a_broken_prompt_is_a_coded_error(tmp_path: Path) -> None:
    spec = {"tracker": {"kind": "memory"}, "prompt": "{% if %}"}
    with pytest.raises(TemplateParseError) as caught:
        workflow_from_spec(body(spec), workflow_dir=tmp_path, api_key=None)
    assert caught.value.code == "template_parse_error"


# -- statuses -----------------------------------------------------------------------------


def test_claim_spec_and_status_partition_the_claim_record() -> None:
    from lorenz.kube.api.statuses import CLAIM_DISPLAY_FIELDS, CLAIM_POD_FIELDS

    record_fields = {f.name for f in dataclasses.fields(ClaimRecord)}
    spec_fields = set(ClaimSpec.model_fields) - {"workflow"}
    assert spec_fields == set(CLAIM_SPEC_FIELDS)
    status_fields = (
        set(ClaimStatus.model_fields) - set(CLAIM_DISPLAY_FIELDS) - set(CLAIM_POD_FIELDS)
    )
    assert spec_fields | status_fields == record_fields
    assert not spec_fields & status_fields


def test_a_condition_keeps_its_transition_time_until_its_status_flips() -> None:
    t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    t1 = t0 + datetime.timedelta(minutes=5)
    first = condition("Ready", "True", reason="Polling", generation=1, now=t0)
    again = condition("Ready", "True", reason="Polling", message="x", generation=2, now=t1,
                      previous=[first])
    assert again.last_transition_time == t0
    flipped = condition("Ready", "False", reason="PollFailed", generation=2, now=t1,
                        previous=[again])
    assert flipped.last_transition_time == t1
    with pytest.raises(pydantic.ValidationError):
        condition("Ready", "True", reason="not a reason!", generation=1, now=t0)


def test_status_from_a_snapshot() -> None:
    snapshot = runtime_snapshot(
        last_poll_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        candidates=3, eligible=1, count=7, interval_ms=500, running=1, retrying=2,
        usage=UsageTotals(input_tokens=5, output_tokens=6, total_tokens=11,
                          seconds_running=1.23456, cost_usd=0.5),
    )
    status = status_from_snapshot(snapshot)
    assert status["lanes"] == {"running": 1, "reserving": 0, "retrying": 2, "blocked": 0}
    assert status["poll"]["lastPollAt"] == "2026-01-01T00:00:00Z"
    assert status["poll"]["count"] == 7
    assert status["usage"]["secondsRunning"] == 1.2
    assert status["placements"] == []  # a run in the operator's own Pod is not listed


def test_the_status_says_where_each_run_is_placed() -> None:
    snapshot = runtime_snapshot(running=3)
    early, late = AT - datetime.timedelta(minutes=1), AT + datetime.timedelta(minutes=1)
    rows = snapshot.lanes.running
    placed = (
        dataclasses.replace(rows[0], host="lzw-t-0-s0-pod", started_at=late),
        dataclasses.replace(rows[1], host=None),
        dataclasses.replace(rows[2], host="lzw-t-2-s0-pod", slot_index=1, started_at=early),
    )
    snapshot = dataclasses.replace(
        snapshot, lanes=dataclasses.replace(snapshot.lanes, running=placed)
    )
    status = status_from_snapshot(snapshot, nodes={SlotKey(placed[2].slot_key): "node-3"})
    assert status["placements"] == [
        {"identifier": "T-2", "slot": 1, "host": "lzw-t-2-s0-pod", "node": "node-3"},
        {"identifier": "T-0", "slot": 0, "host": "lzw-t-0-s0-pod", "node": None},
    ]
    many = runtime_snapshot(running=PLACEMENTS_SHOWN + 5)
    many = dataclasses.replace(many, lanes=dataclasses.replace(many.lanes, running=tuple(
        dataclasses.replace(row, host=f"pod-{n}") for n, row in enumerate(many.lanes.running)
    )))
    assert len(status_from_snapshot(many)["placements"]) == PLACEMENTS_SHOWN


# -- commands -----------------------------------------------------------------------------


def test_lorenz_crds_prints_both_definitions(capsys: pytest.CaptureFixture[str]) -> None:
    from lorenz.cli import main

    assert main(["crds"]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["metadata"]["name"] for d in documents] == [
        "workflows.lorenz.dev",
        "claims.lorenz.dev",
    ]


def test_lorenz_operator_help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    from lorenz.cli import main

    assert main(["operator", "--help"]) == 0
    text = capsys.readouterr().out
    for field in OperatorSettings.model_fields:
        assert "--" + field.replace("_", "-") in text


def test_lorenz_operator_refuses_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from lorenz.cli import main

    assert main(["operator", "--retry-period-seconds", "9"]) == 2
    assert "invalid_operator_settings" in capsys.readouterr().err


def test_docs_list_every_operator_flag_and_error_code() -> None:
    from lorenz.kube import errors
    from lorenz.kube.settings import flag_name
    from lorenz.model import LorenzError

    text = (REPO / "docs" / "operator.md").read_text()
    for field in OperatorSettings.model_fields:
        assert f"`{flag_name(field)}" in text, field
    codes = {
        cls.code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, LorenzError) and cls.__module__
        == errors.__name__
    }
    for code in codes - {"operator_error"}:
        assert f"`{code}`" in text, code


def test_a_lost_lease_is_a_coded_leadership_error() -> None:
    from lorenz.kube.errors import LeaseLost
    from lorenz.leadership import LeadershipLost

    lost = LeaseLost(lease="ns/lorenz-wf-x", holder="b", since_renew_s=2.5)
    assert isinstance(lost, LeadershipLost)
    assert lost.code == "leadership_lost"
    assert "held by b" in str(lost)
    assert "2.5 s ago" in str(lost)


def test_kubectl_explain_shows_plain_text_without_markup() -> None:
    from lorenz.kube.api.crds import all_crds

    def descriptions(node: Any) -> list[str]:
        found = []
        if isinstance(node, dict):
            if isinstance(node.get("description"), str):
                found.append(node["description"])
            for value in node.values():
                found += descriptions(value)
        elif isinstance(node, list):
            for value in node:
                found += descriptions(value)
        return found

    texts = [t for crd in all_crds() for t in descriptions(crd)]
    assert len(texts) > 50
    marked = [t for t in texts if "`" in t or ":class:" in t]
    assert marked == []


def test_a_first_run_is_attempt_zero_on_the_wire_and_a_retry_shows_its_backoff() -> None:
    from lorenz.kube.api.statuses import claim_status, go_duration, record_from_claim

    first = ClaimRecord(
        slot_key=SlotKey("I-1#0"), issue_id="I-1", identifier="I-1", slot_index=0,
        phase=ClaimPhase.RUNNING, owner="a",
    )
    status = claim_status(first)
    assert status["attempt"] == 0
    assert status["retryIn"] is None
    spec = {"workflow": "wf", "slotKey": "I-1#0", "issueId": "I-1", "identifier": "I-1",
            "slotIndex": 0}
    assert record_from_claim({"spec": spec, "status": status}).attempt is None
    written = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    retry = dataclasses.replace(
        first, phase=ClaimPhase.RETRY_PENDING, attempt=2, updated_at=written,
        due_at=written + datetime.timedelta(seconds=320),
    )
    assert claim_status(retry)["retryIn"] == "5m20s"
    assert go_duration(3723) == "1h2m3s"
    assert go_duration(9.6) == "10s"


def test_the_checkpoint_is_camel_case_in_the_status_and_snake_case_in_memory() -> None:
    from lorenz.kube.api.casing import camel_keys, snake_keys

    checkpoint = {"schema": 1, "usage_totals": {"input_tokens": 5, "seconds_running": 1.5}}
    wire = camel_keys(checkpoint)
    assert wire == {"schema": 1, "usageTotals": {"inputTokens": 5, "secondsRunning": 1.5}}
    assert snake_keys(wire) == checkpoint
