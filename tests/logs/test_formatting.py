"""Log lines as an operator or a log shipper reads them: JSON and key=value text."""

from __future__ import annotations

import datetime
import io
import json
import logging
import sys

import pytest

from lorenz.config import LogFormat, LoggingSettings
from lorenz.daemon.logs import (
    REDACTED,
    RunContext,
    SecretRedactor,
    configure_logging,
    format_value,
)
from lorenz.model import (
    AppStatus,
    OrchestratorSnapshot,
    PollStatus,
    RunningRow,
    RuntimeSnapshot,
    TokenUsage,
    UsageTotals,
)


def _configure(fmt: str, **kwargs: object) -> io.StringIO:
    stream = io.StringIO()
    configure_logging(LoggingSettings(format=LogFormat(fmt)), stream=stream, **kwargs)  # type: ignore[arg-type]
    return stream


def _event(**fields: object) -> dict[str, object]:
    return {"lorenz": {"type": "run_started", "at": "2025-01-02T03:04:05+00:00", **fields}}


def test_json_line_has_base_keys_and_every_event_field_on_top() -> None:
    stream = _configure("json")
    logging.getLogger("lorenz.runtime").info(
        "%s %s",
        "run_started",
        "run started",
        extra=_event(issue_id="id-1", identifier="LOR-1", slot=0, message="run started", attempt=2),
    )
    line = json.loads(stream.getvalue().strip())
    assert line["level"] == "info"
    assert line["logger"] == "lorenz.runtime"
    assert line["message"] == "run_started run started"
    assert line["ts"].endswith("Z")
    assert line["type"] == "run_started"
    assert line["at"] == "2025-01-02T03:04:05+00:00"
    assert (line["issue_id"], line["identifier"], line["slot"], line["attempt"]) == (
        "id-1",
        "LOR-1",
        0,
        2,
    )
    # The event's own message is already in the line's message: not repeated.
    assert "event_message" not in line


def test_json_keeps_an_extra_field_that_collides_with_a_base_key() -> None:
    stream = _configure("json")
    logging.getLogger("lorenz.x").warning(
        "poll failed", extra={"lorenz": {"level": "custom", "message": "different text"}}
    )
    line = json.loads(stream.getvalue())
    assert line["level"] == "warning"
    assert line["event_level"] == "custom"
    assert line["event_message"] == "different text"


def test_json_lines_are_one_per_record_even_with_newlines_and_tracebacks() -> None:
    stream = _configure("json")
    log = logging.getLogger("lorenz.x")
    log.info("two\nlines")
    try:
        raise ValueError("kaput")
    except ValueError:
        log.exception("it broke")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "two\nlines"
    assert second["level"] == "error"
    assert "ValueError: kaput" in second["exception"]


def test_plain_extra_keys_are_fields_too() -> None:
    stream = _configure("json")
    logging.getLogger("lorenz.agents").info("agent started", extra={"pid": 4242, "cwd": "/w"})
    line = json.loads(stream.getvalue())
    assert line["pid"] == 4242
    assert line["cwd"] == "/w"


def test_text_line_is_kubernetes_style_key_values() -> None:
    stream = _configure("text")
    logging.getLogger("lorenz.runtime").warning(
        "%s %s",
        "run_failed",
        "agent exited: boom",
        extra=_event(
            type="run_failed",
            issue_id="id-1",
            identifier="LOR-1",
            slot=0,
            message="agent exited: boom",
            outcome="failed",
        ),
    )
    line = stream.getvalue().strip()
    ts, level, logger, rest = line.split(" ", 3)
    assert ts.endswith("Z")
    assert level == "WARNING"
    assert logger == "lorenz.runtime"
    assert rest.startswith('"run_failed agent exited: boom" ')
    # Run-scoped keys come first, in a fixed order; "at" is not repeated.
    assert rest.endswith("issue_id=id-1 identifier=LOR-1 slot=0 type=run_failed outcome=failed")
    assert " at=" not in line


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("LOR-1", "LOR-1"),
        ("id#0", "id#0"),
        ("two words", '"two words"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("", '""'),
        ("a=b", '"a=b"'),
        (3, "3"),
        (1.5, "1.5"),
        (True, "true"),
        (["a", 1], '["a",1]'),
        ({"k": None}, '{"k":null}'),
    ],
)
def test_format_value_quotes_only_what_is_ambiguous(value: object, text: str) -> None:
    assert format_value(value) == text


def test_level_setting_filters_lines() -> None:
    stream = io.StringIO()
    configure_logging(LoggingSettings(level="warning"), stream=stream)
    log = logging.getLogger("lorenz.x")
    log.info("quiet")
    log.warning("loud")
    assert "quiet" not in stream.getvalue()
    assert "loud" in stream.getvalue()


