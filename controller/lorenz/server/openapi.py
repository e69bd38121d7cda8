"""The OpenAPI 3.1 document of the HTTP API, written by hand and checked against the server.

Hand-written rather than generated because the responses are the runtime's plain-dict
snapshots, not models; what keeps it honest is the test suite, which runs schemathesis over
every operation against a real server fed by a real runtime, and validates lane rows of every
kind against these schemas. Enumerations that the code owns (event types, run outcomes, error
codes) are taken from the code, so they cannot drift.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from lorenz.model import EVENT_TYPES, RUN_OUTCOMES, BlockReason, RetryKind
from lorenz.server.errors import ERROR_CODES

API_VERSION = "1.0.0"

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _nullable(schema: Mapping[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [dict(schema), {"type": "null"}]}


def _object(properties: Mapping[str, Any], *, optional: tuple[str, ...] = (),
            open_: bool = False, description: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "required": [name for name in properties if name not in optional],
        "properties": dict(properties),
        "additionalProperties": open_,
    }
    if description:
        schema["description"] = description
    return schema


_STR = {"type": "string"}
_INT = {"type": "integer"}
_COUNT = {"type": "integer", "minimum": 0}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_TIME = {"type": "string", "format": "date-time"}
_RETRY_KINDS = [kind.value for kind in RetryKind]

SCHEMAS: dict[str, Any] = {
    "Error": _object(
        {
            "error": _object(
                {"code": {"type": "string", "enum": list(ERROR_CODES)}, "message": _STR}
            )
        },
        description="Every error answer: a stable code to branch on and a one-line message.",
    ),
    "TokenUsage": _object(
        {"input_tokens": _COUNT, "output_tokens": _COUNT, "total_tokens": _COUNT}
    ),
    "UsageTotals": _object(
        {
            "input_tokens": _COUNT,
            "output_tokens": _COUNT,
            "total_tokens": _COUNT,
            "seconds_running": {"type": "number", "minimum": 0},
            "cost_usd": {"type": "number", "minimum": 0},
        },
        description="Ended runs plus the usage and elapsed time of the runs still going.",
    ),
    "Poll": _object(
        {
            "status": {"type": "string", "enum": ["polling", "idle"]},
            "interval_ms": _COUNT,
            "candidates": _COUNT,
            "eligible": _COUNT,
            "last_poll_at": _nullable(_TIME),
            "next_poll_at": _nullable(_TIME),
            "last_error": _nullable(_STR),
            "count": _COUNT,
            "dispatch_paused": _nullable(
                _object({"code": _STR, "message": _STR, "since": _TIME})
            ),
        }
    ),
    "RunningRow": _object(
        {
            "slot_key": _STR,
            "issue_id": _STR,
            "identifier": _STR,
            "slot_index": _COUNT,
            "title": _nullable(_STR),
            "state": _STR,
            "url": _nullable(_STR),
            "agent_kind": _nullable(_STR),
            "host": _nullable(_STR),
            "workspace_path": _nullable(_STR),
            "session_id": _nullable(_STR),
            "agent_pid": _nullable(_INT),
            "attempt": _nullable(_INT),
            "retry_kind": {"enum": [*_RETRY_KINDS, None]},
            "turn_count": _COUNT,
            "last_agent_event": _nullable(_STR),
            "last_agent_message": _nullable(_STR),
            "last_agent_at": _nullable(_TIME),
            "started_at": _TIME,
            "runtime_seconds": {"type": "number", "minimum": 0},
            "usage": _ref("TokenUsage"),
            "cost_usd": {"type": "number", "minimum": 0},
        },
        description="A slot with a run in flight.",
    ),
    "ReservingRow": _object(
        {
            "slot_key": _STR,
            "issue_id": _STR,
            "identifier": _STR,
            "slot_index": _COUNT,
            "title": _nullable(_STR),
            "state": _STR,
            "attempt": _nullable(_INT),
            "reserved_at": _TIME,
            "expires_at": _TIME,
            "expires_in_ms": {"type": "number", "minimum": 0},
        },
        description="A slot reserved while a worker pool finds it a host (host-less by design).",
    ),
    "RetryRow": _object(
        {
            "slot_key": _STR,
            "issue_id": _STR,
            "identifier": _STR,
            "slot_index": _COUNT,
            "attempt": _INT,
            "kind": {"type": "string", "enum": _RETRY_KINDS},
            "due_at": _TIME,
            "due_in_ms": {"type": "number", "minimum": 0},
            "error": _nullable(_STR),
            "host": _nullable(_STR),
            "workspace_path": _nullable(_STR),
        },
        description="A slot waiting for its retry to come due.",
    ),
    "BlockedRow": _object(
        {
            "slot_key": _STR,
            "issue_id": _STR,
            "identifier": _STR,
            "slot_index": {"type": "integer", "minimum": 0},
            "reason": {
                "type": "string",
                "enum": [reason.value for reason in BlockReason],
            },
            "error": _nullable(_STR),
            "failures": {"type": "integer", "minimum": 0},
            "attempt": {"type": "integer", "minimum": 0},
            "terminal_action": {"type": "string", "enum": ["block", "escalate", "cancel"]},
            "action_done": {"type": "boolean"},
            "action_error": _nullable(_STR),
            "workspace_path": _nullable(_STR),
            "blocked_at": _TIME,
        },
        description=(
            "A slot that stopped retrying (retry budget used up, or the agent asked for input "
            "or approval) until a refresh or a change of its issue in the tracker."
        ),
    ),
    "WaitingRow": _object(
        {
            "slot_key": _STR,
            "issue_id": _STR,
            "identifier": _STR,
            "slot_index": _COUNT,
            "question": _STR,
            "options": {"type": "array", "items": _STR},
            "session_id": _nullable(_STR),
            "turn": {"type": "integer", "minimum": 1},
            "asked_at": _TIME,
            "posted": _BOOL,
            "workspace_path": _nullable(_STR),
        },
        description="A slot waiting for the answer to its agent's question (no concurrency "
        "held, no retry); an answer resumes the session (docs/questions.md).",
    ),
    "AnswerAccepted": _object(
        {
            "identifier": _STR,
            "slot_keys": {"type": "array", "items": _STR},
            "session_ids": {"type": "array", "items": _nullable(_STR)},
            "resumed": _BOOL,
        },
        description="The waiting slots the answer resumes, with the sessions they continue.",
    ),
    "Event": _object(
        {
            "type": {"type": "string", "enum": list(EVENT_TYPES)},
            "at": _TIME,
            "issue_id": _STR,
            "identifier": _STR,
            "slot": _COUNT,
            "message": _STR,
        },
        optional=("issue_id", "identifier", "slot", "message"),
        open_=True,
        description="A runtime event; types add their own fields (reason, outcome, "
        "retry_kind, delay_ms, duration_ms, code, ...).",
    ),
    "RunHistoryEntry": _object(
        {
            "issue_id": _STR,
            "identifier": _STR,
            "slot": _COUNT,
            "attempt": _nullable(_INT),
            "outcome": {"type": "string", "enum": list(RUN_OUTCOMES)},
            "error": _nullable(_STR),
            "started_at": _TIME,
            "finished_at": _TIME,
            "duration_ms": {"type": "integer", "minimum": 0},
            "host": _nullable(_STR),
            "session_id": _nullable(_STR),
            "turn_count": _COUNT,
            "usage": _ref("TokenUsage"),
        },
        description="One finished run.",
    ),
    "Snapshot": _object(
        {
            "generated_at": _TIME,
            "app_status": {
                "type": "string", "enum": ["starting", "running", "stopping", "stopped"]
            },
            "workflow_path": _STR,
            "poll": _ref("Poll"),
            "running": {"type": "array", "items": _ref("RunningRow")},
            "reserving": {"type": "array", "items": _ref("ReservingRow")},
            "retrying": {"type": "array", "items": _ref("RetryRow")},
            "blocked": {"type": "array", "items": _ref("BlockedRow")},
            "waiting": {"type": "array", "items": _ref("WaitingRow")},
            "usage_totals": _ref("UsageTotals"),
            "rate_limits": _nullable({"type": "object"}),
            "claimed_elsewhere": {"type": "array", "items": _STR},
            "recent_events": {
                "type": "array", "items": _ref("Event"), "maxItems": 20,
                "description": "Newest first.",
            },
            "run_history": {
                "type": "array", "items": _ref("RunHistoryEntry"), "maxItems": 50,
                "description": "Newest first.",
            },
            "log_file": _nullable(_STR),
            "config_error": {
                **_nullable(_ref("ConfigError")),
                "description": "Why the last reload of WORKFLOW.md failed (the runtime keeps "
                "the last good one), until a reload succeeds; else null.",
            },
            "daemon": {
                "type": "object",
                "description": "Present when the long-lived daemon runs this workflow.",
            },
            "budget": {
                "type": "object",
                "description": "Spend control, present while a `budget` cap is set: `day` "
                "(UTC), `day_spend` {tokens, usd}, `max_usd_per_day`, `remaining_usd`, `held` "
                "(the budget lane: issue, cap, limit, spent, held_at), `runs` and `issues` "
                "(spend per run in flight and per issue); see docs/budgets.md.",
            },
        },
        optional=("daemon", "budget"),
        description="The whole runtime at one instant (also each SSE `snapshot` event).",
    ),
    "ConfigError": _object(
        {
            "code": _STR,
            "message": _STR,
            "since": {**_TIME, "description": "When reloads began to fail."},
        },
        description="The reload error in force.",
    ),
    "AgentUpdateEntry": _object(
        {
            "at": _nullable(_TIME),
            "slot_key": _STR,
            "event": _nullable(_STR),
            "message": _nullable(_STR),
        }
    ),
    "IssueDetail": _object(
        {
            "issue_id": _STR,
            "identifier": _STR,
            "status": {
                "type": "string",
                "enum": ["running", "reserving", "retrying", "blocked", "idle"],
                "description": "The busiest lane holding a slot of the issue; `idle` when "
                "only history or events remember it.",
            },
            "title": _nullable(_STR),
            "state": _nullable(_STR),
            "url": _nullable(_STR),
            "workspace": _object(
                {
                    "path": _nullable(_STR),
                    "recorded": {
                        **_BOOL,
                        "description": "false: not recorded by a run; the path is where "
                        "the workspace would be.",
                    },
                }
            ),
            "attempts": _object(
                {
                    "current_retry_attempt": _nullable(_INT),
                    "restart_count": _COUNT,
                    "runs_started": _nullable(_COUNT),
                }
            ),
            "running": {"type": "array", "items": _ref("RunningRow")},
            "reserving": {"type": "array", "items": _ref("ReservingRow")},
            "retrying": {"type": "array", "items": _ref("RetryRow")},
            "blocked": {"type": "array", "items": _ref("BlockedRow")},
            "last_agent": _nullable(
                _object(
                    {
                        "slot_key": _STR,
                        "event": _nullable(_STR),
                        "message": _nullable(_STR),
                        "at": _nullable(_TIME),
                    }
                )
            ),
            "agent_updates": {
                "type": "array", "items": _ref("AgentUpdateEntry"),
                "description": "Newest first.",
            },
            "tokens": _ref("TokenUsage"),
            "recent_events": {
                "type": "array", "items": _ref("Event"), "description": "Newest first.",
            },
            "run_history": {
                "type": "array", "items": _ref("RunHistoryEntry"),
                "description": "Newest first.",
            },
            "last_error": _nullable(_STR),
        },
        description="One issue across every lane, its workspace, attempts, agent messages, "
        "tokens, events and finished runs.",
    ),
    "RefreshAccepted": _object(
        {
            "queued": _BOOL,
            "coalesced": _BOOL,
            "requested_at": _TIME,
            "operations": {
                "type": "array", "items": {"type": "string", "enum": ["poll", "reconcile"]}
            },
        }
    ),
    "Health": _object(
        {"status": {"type": "string", "enum": ["ok"]}, "app_status": _STR}
    ),
}


def _json(schema: Mapping[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_NOT_ALLOWED = _error("Another method on this path (`method_not_allowed`, with an Allow header).")

PATHS: dict[str, Any] = {
    "/api/v1/state": {
        "get": {
            "operationId": "getState",
            "summary": "The full runtime snapshot",
            "responses": {
                "200": _json(_ref("Snapshot"), "The snapshot (plus `daemon` in daemon mode)."),
                "405": _NOT_ALLOWED,
            },
        }
    },
    "/api/v1/issues/{identifier}": {
        "get": {
            "operationId": "getIssue",
            "summary": "One issue: slots, workspace, attempts, agent messages, tokens, events",
            "parameters": [
                {
                    "name": "identifier",
                    "in": "path",
                    "required": True,
                    "description": "Tracker identifier (`ABC-123`, percent-encode `/` and `#`) "
                    "or issue id.",
                    "schema": {"type": "string", "minLength": 1},
                }
            ],
            "responses": {
                "200": _json(_ref("IssueDetail"), "What the runtime knows of the issue."),
                "404": _error("The runtime knows nothing of it (`issue_not_found`)."),
                "405": _NOT_ALLOWED,
            },
        }
    },
    "/api/v1/refresh": {
        "post": {
            "operationId": "refresh",
            "summary": "Queue an immediate poll and reconcile pass",
            "security": [{"bearerToken": []}, {}],
            "requestBody": {
                "required": False,
                "description": "Empty, or an empty JSON object.",
                "content": {
                    "application/json": {
                        "schema": {"type": "object", "properties": {},
                                   "additionalProperties": False}
                    }
                },
            },
            "responses": {
                "202": _json(_ref("RefreshAccepted"), "Queued (coalesced with one under way)."),
                "400": _error(
                    "The body is not empty or `{}` (`invalid_request_body`), or nests too "
                    "deep (`request_body_too_deep`)."
                ),
                "401": _error(
                    "Over TCP: no bearer token (`auth_token_missing`) or not this server's "
                    "(`auth_token_invalid`)."
                ),
                "403": _error(
                    "A foreign Host header (`host_not_allowed`) or a cross-origin sender "
                    "(`cross_origin_refused`)."
                ),
                "405": _NOT_ALLOWED,
                "413": _error("The body is over 64 KiB (`request_rejected`)."),
                "415": _error("A body declared as anything but JSON (`unsupported_media_type`)."),
                "503": _error("The runtime has stopped (`orchestrator_unavailable`)."),
            },
        }
    },
    "/api/v1/issues/{identifier}/answer": {
        "post": {
            "operationId": "answerIssue",
            "summary": "Answer the question a waiting issue's agent asked; its session resumes",
            "security": [{"bearerToken": []}, {}],
            "parameters": [
                {"name": "identifier", "in": "path", "required": True, "schema": _STR,
                 "description": "The issue's identifier (or id)."}
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": _object(
                            {
                                "text": {"type": "string", "minLength": 1, "maxLength": 20000},
                                "source": {"type": "string",
                                           "enum": ["cli", "dashboard", "api"]},
                            },
                            optional=("source",),
                        )
                    }
                },
            },
            "responses": {
                "202": _json(_ref("AnswerAccepted"), "Answered: the slots resume at once."),
                "400": _error(
                    "No usable `text` (`answer_invalid`), a body that is not such an object "
                    "(`invalid_request_body`), or one that nests too deep "
                    "(`request_body_too_deep`)."
                ),
                "401": _error(
                    "Over TCP: no bearer token (`auth_token_missing`) or not this server's "
                    "(`auth_token_invalid`)."
                ),
                "403": _error(
                    "A foreign Host header (`host_not_allowed`) or a cross-origin sender "
                    "(`cross_origin_refused`)."
                ),
                "404": _error("No slot of the issue waits for an answer (`issue_not_waiting`)."),
                "405": _NOT_ALLOWED,
                "413": _error("The body is over 64 KiB (`request_rejected`)."),
                "415": _error("A body declared as anything but JSON (`unsupported_media_type`)."),
                "422": _error(
                    "`input.answer_template` failed to render (`template_render_error`)."
                ),
                "503": _error("The runtime has stopped (`orchestrator_unavailable`)."),
            },
        }
    },
    "/api/v1/events": {
        "get": {
            "operationId": "streamEvents",
            "summary": "Server-sent events: the current snapshot, then one per change",
            "description": "`event: snapshot` frames whose `data` is a Snapshot document, at "
            "most one per ~100 ms per client (bursts are coalesced); a `: heartbeat` comment "
            "every 15 s of silence. The stream ends only when the client or server leaves.",
            "responses": {
                "200": {
                    "description": "The event stream.",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                "405": _NOT_ALLOWED,
                "503": {
                    "description": "The server is shutting down (an empty stream).",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
            },
        }
    },
    "/metrics": {
        "get": {
            "operationId": "getMetrics",
            "summary": "Prometheus metrics (text format; OpenMetrics when asked via Accept)",
            "responses": {
                "200": {
                    "description": "The exposition (see docs/metrics.md).",
                    "content": {
                        "text/plain": {"schema": {"type": "string"}},
                        "application/openmetrics-text": {"schema": {"type": "string"}},
                    },
                },
                "405": _NOT_ALLOWED,
            },
        }
    },
    "/healthz": {
        "get": {
            "operationId": "getHealth",
            "summary": "Liveness: 200 while the runtime has not stopped",
            "responses": {
                "200": _json(_ref("Health"), "Serving, and the runtime is not stopped."),
                "405": _NOT_ALLOWED,
                "503": _error("The runtime has stopped (`orchestrator_unavailable`)."),
            },
        }
    },
    "/api/v1/openapi.json": {
        "get": {
            "operationId": "getOpenApi",
            "summary": "This document",
            "responses": {
                "200": _json({"type": "object"}, "The OpenAPI 3.1 document."),
                "405": _NOT_ALLOWED,
            },
        }
    },
}


def openapi_document(*, extra_paths: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A fresh copy of the document; ``extra_paths`` (e.g. the daemon's routes) are merged in."""
    paths = copy.deepcopy(PATHS)
    for path, item in (extra_paths or {}).items():
        paths.setdefault(path, {}).update(copy.deepcopy(dict(item)))
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Lorenz",
            "version": API_VERSION,
            "description": "Observe and nudge one Lorenz workflow: state, issues, live "
            "snapshots, metrics. Read-only except the refresh trigger (and the daemon's "
            "control routes when mounted).",
        },
        "paths": paths,
        "components": {
            "schemas": copy.deepcopy(SCHEMAS),
            "securitySchemes": {
                "bearerToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The server's token file (0600, beside the workflow's "
                    "lease; fresh at every start). Required over TCP for every state-changing "
                    "route; the unix socket needs none.",
                }
            },
        },
    }
