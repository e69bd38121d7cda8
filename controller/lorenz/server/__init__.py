"""Layer 7: the HTTP API, the SSE stream, Prometheus metrics; the dashboard mounts here too.

See docs/api.md and docs/metrics.md.
"""

from lorenz.server.app import (
    HUB_KEY,
    JOURNAL_KEY,
    METRICS_KEY,
    RUNTIME_KEY,
    LorenzServer,
    PortOptions,
    ServerError,
    attachment_factory,
    build_app,
    installed_dashboard_routes,
)
from lorenz.server.errors import ERROR_CODES, ApiError, error_body
from lorenz.server.journal import IssueJournal
from lorenz.server.metrics import LorenzMetrics, MetricsLabelInUse
from lorenz.server.openapi import openapi_document
from lorenz.server.streaming import SnapshotHub, encode_event

__all__ = [
    "ERROR_CODES",
    "HUB_KEY",
    "JOURNAL_KEY",
    "METRICS_KEY",
    "RUNTIME_KEY",
    "ApiError",
    "IssueJournal",
    "LorenzMetrics",
    "LorenzServer",
    "MetricsLabelInUse",
    "PortOptions",
    "ServerError",
    "SnapshotHub",
    "attachment_factory",
    "build_app",
    "encode_event",
    "error_body",
    "installed_dashboard_routes",
    "openapi_document",
]
