"""The command runner: prompt on stdin and in LORENZ_PROMPT_FILE, stdout lines as events."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from lorenz.agents import build_runner
from lorenz.agents.base import AgentRunError
from lorenz.agents.command import CommandRunner
from lorenz.agents.processes import MAX_LINE_BYTES
from lorenz.config import AgentProtocol
from tests.agents.conftest import RunKit, assert_gone
from tests.waiting import wait_until_async

COMMAND = AgentProtocol.COMMAND


def script(tmp_path: Path, body: str) -> str:
    """A Python agent script in ``tmp_path``; returns the command that runs it."""
    path = tmp_path / f"agent_{abs(hash(body))}.py"
    path.write_text(body)
    return f"{sys.executable} {path}"


def read_text(path: Path) -> str:
    return path.read_text()


def _exists(path: Path) -> bool:
    return path.exists()


async def test_the_prompt_arrives_on_stdin_and_in_the_prompt_file(
    kit: RunKit, tmp_path: Path, workspace: Path
) -> None:
    command = script(
        tmp_path,
        "import json, os, sys\n"
        "stdin = sys.stdin.read()\n"
        "path = os.environ['LORENZ_PROMPT_FILE']\n"
        "data = {'stdin': stdin, 'file': open(path).read(), 'path': path, 'cwd': os.getcwd(),\n"
        "        'mode': os.stat(path).st_mode & 0o777}\n"
        "open('seen.json', 'w').write(json.dumps(data))\n"
        "print('step one'); print('step two')\n",
    )
    prompt = "Fix ABC-1.\nSecond line of the prompt."
    result = await CommandRunner().run(
        kit.request(command=command, protocol=COMMAND, prompt=prompt)
    )

    assert result.turns == 1
    assert result.stop_reason == "exited"
    seen = json.loads(read_text(workspace / "seen.json"))
    assert seen["stdin"] == prompt + "\n"
    assert seen["file"] == prompt
    assert seen["cwd"] == str(workspace)
    prompt_file = Path(seen["path"])
    assert workspace not in prompt_file.parents  # never inside the workspace
    assert seen["mode"] == 0o600  # readable by this user only
    assert not _exists(prompt_file)  # removed after the run
    outputs = [u.message for u in kit.recorder.of("output")]
    assert outputs == ["step one", "step two"]
    started = kit.recorder.of("session_started")
    assert len(started) == 1
    assert started[0].session_id
    assert started[0].pid
    assert kit.recorder.events()[-1] == "turn_completed"


async def test_a_non_zero_exit_fails_with_the_status_and_stderr_tail(
    kit: RunKit, tmp_path: Path
) -> None:
    command = script(
        tmp_path,
        "import sys\nprint('trying')\nsys.stderr.write('tests failed: 3\\n')\nsys.exit(4)\n",
    )
    with pytest.raises(AgentRunError) as caught:
        await CommandRunner().run(kit.request(command=command, protocol=COMMAND))
    assert caught.value.code == "agent_exited"
    assert caught.value.message.startswith("agent exited with status 4: ")
    assert "tests failed: 3" in caught.value.message


async def test_a_missing_command_says_so(kit: RunKit) -> None:
    with pytest.raises(AgentRunError) as caught:
        await CommandRunner().run(
            kit.request(command="lorenz-no-such-agent --go", protocol=COMMAND)
        )
    assert caught.value.code == "agent_exited"
    assert "status 127" in caught.value.message
    assert "command not found" in caught.value.message


async def test_the_turn_timeout_bounds_the_whole_run(kit: RunKit, tmp_path: Path) -> None:
    # NB: the agent writes its child's pid to a file before anything else, and the timeout is
    # long enough for a loaded machine to start Python; the pid file (not the recorded output,
    # which may not have been read yet when the timeout fires) says which child to check.
    pid_file = tmp_path / "child.pid"
    command = script(
        tmp_path,
        "import pathlib, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))\n"
        "while True:\n"
        "    print('still busy', flush=True); time.sleep(0.05)\n",
    )
    with pytest.raises(AgentRunError) as caught:
        await CommandRunner().run(
            kit.request(command=command, protocol=COMMAND, turn_timeout_ms=5000)
        )
    assert caught.value.code == "turn_timeout"
    pid = kit.recorder.of("session_started")[0].pid
    assert pid is not None
    assert pid_file.exists(), "the agent did not start its child within the turn timeout"
    assert_gone([pid, int(pid_file.read_text())])


async def test_long_output_lines_are_cut_for_the_dashboard(kit: RunKit, tmp_path: Path) -> None:
    command = script(tmp_path, "print('y' * 5000)\n")
    await CommandRunner().run(kit.request(command=command, protocol=COMMAND))
    (output,) = kit.recorder.of("output")
    assert output.message == "y" * 500


async def test_a_line_over_the_limit_is_reported_and_output_continues(
    kit: RunKit, tmp_path: Path
) -> None:
    command = script(
        tmp_path,
        f"import sys\nsys.stdout.write('z' * {MAX_LINE_BYTES + 10} + '\\n')\nprint('after')\n",
    )
    await CommandRunner().run(kit.request(command=command, protocol=COMMAND))
    messages = [u.message or "" for u in kit.recorder.of("output")]
    assert "skipped" in messages[0]
    assert messages[-1] == "after"


async def test_a_large_prompt_does_not_deadlock_a_command_that_ignores_stdin(
    kit: RunKit, tmp_path: Path
) -> None:
    command = script(tmp_path, "for n in range(3000):\n    print('line', n)\n")
    result = await CommandRunner().run(
        kit.request(command=command, protocol=COMMAND, prompt="p" * 2_000_000)
    )
    assert result.turns == 1
    assert len(kit.recorder.of("output")) == 3000


async def test_a_background_child_holding_stdout_does_not_keep_the_run_open(
    kit: RunKit, tmp_path: Path
) -> None:
    command = script(
        tmp_path,
        "import subprocess\n"
        "child = subprocess.Popen(['sleep', '300'])\n"  # inherits stdout
        "print(child.pid)\n",
    )
    result = await CommandRunner().run(
        kit.request(command=command, protocol=COMMAND, turn_timeout_ms=60_000)
    )
    assert result.turns == 1
    child = int(kit.recorder.of("output")[0].message or "0")
    assert_gone([child])


async def test_max_turns_does_not_apply(kit: RunKit, tmp_path: Path) -> None:
    command = script(tmp_path, "print('once')\n")
    result = await CommandRunner().run(kit.request(command=command, protocol=COMMAND, max_turns=5))
    assert result.turns == 1
    assert kit.active_calls == 0
    assert kit.continuation_calls == []


async def test_cancelling_the_run_kills_the_command_and_its_children(
    kit: RunKit, tmp_path: Path
) -> None:
    command = script(
        tmp_path,
        "import subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n",
    )
    task = asyncio.create_task(CommandRunner().run(kit.request(command=command, protocol=COMMAND)))
    await wait_until_async(
        lambda: bool(kit.recorder.of("output")),
        timeout=10.0,
        what='bool(kit.recorder.of("output"))',
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    child = int(kit.recorder.of("output")[0].message or "0")
    pid = kit.recorder.of("session_started")[0].pid
    assert pid is not None
    assert_gone([pid, child])


async def test_the_agent_sees_the_run_environment_only(kit: RunKit, tmp_path: Path) -> None:
    command = script(
        tmp_path,
        "import json, os\nprint(json.dumps(sorted(k for k in os.environ if 'LORENZ' in k)))\n",
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LORENZ_ISSUE_ID": "issue-1"}
    await CommandRunner().run(kit.request(command=command, protocol=COMMAND, env=env))
    (output,) = kit.recorder.of("output")
    assert json.loads(output.message or "") == [
        "LORENZ_ISSUE_ID",
        "LORENZ_PROMPT_FILE",
        "LORENZ_USAGE_FILE",  # budgets: where the agent may report its usage
    ]


def test_the_factory_builds_a_command_runner() -> None:
    assert isinstance(build_runner(AgentProtocol.COMMAND), CommandRunner)


@pytest.mark.parametrize(("login_shell", "expected"), [(True, "login profile"),
                                                       (False, "no profile")])
async def test_login_shell_says_whether_the_profile_runs(
    kit: RunKit, tmp_path: Path, login_shell: bool, expected: str
) -> None:
    # agents.<kind>.login_shell: the default (bash -lc) reads ~/.bash_profile before the
    # command; false (bash -c) skips it.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bash_profile").write_text("export PROFILE_RAN='login profile'\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    await CommandRunner().run(kit.request(
        command='echo "${PROFILE_RAN:-no profile}"', protocol=COMMAND, env=env,
        login_shell=login_shell,
    ))
    (output,) = kit.recorder.of("output")
    assert output.message == expected
