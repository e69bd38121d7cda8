"""Every error code Lorenz reports, in one place, with what it means and what the user does.

A code is part of the product's interface: ``lorenz validate`` prints it, the API answers with
it, a Kubernetes condition carries it as its reason, a run's ``last_error`` starts with it, and
decisions (retry, block, poison a worker host) compare against it. So codes are written once,
here, as :class:`ErrorCode` members, and every raise site names a member instead of spelling
the string again. ``docs/errors.md`` is rendered from :data:`CODE_DOCS`
(the table of :mod:`lorenz.codes.catalog`) by :func:`lorenz.codes.docs.render_error_docs`,
and a test keeps it current.

:class:`ErrorCode` is a :class:`enum.StrEnum`: a member *is* its string (it compares equal to
it, hashes like it, formats and JSON-encodes as it), so code that reads codes back from storage
or from the wire as plain strings keeps working unchanged.

NB: this module imports nothing of Lorenz. Even ``lorenz.config`` (which sits beside
``lorenz.model`` in the layers) may import it, to raise its validation errors under their codes.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Any


class ErrorCode(enum.StrEnum):
    """A stable error code (snake_case); ``docs/errors.md#<code>`` documents each."""

    # config: WORKFLOW.md, its flags, features and environment
    WORKFLOW_ERROR = "workflow_error"
    MISSING_WORKFLOW_FILE = "missing_workflow_file"
    WORKFLOW_PARSE_ERROR = "workflow_parse_error"
    WORKFLOW_TOO_LARGE = "workflow_too_large"
    WORKFLOW_TOO_COMPLEX = "workflow_too_complex"
    WORKFLOW_LOAD_TIMEOUT = "workflow_load_timeout"
    WORKFLOW_FRONT_MATTER_NOT_A_MAP = "workflow_front_matter_not_a_map"
    TEMPLATE_PARSE_ERROR = "template_parse_error"
    TEMPLATE_RENDER_ERROR = "template_render_error"
    INVALID_WORKFLOW_CONFIG = "invalid_workflow_config"
    FLAG_ONLY_SECTION = "flag_only_section"
    UNKNOWN_FLAG = "unknown_flag"
    UNKNOWN_FEATURE = "unknown_feature"
    INVALID_FLAG_SYNTAX = "invalid_flag_syntax"
    INVALID_FEATURE_VALUE = "invalid_feature_value"
    UNSUPPORTED_TRACKER_KIND = "unsupported_tracker_kind"
    MISSING_TRACKER_KIND = "missing_tracker_kind"
    MISSING_TRACKER_API_KEY = "missing_tracker_api_key"
    MISSING_TRACKER_PROJECT_SLUG = "missing_tracker_project_slug"
    MISSING_TRACKER_REPOSITORY = "missing_tracker_repository"
    MISSING_TRACKER_PATH = "missing_tracker_path"
    MISSING_AGENT_COMMAND = "missing_agent_command"
    UNKNOWN_AGENT_KIND = "unknown_agent_kind"
    SSH_CLIENT_MISSING = "ssh_client_missing"
    SSH_WORKTREE_UNSUPPORTED = "ssh_worktree_unsupported"
    RETRY_BACKOFF_ALIAS_CONFLICT = "retry_backoff_alias_conflict"
    RETRY_CANCEL_STATE_ACTIVE = "retry_cancel_state_active"
    RETRY_CANCEL_STATE_MISSING = "retry_cancel_state_missing"
    INPUT_WAITING_STATE_INACTIVE = "input_waiting_state_inactive"
    RETRY_ESCALATION_EMPTY = "retry_escalation_empty"
    RETRY_ESCALATION_LABEL_REQUIRED = "retry_escalation_label_required"
    WORKER_DETACHED_FALSE = "worker_detached_false"
    WORKER_POD_SETTINGS_UNUSED = "worker_pod_settings_unused"
    WORKER_KIND_CONFLICT = "worker_kind_conflict"
    WORKER_POD_VALUE_INVALID = "worker_pod_value_invalid"

    # tracker: Linear, GitHub, GitLab, Jira, issue files, the in-memory tracker
    TRACKER_ERROR = "tracker_error"
    INVALID_TRACKER_CONFIG = "invalid_tracker_config"
    INVALID_TRACKER_REPOSITORY = "invalid_tracker_repository"
    MEMORY_TRACKER_NEEDS_INSTANCE = "memory_tracker_needs_instance"
    TRACKER_CLOSED = "tracker_closed"
    TRACKER_REQUEST = "tracker_request"
    TRACKER_STATE_NOT_FOUND = "tracker_state_not_found"
    LINEAR_API_REQUEST = "linear_api_request"
    LINEAR_API_STATUS = "linear_api_status"
    LINEAR_GRAPHQL_ERRORS = "linear_graphql_errors"
    LINEAR_UNKNOWN_PAYLOAD = "linear_unknown_payload"
    LINEAR_MISSING_END_CURSOR = "linear_missing_end_cursor"
    LINEAR_RATE_LIMITED = "linear_rate_limited"
    LINEAR_WRITE_FAILED = "linear_write_failed"
    MISSING_LINEAR_VIEWER_IDENTITY = "missing_linear_viewer_identity"
    INVALID_GRAPHQL_OPERATION = "invalid_graphql_operation"
    GITHUB_API_REQUEST = "github_api_request"
    GITHUB_API_STATUS = "github_api_status"
    GITHUB_UNKNOWN_PAYLOAD = "github_unknown_payload"
    GITHUB_RATE_LIMITED = "github_rate_limited"
    MISSING_GITHUB_VIEWER_IDENTITY = "missing_github_viewer_identity"
    FILES_FOLDER_MISSING = "files_folder_missing"
    FILES_FOLDER_UNREADABLE = "files_folder_unreadable"
    FILES_MALFORMED_ISSUE = "files_malformed_issue"
    FILES_ISSUE_NOT_FOUND = "files_issue_not_found"
    FILES_INVALID_STATE = "files_invalid_state"
    INVALID_TRACKER_ENDPOINT = "invalid_tracker_endpoint"
    INVALID_TRACKER_PROJECT_SLUG = "invalid_tracker_project_slug"
    MISSING_TRACKER_EMAIL = "missing_tracker_email"
    MISSING_TRACKER_ENDPOINT = "missing_tracker_endpoint"
    GITLAB_API_REQUEST = "gitlab_api_request"
    GITLAB_API_STATUS = "gitlab_api_status"
    GITLAB_UNKNOWN_PAYLOAD = "gitlab_unknown_payload"
    GITLAB_TOO_MANY_PAGES = "gitlab_too_many_pages"
    GITLAB_RESPONSE_TOO_LARGE = "gitlab_response_too_large"
    GITLAB_RATE_LIMITED = "gitlab_rate_limited"
    GITLAB_STATES_NEED_LABEL_SCOPE = "gitlab_states_need_label_scope"
    GITLAB_STATE_UNREACHABLE = "gitlab_state_unreachable"
    MISSING_GITLAB_VIEWER_IDENTITY = "missing_gitlab_viewer_identity"
    GITLAB_API_METHOD_REFUSED = "gitlab_api_method_refused"
    GITLAB_API_PATH_REFUSED = "gitlab_api_path_refused"
    GITLAB_API_BODY_REFUSED = "gitlab_api_body_refused"
    GITLAB_API_BODY_TOO_LARGE = "gitlab_api_body_too_large"
    GITLAB_API_QUERY_INVALID = "gitlab_api_query_invalid"
    JIRA_API_REQUEST = "jira_api_request"
    JIRA_API_STATUS = "jira_api_status"
    JIRA_UNKNOWN_PAYLOAD = "jira_unknown_payload"
    JIRA_ISSUE_ERRORS = "jira_issue_errors"
    JIRA_TOO_MANY_PAGES = "jira_too_many_pages"
    JIRA_RESPONSE_TOO_LARGE = "jira_response_too_large"
    JIRA_RATE_LIMITED = "jira_rate_limited"
    MISSING_JIRA_VIEWER_IDENTITY = "missing_jira_viewer_identity"
    INVALID_JIRA_LABEL = "invalid_jira_label"
    INVALID_JIRA_REST_CALL = "invalid_jira_rest_call"

    # agent: the coding agent a run drives
    AGENT_RUN_FAILED = "agent_run_failed"
    AGENT_PROTOCOL_UNAVAILABLE = "agent_protocol_unavailable"
    AGENT_SPAWN_FAILED = "agent_spawn_failed"
    AGENT_EXITED = "agent_exited"
    AGENT_LINE_TOO_LONG = "agent_line_too_long"
    READ_TIMEOUT = "read_timeout"
    HANDSHAKE_FAILED = "handshake_failed"
    STARTUP_TIMEOUT = "startup_timeout"
    AGENT_PROTOCOL_ERROR = "agent_protocol_error"
    AGENT_OVERLOADED = "agent_overloaded"
    TURN_FAILED = "turn_failed"
    TURN_TIMEOUT = "turn_timeout"
    TURN_INTERRUPTED = "turn_interrupted"
    TURN_REFUSED = "turn_refused"
    MAX_TURNS_REACHED = "max_turns_reached"
    INPUT_REQUIRED = "input_required"

    # run: how the runtime ends, skips or blocks a run
    RUN_ABORTED = "run_aborted"
    ISSUE_FIELD_INVALID = "issue_field_invalid"
    RESERVATION_LOST = "reservation_lost"
    PLACEMENT_FAILED = "placement_failed"
    TERMINAL_ACTION_FAILED = "terminal_action_failed"
    TERMINAL_ACTION_UNSUPPORTED = "terminal_action_unsupported"
    ISSUE_NOT_WAITING = "issue_not_waiting"
    ANSWER_INVALID = "answer_invalid"
    QUESTION_CHANNEL_UNSUPPORTED = "question_channel_unsupported"
    QUESTION_POST_FAILED = "question_post_failed"

    # budget: token and dollar caps, model prices
    PRICING_INVALID = "pricing_invalid"
    MODEL_UNPRICED = "model_unpriced"
    BUDGET_CANCEL_STATE_MISSING = "budget_cancel_state_missing"
    BUDGET_EXHAUSTED = "budget_exhausted"

    # worker: the detached process a run executes in (local, over SSH, or in a Pod)
    WORKER_NEVER_STARTED = "worker_never_started"
    SPAWN_INTENT_FAILED = "spawn_intent_failed"
    WORKER_GONE = "worker_gone"
    WORKER_UNKNOWN = "worker_unknown"
    WORKER_KILL_UNCONFIRMED = "worker_kill_unconfirmed"
    WORKER_LAUNCH_FAILED = "worker_launch_failed"
    WORKER_LAUNCH_TIMEOUT = "worker_launch_timeout"
    WORKER_START_FAILED = "worker_start_failed"
    WORKER_HOST_UNREACHABLE = "worker_host_unreachable"
    WORKER_HOST_INVALID = "worker_host_invalid"
    WORKER_KIND_UNAVAILABLE = "worker_kind_unavailable"
    WORKER_STATE_ERROR = "worker_state_error"
    WORKER_SPEC_INVALID = "worker_spec_invalid"
    WORKER_SOCKET_PATH_TOO_LONG = "worker_socket_path_too_long"
    WORKER_STATE_ROOT_TOO_LONG = "worker_state_root_too_long"
    WORKER_STATE_DIR_FOREIGN = "worker_state_dir_foreign"
    WORKER_HANDLE_INVALID = "worker_handle_invalid"
    WORKER_HANDLE_USED = "worker_handle_used"
    WORKER_HANDLES_EXHAUSTED = "worker_handles_exhausted"
    WORKER_ALREADY_RUNNING = "worker_already_running"
    WORKER_JOURNAL_CORRUPT = "worker_journal_corrupt"
    WORKER_SEQUENCE_GAP = "worker_sequence_gap"
    WORKER_CONTROLLED_ELSEWHERE = "worker_controlled_elsewhere"
    PROTOCOL_ERROR = "protocol_error"
    BAD_REQUEST = "bad_request"
    UNKNOWN_OP = "unknown_op"

    # workspace: per-issue directories, git worktrees and hooks
    WORKSPACE_ERROR = "workspace_error"
    WORKSPACE_EQUALS_ROOT = "workspace_equals_root"
    WORKSPACE_SYMLINK_ESCAPE = "workspace_symlink_escape"
    WORKSPACE_OUTSIDE_ROOT = "workspace_outside_root"
    WORKSPACE_PATH_UNREADABLE = "workspace_path_unreadable"
    WORKSPACE_IDENTIFIER_BLANK = "workspace_identifier_blank"
    WORKSPACE_CREATE_FAILED = "workspace_create_failed"
    WORKSPACE_MISSING = "workspace_missing"
    WORKSPACE_REMOVE_FAILED = "workspace_remove_failed"
    WORKSPACE_HOOK_FAILED = "workspace_hook_failed"
    WORKSPACE_HOOK_TIMEOUT = "workspace_hook_timeout"
    WORKSPACE_HOOK_INVALID_INPUT = "workspace_hook_invalid_input"
    WORKTREE_REPO_INVALID = "worktree_repo_invalid"
    WORKTREE_BASE_REF_INVALID = "worktree_base_ref_invalid"
    WORKTREE_GIT_FAILED = "worktree_git_failed"
    WORKTREE_DIRTY = "worktree_dirty"
    WORKTREE_FOREIGN = "worktree_foreign"

    # claims: the claim store and what the core restores from it
    CLAIM_STORE_ERROR = "claim_store_error"
    CLAIM_STORE_SCHEMA_UNSUPPORTED = "claim_store_schema_unsupported"
    CLAIM_STORE_UNREADABLE = "claim_store_unreadable"
    CLAIM_STORE_BUSY = "claim_store_busy"
    CLAIM_STORE_WRITE_FAILED = "claim_store_write_failed"
    CLAIM_REBIND_TOO_LARGE = "claim_rebind_too_large"
    CLAIM_GENERATION_STALE = "claim_generation_stale"
    CLAIM_OWNER_LOST = "claim_owner_lost"
    CLAIM_RECORD_INVALID = "claim_record_invalid"
    CLAIM_CHECKPOINT_INVALID = "claim_checkpoint_invalid"
    ORCHESTRATOR_ERROR = "orchestrator_error"
    ORCHESTRATOR_ALREADY_STARTED = "orchestrator_already_started"

    # daemon: leadership lease, control endpoint, attach commands
    LEADERSHIP_ERROR = "leadership_error"
    DAEMON_ALREADY_RUNNING = "daemon_already_running"
    DAEMON_RUNNING = "daemon_running"
    WORKFLOW_SHARES_TRACKER_PROJECT = "workflow_shares_tracker_project"
    DAEMON_LOCK_STALE = "daemon_lock_stale"
    DAEMON_LOCK_UNREADABLE = "daemon_lock_unreadable"
    DAEMON_LOCK_BUSY = "daemon_lock_busy"
    LEADERSHIP_LOST = "leadership_lost"
    DAEMON_ERROR = "daemon_error"
    DAEMON_ORPHANS_ALIVE = "daemon_orphans_alive"
    CONTROL_DIR_UNSAFE = "control_dir_unsafe"
    CONTROL_SOCKET_PATH_TOO_LONG = "control_socket_path_too_long"
    CONTROL_URL_INVALID = "control_url_invalid"
    DAEMON_NOT_RUNNING = "daemon_not_running"
    DAEMON_UNREACHABLE = "daemon_unreachable"
    DAEMON_REQUEST_FAILED = "daemon_request_failed"
    DAEMON_STOP_TIMEOUT = "daemon_stop_timeout"
    DAEMON_STARTING = "daemon_starting"

    # server: the HTTP API, dashboard and metrics of one host
    SERVER_BIND_FAILED = "server_bind_failed"
    SERVER_PORT_IN_USE = "server_port_in_use"
    SERVER_LISTENER_MISSING = "server_listener_missing"
    SERVER_SOCKET_PATH_TOO_LONG = "server_socket_path_too_long"
    SERVER_SOCKET_PATH_TAKEN = "server_socket_path_taken"
    SERVER_SOCKET_IN_USE = "server_socket_in_use"
    ROUTE_NOT_FOUND = "route_not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    ISSUE_NOT_FOUND = "issue_not_found"
    INVALID_REQUEST_BODY = "invalid_request_body"
    REQUEST_BODY_TOO_DEEP = "request_body_too_deep"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    HOST_NOT_ALLOWED = "host_not_allowed"
    CROSS_ORIGIN_REFUSED = "cross_origin_refused"
    AUTH_TOKEN_MISSING = "auth_token_missing"
    AUTH_TOKEN_INVALID = "auth_token_invalid"
    PEER_UID_REFUSED = "peer_uid_refused"
    ORCHESTRATOR_UNAVAILABLE = "orchestrator_unavailable"
    REQUEST_REJECTED = "request_rejected"
    INTERNAL_ERROR = "internal_error"
    DASHBOARD_NOT_INSTALLED = "dashboard_not_installed"
    DASHBOARD_ASSET_NOT_FOUND = "dashboard_asset_not_found"
    METRICS_WORKFLOW_LABEL_IN_USE = "metrics_workflow_label_in_use"
    SERVER_TOKEN_FILE_UNWRITABLE = "server_token_file_unwritable"

    # webhooks: tracker deliveries to the server's webhook route
    WEBHOOK_NOT_FOUND = "webhook_not_found"
    WEBHOOK_SIGNATURE_MISSING = "webhook_signature_missing"
    WEBHOOK_SIGNATURE_INVALID = "webhook_signature_invalid"
    WEBHOOK_STALE = "webhook_stale"
    WEBHOOK_REPLAYED = "webhook_replayed"
    WEBHOOK_BODY_TOO_LARGE = "webhook_body_too_large"
    WEBHOOK_BODY_TOO_DEEP = "webhook_body_too_deep"
    WEBHOOK_BODY_INVALID = "webhook_body_invalid"
    WEBHOOK_NOT_LED_HERE = "webhook_not_led_here"

    # operator: the Kubernetes operator, its API and the Pods of runs
    OPERATOR_ERROR = "operator_error"
    KUBE_API_ERROR = "kube_api_error"
    KUBE_CONFIG_MISSING = "kube_config_missing"
    INVALID_OPERATOR_SETTINGS = "invalid_operator_settings"
    CRDS_STALE = "crds_stale"
    LEASE_HELD_ELSEWHERE = "lease_held_elsewhere"
    SHARD_COUNT_MISMATCH = "shard_count_mismatch"
    TRACKER_SECRET_MISSING = "tracker_secret_missing"
    TRACKER_PATH_OUTSIDE_WORKFLOW = "tracker_path_outside_workflow"
    WORKFLOW_DIR_UNUSABLE = "workflow_dir_unusable"
    WORKFLOW_RELOAD_FAILED = "workflow_reload_failed"
    START_FAILED = "start_failed"
    WORKFLOW_NOT_FOUND = "workflow_not_found"
    WORKFLOW_NOT_LED_HERE = "workflow_not_led_here"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    AUTH_UNAVAILABLE = "auth_unavailable"
    WORKER_IMAGE_MISSING = "worker_image_missing"
    POD_START_TIMEOUT = "pod_start_timeout"
    LOCAL_RUNS_FORBIDDEN = "local_runs_forbidden"
    POD_REFUSED = "pod_refused"
    POD_SPEC_TOO_LARGE = "pod_spec_too_large"
    POD_NAME_TAKEN = "pod_name_taken"
    POD_SERVICE_ACCOUNT_REFUSED = "pod_service_account_refused"
    POD_SERVICE_ACCOUNT_FAILED = "pod_service_account_failed"
    POD_NETWORK_POLICY_FAILED = "pod_network_policy_failed"
    POD_WORKSPACE_TERMINATING = "pod_workspace_terminating"
    NETWORK_POLICY_NOT_ENFORCED = "network_policy_not_enforced"
    NETWORK_POLICY_PROBE_FAILED = "network_policy_probe_failed"

    # general
    LORENZ_ERROR = "lorenz_error"

    @property
    def doc(self) -> CodeDoc:
        """This code's entry in :data:`CODE_DOCS`."""
        from lorenz.codes.catalog import CODE_DOCS

        return CODE_DOCS[self]


