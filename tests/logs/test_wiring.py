"""How run mode wires logging: early defaults, then the workflow's section and secrets."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from collections.abc import Mapping
from pathlib import Path

import pytest

from lorenz.config import LoggingSettings
from lorenz.daemon import logs
from lorenz.workflow import LoadedWorkflow, load_workflow
from tests.runtime.harness import write_agent, write_workflow

TOKEN = "lin_api_WIRING_SENTINEL_31"
ENV_TOKEN = "ghp_WIRING_ENV_SENTINEL_77"


@dataclasses.dataclass(frozen=True)
class _Options:
    environ: Mapping[str, str] | None


def _loaded(tmp_path: Path) -> LoadedWorkflow:
    agent = write_agent(tmp_path, "noop", "pass\n")
    path = write_workflow(
        tmp_path,
        agent_script=agent,
        front_matter={
            "tracker": {"kind": "memory", "api_key": TOKEN},
            "logging": {"format": "json", "level": "debug"},
        },
    )
    return load_workflow(path, environ={})


def test_attachment_factory_configures_logging_for_the_workflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    logs.configure_logging(LoggingSettings())  # the CLI's early, pre-workflow setup
    loaded = _loaded(tmp_path)
    attachment = logs.attachment_factory(loaded, _Options(environ={"GITHUB_TOKEN": ENV_TOKEN}))
    assert isinstance(attachment, logs.RunContextAttachment)
    setup = logs.active_logging()
    assert setup is not None
    assert setup.workflow == str(loaded.canonical_path)
    assert logging.getLogger().level == logging.DEBUG
    logging.getLogger("lorenz.x").debug("tokens %s %s", TOKEN, ENV_TOKEN)
    line = json.loads(stream.getvalue().strip().splitlines()[-1])
    assert line["message"] == "tokens *** ***"
    # Already configured for this workflow (the host called configure_for_workflow): kept.
    handler = setup.handler
    logs.attachment_factory(loaded, _Options(environ={}))
    active = logs.active_logging()
    assert active is not None
    assert active.handler is handler


def test_configure_for_workflow_reads_the_process_environment_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LINEAR_API_KEY", ENV_TOKEN)
    stream = io.StringIO()
    setup = logs.configure_for_workflow(_loaded(tmp_path), stream=stream)
    assert ENV_TOKEN in setup.redactor.secrets
    assert TOKEN in setup.redactor.secrets
