"""Outside input bounds on WORKFLOW.md: size, depth and alias expansion, each a coded error."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lorenz.workflow import (
    MAX_WORKFLOW_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    WorkflowLoadTimeout,
    WorkflowParseError,
    WorkflowTooComplex,
    WorkflowTooLarge,
    load_off_loop,
    load_workflow,
    loading,
    parse_front_matter,
)
from tests.workflow.conftest import WriteWorkflow

LORENZ = Path(sys.executable).with_name("lorenz")
HANG_GUARD_S = 120.0
"""Hang protection for subprocesses only (the unbounded parser took minutes); never a figure."""


def alias_bomb(levels: int = 8) -> str:
    """Billion laughs: ``levels`` anchored lists, each of nine aliases of the one before (the
    first of nine strings); the default is the classic bomb, hundreds of millions of values
    once expanded."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    previous = "a"
    for name in "bcdefgh"[: levels - 1]:
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
        previous = name
    lines += ["tracker:", "  kind: memory", f"  provider: {{x: *{previous}}}"]
    return "\n".join(lines)


def nested(depth: int) -> str:
    return "tracker:\n  kind: memory\n  provider:\n    x: " + "[" * depth + "]" * depth


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LORENZ), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def expanded_values(levels: int) -> int:
    """The lists and strings of :func:`alias_bomb` once expanded: every anchored list, and the
    last one once more under ``provider`` (the handful of keys and maps around them aside)."""
    sizes = [10]  # the first list and its nine strings
    for _ in range(levels - 1):
        sizes.append(1 + 9 * sizes[-1])
    return sum(sizes) + sizes[-1]


def test_the_alias_bomb_is_small() -> None:
    """The bomb passes the size bound by far: only the parser's node bound can refuse it, and
    it does so exactly where the expansion crosses :data:`MAX_YAML_NODES`."""
    assert len(f"---\n{alias_bomb()}\n---\nPrompt\n".encode()) <= 512 < MAX_WORKFLOW_BYTES
    # Four levels expand to ~16k values, under the bound: decoded in full.
    assert expanded_values(4) + 100 < MAX_YAML_NODES < expanded_values(5)
    value = parse_front_matter(alias_bomb(4))["tracker"]["provider"]["x"]
    for _ in range(3):
        assert len(value) == 9
        value = value[0]
    assert value == ["lol"] * 9
    # One level more (~140k values) is past it: refused while composing, naming the bound.
    with pytest.raises(WorkflowTooComplex) as caught:
        parse_front_matter(alias_bomb(5))
    assert f"limit {MAX_YAML_NODES} nodes" in caught.value.message


def test_an_alias_bomb_is_refused_naming_the_node_limit() -> None:
    with pytest.raises(WorkflowTooComplex) as caught:
        parse_front_matter(alias_bomb())
    assert caught.value.code == "workflow_too_complex"
    assert f"limit {MAX_YAML_NODES} nodes" in caught.value.message


def test_aliases_within_the_bound_decode_as_usual() -> None:
    data = parse_front_matter("base: &b {x: 1}\ntracker: {kind: memory, provider: {y: *b}}")
    assert data["tracker"]["provider"] == {"y": {"x": 1}}


def test_nesting_beyond_the_depth_bound_is_refused_naming_the_limit() -> None:
    with pytest.raises(WorkflowTooComplex) as caught:
        parse_front_matter(nested(1000))
    assert f"limit depth {MAX_YAML_DEPTH}" in caught.value.message


def test_nesting_at_the_depth_bound_decodes() -> None:
    # tracker → provider → x are three levels; the innermost list is level MAX_YAML_DEPTH.
    data = parse_front_matter(nested(MAX_YAML_DEPTH - 3))
    value = data["tracker"]["provider"]["x"]
    for _ in range(MAX_YAML_DEPTH - 4):
        value = value[0]
    assert value == []
    with pytest.raises(WorkflowTooComplex):
        parse_front_matter(nested(MAX_YAML_DEPTH - 2))


