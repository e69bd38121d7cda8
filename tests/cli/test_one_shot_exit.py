"""``lorenz validate`` and ``lorenz config`` end without the interpreter's teardown.

Why: tearing down the modules pydantic, python-liquid and PyYAML loaded costs a sizeable part of
``validate``'s 300 ms budget (figures in ``bench/startup_bench.py``), so these one-shot commands
leave through ``os._exit`` once their output is flushed and the ``atexit`` callbacks ran. These
tests run the real entry point in a fresh interpreter and see from outside what a user can: the
exit code, every line of output, the ``atexit`` callbacks, the cyclic collector switched off
while they run, and (the point) no teardown — an object
held by a module global would have its ``__del__`` run by a normal interpreter exit. Callers of
``main([...])`` (the tests, ``lorenz worker``) keep a normal exit; every in-process CLI test
depends on that.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HANG_GUARD_S = 120.0

WORKFLOW = """---
tracker:
  kind: memory
---
Work on {{ issue.identifier }}.
"""

BROKEN_WORKFLOW = """---
tracker:
  kind: memory
polling:
  interval_ms: -5
agent:
  max_turns: 0
---
Work on {{ issue.titel }}.
"""

# NB: the probe writes with os.write: during a teardown sys.stderr may already be gone.
PROBE = textwrap.dedent(
    """
    import atexit, gc, os, sys

    class TornDown:
        def __del__(self):
            os.write(2, b"probe: torn down\\n")

    keep = TornDown()
    atexit.register(lambda: os.write(2, b"probe: atexit ran\\n"))
    atexit.register(lambda: os.write(2, b"probe: gc %s\\n" % (b"on" if gc.isenabled() else b"off")))
    sys.argv = ["lorenz", *sys.argv[1:]]
    from lorenz.cli import main
    sys.exit(main())
    """
)


def run_entry_point(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lorenz ARGS`` through ``lorenz.cli.main()`` as the console script calls it."""
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.parametrize(
    "args",
    [["validate", "WORKFLOW.md"], ["config", "WORKFLOW.md"], ["config", "WORKFLOW.md", "--json"]],
    ids=["validate", "config", "config-json"],
)
def test_one_shot_commands_flush_run_atexit_and_skip_the_teardown(
    tmp_path: Path, args: list[str]
) -> None:
    (tmp_path / "WORKFLOW.md").write_text(WORKFLOW, encoding="utf-8")
    result = run_entry_point(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    if args[0] == "validate":
        assert result.stdout.startswith(f"ok {tmp_path / 'WORKFLOW.md'}: tracker=memory ")
        assert result.stdout.endswith("prompt=custom\n")
    elif "--json" in args:
        assert json.loads(result.stdout)["prompt"]["template"].startswith("Work on")
    else:
        assert result.stdout.endswith("# prompt from the WORKFLOW.md body, 1 line\n")
    assert "probe: atexit ran" in result.stderr
    assert "probe: gc off" in result.stderr
    assert "probe: torn down" not in result.stderr


def test_a_failing_validate_prints_every_problem_and_exits_2_without_the_teardown(
    tmp_path: Path,
) -> None:
    (tmp_path / "WORKFLOW.md").write_text(BROKEN_WORKFLOW, encoding="utf-8")
    result = run_entry_point("validate", "WORKFLOW.md", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("invalid_workflow_config polling.interval_ms:") for line in lines)
    assert any(line.startswith("invalid_workflow_config agent.max_turns:") for line in lines)
    assert "probe: atexit ran" in result.stderr
    assert "probe: torn down" not in result.stderr


def test_run_mode_and_other_subcommands_keep_the_normal_exit(tmp_path: Path) -> None:
    # NB: the control: the probe does see a teardown where the shortcut does not apply, so the
    # tests above can fail (``crds`` is a one-shot too, but not marked as one).
    result = run_entry_point("crds", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CustomResourceDefinition" in result.stdout
    assert "probe: atexit ran" in result.stderr
    assert "probe: gc on" in result.stderr
    assert "probe: torn down" in result.stderr