def test_configure_twice_swaps_the_handler_and_replaces_basic_config() -> None:
    root = logging.getLogger()
    logging.basicConfig(stream=sys.stderr, force=False)
    early = [h for h in root.handlers if type(h) is logging.StreamHandler]
    first = io.StringIO()
    second = io.StringIO()
    configure_logging(LoggingSettings(), stream=first)
    configure_logging(LoggingSettings(), stream=second)
    logging.getLogger("lorenz.x").warning("once")
    assert first.getvalue() == ""
    assert second.getvalue().count("once") == 1
    assert not any(h in root.handlers for h in early if h.stream is sys.stderr)


def test_default_stream_is_whatever_stderr_is_at_write_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure_logging(LoggingSettings())
    swapped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", swapped)
    logging.getLogger("lorenz.x").warning("through the proxy")
    assert "through the proxy" in swapped.getvalue()


def test_aiohttp_access_log_is_quieted_below_debug() -> None:
    configure_logging(LoggingSettings(level="info"), stream=io.StringIO())
    assert logging.getLogger("aiohttp.access").getEffectiveLevel() == logging.WARNING


# ---------------------------------------------------------------------------------- redaction

SENTINEL = "lin_api_SENTINEL_7f3a9c2e"


def test_redactor_scrubs_message_args_extras_and_tracebacks() -> None:
    stream = _configure("json", secrets=[SENTINEL])
    log = logging.getLogger("lorenz.trackers")
    log.warning("request with %s failed", SENTINEL, extra={"url": f"https://x/?t={SENTINEL}"})
    log.info(
        "event", extra={"lorenz": {"error": [f"Bearer {SENTINEL}"], "nested": {"k": SENTINEL}}}
    )
    try:
        raise RuntimeError(f"token {SENTINEL} rejected")
    except RuntimeError:
        log.exception("tracker call raised")
    output = stream.getvalue()
    assert SENTINEL not in output
    assert output.count(REDACTED) >= 5
    lines = [json.loads(line) for line in output.splitlines()]
    assert lines[0]["message"] == f"request with {REDACTED} failed"
    assert lines[0]["url"] == f"https://x/?t={REDACTED}"
    assert lines[1]["nested"] == {"k": REDACTED}


def test_redactor_scrubs_json_escaped_and_longest_first() -> None:
    tricky = 'se"cret\\value'
    redactor = SecretRedactor([tricky, 'se"cret'])
    assert redactor.redact(json.dumps({"v": tricky})) == '{"v": "***"}'
    assert redactor.redact(f"a {tricky} b") == "a *** b"


def test_redactor_ignores_empty_and_tiny_values() -> None:
    redactor = SecretRedactor(["", None, "ab"])
    assert redactor.secrets == ()
    assert redactor.redact("ab cd") == "ab cd"


def test_redactor_survives_a_broken_format_string() -> None:
    redactor = SecretRedactor([SENTINEL])
    record = logging.LogRecord(
        "lorenz.x", logging.WARNING, __file__, 1, "%s and %s", (SENTINEL,), None
    )
    assert redactor.filter(record)
    assert SENTINEL not in record.getMessage()
    assert REDACTED in record.getMessage()


def _snapshot(*running: RunningRow) -> RuntimeSnapshot:
    at = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    return RuntimeSnapshot(
        app_status=AppStatus.RUNNING,
        workflow_path="WORKFLOW.md",
        poll=PollStatus(status="idle", interval_ms=1000, candidates=0, eligible=0,
                        last_poll_at=None, next_poll_at=None, last_error=None, count=0),
        lanes=OrchestratorSnapshot(generated_at=at, running=running, reserving=(), retrying=(),
                                   blocked=(), usage_totals=UsageTotals(), rate_limits=None),
        recent_events=(),
        run_history=(),
        log_file=None,
        config_error=None,
    )


def test_run_context_fills_session_for_event_lines() -> None:
    context = RunContext()
    started = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    context.observe(
        _snapshot(
            RunningRow(
                slot_key="id-1#0", issue_id="id-1", identifier="LOR-1", slot_index=0,
                state="Todo", url=None, host=None, workspace_path=None, session_id="sess-9",
                agent_pid=None, attempt=None, retry_kind=None, turn_count=0,
                last_agent_event=None, last_agent_message=None, last_agent_at=None,
                started_at=started, runtime_seconds=0.0, usage=TokenUsage(), cost_usd=0.0,
            )
        )
    )
    stream = _configure("json", run_context=context)
    logging.getLogger("lorenz.runtime").info(
        "run_finished", extra={"lorenz": {"type": "run_finished", "issue_id": "id-1", "slot": 0}}
    )
    line = json.loads(stream.getvalue())
    assert line["session_id"] == "sess-9"
    assert line["identifier"] == "LOR-1"
    # Once the slot is in no lane any more, it is forgotten.
    context.observe(_snapshot())
    assert context.fields_for("id-1#0") == {}