def test_an_alias_that_deepens_past_the_bound_is_refused() -> None:
    inner = "[" * 40 + "]" * 40
    text = f"a: &a {inner}\ntracker: {{kind: memory, provider: {{x: {'[' * 30}*a{']' * 30}}}}}"
    parse_front_matter(f"a: &a {inner}")  # alone it is within the bound
    with pytest.raises(WorkflowTooComplex) as caught:
        parse_front_matter(text)
    assert "depth" in caught.value.message


def test_a_flat_list_longer_than_the_node_bound_is_refused() -> None:
    text = "items: [" + ",".join(["1"] * MAX_YAML_NODES) + "]"
    with pytest.raises(WorkflowTooComplex):
        parse_front_matter(text)


def test_a_self_referencing_alias_is_refused() -> None:
    with pytest.raises(WorkflowTooComplex) as caught:
        parse_front_matter("tracker: {kind: memory, provider: {x: &a [1, *a]}}")
    assert "*a" in caught.value.message


def test_invalid_yaml_is_still_a_parse_error() -> None:
    with pytest.raises(WorkflowParseError):
        parse_front_matter("tracker: [")


def test_a_file_over_the_size_bound_is_refused_unparsed(write_workflow: WriteWorkflow) -> None:
    path = write_workflow("tracker:\n  kind: memory", body="x" * MAX_WORKFLOW_BYTES)
    with pytest.raises(WorkflowTooLarge) as caught:
        load_workflow(path, environ={})
    assert caught.value.code == "workflow_too_large"
    assert "1 MiB" in caught.value.message


def test_a_file_just_under_the_size_bound_loads(write_workflow: WriteWorkflow) -> None:
    path = write_workflow("tracker:\n  kind: memory", body="x" * (MAX_WORKFLOW_BYTES - 100))
    assert load_workflow(path, environ={}).settings.tracker.kind is not None


def test_a_deeply_nested_prompt_template_is_a_coded_error(write_workflow: WriteWorkflow) -> None:
    body = "{% if true %}" * 3000 + "x" + "{% endif %}" * 3000
    loaded = load_workflow(write_workflow("tracker:\n  kind: memory", body=body), environ={})
    assert [p.code for p in loaded.prompt.problems()] == ["template_parse_error"]


def test_a_recursion_error_anywhere_in_loading_is_coded(
    write_workflow: WriteWorkflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NB: the bounds stop every known path first; this pins the last line of defence.
    def recurse(*args: object, **kwargs: object) -> dict[str, object]:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(loading, "resolve_front_matter", recurse)
    with pytest.raises(WorkflowTooComplex) as caught:
        load_workflow(write_workflow("tracker:\n  kind: memory"), environ={})
    assert f"limit depth {MAX_YAML_DEPTH}" in caught.value.message


@pytest.mark.parametrize("command", ["validate", "config"])
@pytest.mark.parametrize(
    ("front_matter", "code"),
    [(alias_bomb(), "workflow_too_complex"), (nested(1000), "workflow_too_complex")],
    ids=["alias-bomb", "depth-1000"],
)
def test_the_cli_reports_the_code_and_exits_2_without_a_traceback(
    write_workflow: WriteWorkflow, tmp_path: Path, command: str, front_matter: str, code: str
) -> None:
    path = write_workflow(front_matter)
    result = run_cli(command, str(path), cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert output.startswith(f"{code}"), output
    assert "Traceback" not in output


async def test_load_off_loop_returns_the_result_and_raises_the_error() -> None:
    assert await load_off_loop(lambda: 42) == 42

    def fail() -> int:
        raise WorkflowParseError("bad")

    with pytest.raises(WorkflowParseError):
        await load_off_loop(fail)


async def test_load_off_loop_gives_up_at_its_bound_while_the_loop_keeps_running() -> None:
    release = threading.Event()
    try:
        with pytest.raises(WorkflowLoadTimeout) as caught:
            await load_off_loop(lambda: release.wait(), timeout_s=0.2)
        assert caught.value.code == "workflow_load_timeout"
        assert "0.2 s" in caught.value.message
    finally:
        release.set()  # the abandoned thread finishes; its late result is dropped