class Area(enum.StrEnum):
    """The part of Lorenz a code comes from: one section of ``docs/errors.md`` each."""

    CONFIG = "config"
    TRACKER = "tracker"
    AGENT = "agent"
    RUN = "run"
    BUDGET = "budget"
    WORKER = "worker"
    WORKSPACE = "workspace"
    CLAIMS = "claims"
    DAEMON = "daemon"
    SERVER = "server"
    WEBHOOKS = "webhooks"
    OPERATOR = "operator"
    GENERAL = "general"


class Kind(enum.StrEnum):
    """Whether a code is an error something raised, or the way a run ended."""

    ERROR = "error"
    """A command, a request, a start-up or a reload failed; the message says what to fix."""
    OUTCOME = "outcome"
    """A run ended (or was skipped) with this code: its ``last_error`` starts with it, and the
    retry policy decides what happens next (retry, block, compensate)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CodeDoc:
    """What the docs say about one code."""

    area: Area
    meaning: str
    """One line: what happened."""
    action: str
    """One line: what the user does about it."""
    kind: Kind = Kind.ERROR


if TYPE_CHECKING:
    from lorenz.codes.catalog import CODE_DOCS as CODE_DOCS


def __getattr__(name: str) -> Any:
    """``CODE_DOCS``, the docs table, loaded on first use.

    NB: every process imports the codes, but only the docs generator (and its tests) reads the
    table: its text and records were ~0.1 MiB of every controller's memory and of the image
    each forked worker shares (issue #35). ``from lorenz.codes import CODE_DOCS`` still works.
    """
    if name == "CODE_DOCS":
        from lorenz.codes.catalog import CODE_DOCS

        return CODE_DOCS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
