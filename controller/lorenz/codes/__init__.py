"""Every error code Lorenz reports, in one place, with what it means and what the user does.

A code is part of the product's interface: ``lorenz validate`` prints it, the API answers with
it, a Kubernetes condition carries it as its reason, a run's ``last_error`` starts with it, and
decisions (retry, block, poison a worker host) compare against it. So codes are written once,
here, as :class:`ErrorCode` members, and every raise site names a member instead of spelling
the string again. ``docs/errors.md`` is rendered from :data:`CODE_DOCS`
(:func:`lorenz.codes.docs.render_error_docs`) and a test keeps it current.

:class:`ErrorCode` is a :class:`enum.StrEnum`: a member *is* its string (it compares equal to
it, hashes like it, formats and JSON-encodes as it), so code that reads codes back from storage
or from the wire as plain strings keeps working unchanged.

NB: this module imports nothing of Lorenz. Even ``lorenz.config`` (which sits beside
``lorenz.model`` in the layers) may import it, to raise its validation errors under their codes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final


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

    # general
    LORENZ_ERROR = "lorenz_error"

    @property
    def doc(self) -> CodeDoc:
        """This code's entry in :data:`CODE_DOCS`."""
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


def _config(meaning: str, action: str) -> CodeDoc:
    return CodeDoc(area=Area.CONFIG, meaning=meaning, action=action)


def _tracker(meaning: str, action: str) -> CodeDoc:
    return CodeDoc(area=Area.TRACKER, meaning=meaning, action=action)


def _agent(meaning: str, action: str) -> CodeDoc:
    return CodeDoc(area=Area.AGENT, meaning=meaning, action=action, kind=Kind.OUTCOME)


def _run(meaning: str, action: str, *, kind: Kind = Kind.OUTCOME) -> CodeDoc:
    return CodeDoc(area=Area.RUN, meaning=meaning, action=action, kind=kind)


def _budget(meaning: str, action: str, *, kind: Kind = Kind.ERROR) -> CodeDoc:
    return CodeDoc(area=Area.BUDGET, meaning=meaning, action=action, kind=kind)


def _worker(meaning: str, action: str, *, kind: Kind = Kind.ERROR) -> CodeDoc:
    return CodeDoc(area=Area.WORKER, meaning=meaning, action=action, kind=kind)


def _workspace(meaning: str, action: str) -> CodeDoc:
    return CodeDoc(area=Area.WORKSPACE, meaning=meaning, action=action)


def _claims(meaning: str, action: str) -> CodeDoc:
    return CodeDoc(area=Area.CLAIMS, meaning=meaning, action=action)


def _daemon(meaning: str, action: str) -> CodeDoc:
    return CodeDoc(area=Area.DAEMON, meaning=meaning, action=action)


def _server(meaning: str, action: str) -> CodeDoc:
    return CodeDoc(area=Area.SERVER, meaning=meaning, action=action)


def _webhooks(meaning: str, action: str) -> CodeDoc:
    return CodeDoc(area=Area.WEBHOOKS, meaning=meaning, action=action)


def _operator(meaning: str, action: str, *, kind: Kind = Kind.ERROR) -> CodeDoc:
    return CodeDoc(area=Area.OPERATOR, meaning=meaning, action=action, kind=kind)


_C = ErrorCode

CODE_DOCS: Final[Mapping[ErrorCode, CodeDoc]] = MappingProxyType({
    # -- config --------------------------------------------------------------------------------
    _C.WORKFLOW_ERROR: _config(
        "Base code of the workflow's configuration errors; seen only when no narrower code fits.",
        "Read the message and fix the key it names; the CLI exits 2 on it.",
    ),
    _C.MISSING_WORKFLOW_FILE: _config(
        "The workflow file cannot be read (absent, a directory, no permission).",
        "Pass the path of a readable WORKFLOW.md.",
    ),
    _C.WORKFLOW_PARSE_ERROR: _config(
        "The file is not UTF-8 text, or its YAML front matter is not valid YAML.",
        "Fix the YAML at the line the message names; save the file as UTF-8.",
    ),
    _C.WORKFLOW_TOO_LARGE: _config(
        "The workflow file is larger than 1 MiB; it is not parsed.",
        "Shorten the file (move long text out of the prompt).",
    ),
    _C.WORKFLOW_TOO_COMPLEX: _config(
        "The front matter nests deeper than 64 levels or expands (YAML aliases) to more than "
        "100,000 values.",
        "Flatten the front matter; do not build it from nested aliases.",
    ),
    _C.WORKFLOW_LOAD_TIMEOUT: _config(
        "Loading the workflow took longer than 10 s; the last good workflow stays in force.",
        "Simplify the front matter and check the file system it is on; save it again.",
    ),
    _C.WORKFLOW_FRONT_MATTER_NOT_A_MAP: _config(
        "The front matter is valid YAML but not a mapping (a list, a string, a number).",
        "Write the front matter as `key: value` lines between the `---` markers.",
    ),
    _C.TEMPLATE_PARSE_ERROR: _config(
        "The prompt body is not a valid Liquid template; the run attempt fails.",
        "Fix the Liquid syntax at the place the message names.",
    ),
    _C.TEMPLATE_RENDER_ERROR: _config(
        "Rendering the prompt failed (unknown variable or filter, bad filter argument); the "
        "run attempt fails.",
        "Use only the variables and filters docs/configuration.md lists.",
    ),
    _C.INVALID_WORKFLOW_CONFIG: _config(
        "The front matter (or a flag value) does not fit the configuration schema.",
        "Fix the key the message names (`lorenz validate` lists every problem).",
    ),
    _C.FLAG_ONLY_SECTION: _config(
        "A flag-only section (`claim_store`, `daemon`) was written directly in the front "
        "matter.",
        "Move it under `flags:`, or pass it as `--flag` / `LORENZ_FLAG_*`.",
    ),
    _C.UNKNOWN_FLAG: _config(
        "A flag key (CLI, front matter `flags:` or `LORENZ_FLAG_*`) is not a known flag.",
        "Check the spelling against docs/configuration.md's flag list.",
    ),
    _C.UNKNOWN_FEATURE: _config(
        "A feature name (CLI, front matter `features:` or `LORENZ_FEATURE_*`) is unknown.",
        "Use a feature docs/configuration.md lists.",
    ),
    _C.INVALID_FLAG_SYNTAX: _config(
        "A `--flag` argument is not `key=value`.",
        "Write it as `--flag key=value`.",
    ),
    _C.INVALID_FEATURE_VALUE: _config(
        "A `LORENZ_FEATURE_*` variable is neither truthy (1/true/yes/on) nor falsy "
        "(0/false/no/off).",
        "Set the variable to one of those values or unset it.",
    ),
    _C.UNSUPPORTED_TRACKER_KIND: _config(
        "`tracker.kind` names no tracker adapter this build ships.",
        "Set `tracker.kind` to linear, github, gitlab, jira, files or memory.",
    ),
    _C.MISSING_TRACKER_KIND: _config(
        "No `tracker.kind`: nothing can be dispatched.",
        "Set `tracker.kind`.",
    ),
    _C.MISSING_TRACKER_API_KEY: _config(
        "A linear, github, gitlab or jira tracker has no API token after `$VAR` and fallback "
        "resolution.",
        "Set `tracker.api_key`, or `LINEAR_API_KEY` / `GITHUB_TOKEN` / `GITLAB_TOKEN` / "
        "`JIRA_API_TOKEN` in the environment.",
    ),
    _C.MISSING_TRACKER_PROJECT_SLUG: _config(
        "A linear, gitlab or jira tracker has no `tracker.project_slug`.",
        "Set it to the Linear project's `slugId`, the GitLab project's path or id, or the Jira "
        "project key.",
    ),
    _C.MISSING_TRACKER_REPOSITORY: _config(
        "A github tracker has no `tracker.repository`.",
        "Set `tracker.repository` to `owner/name`.",
    ),
    _C.MISSING_TRACKER_PATH: _config(
        "A files tracker has no `tracker.path`.",
        "Set `tracker.path` to the folder of issue files.",
    ),
    _C.MISSING_AGENT_COMMAND: _config(
        "The selected agent kind has a blank `command`.",
        "Set `agents.<kind>.command`.",
    ),
    _C.UNKNOWN_AGENT_KIND: _config(
        "A setting (`agent.kind`, `agent.concurrency`, `agent.kind_by_label`, "
        "`agent.kind_by_state`) names an agent kind `agents` does not define; a run dispatched "
        "with a kind a reload removed fails with it too.",
        "Define `agents.<kind>` or name a kind that is defined; a failed run is retried with "
        "the kind the workflow chooses now.",
    ),
    _C.SSH_CLIENT_MISSING: _config(
        "`worker.ssh_hosts` is set, but there is no `ssh` program on this machine's PATH.",
        "Install the OpenSSH client, or remove `worker.ssh_hosts`.",
    ),
    _C.SSH_WORKTREE_UNSUPPORTED: _config(
        "`worker.ssh_hosts` is set with `workspace.kind: worktree`; remote workspaces are plain "
        "directories.",
        "Use `workspace.kind: directory` and clone in `hooks.after_create`.",
    ),
    _C.RETRY_BACKOFF_ALIAS_CONFLICT: _config(
        "`agent.max_retry_backoff_ms` (an alias) and `retry.backoff.max_ms` are both set, to "
        "different values.",
        "Keep only `retry.backoff.max_ms`.",
    ),
    _C.RETRY_CANCEL_STATE_ACTIVE: _config(
        "`retry.cancel_state` is one of `tracker.active_states`, so a cancelled issue would run "
        "again.",
        "Name a state outside `tracker.active_states`.",
    ),
    _C.INPUT_WAITING_STATE_INACTIVE: _config(
        "`input.waiting_state` is not one of `tracker.active_states`, so a waiting issue would "
        "leave the candidates and its slot would be released.",
        "Add the state to `tracker.active_states`, or unset `input.waiting_state`.",
    ),
    _C.RETRY_CANCEL_STATE_MISSING: _config(
        "`retry.terminal_action: cancel` without `retry.cancel_state`.",
        "Set `retry.cancel_state` to the state to move the issue to.",
    ),
    _C.RETRY_ESCALATION_EMPTY: _config(
        "`retry.escalate` asks for neither a comment nor a label.",
        "Set `retry.escalate.comment: true` or a `retry.escalate.label`.",
    ),
    _C.RETRY_ESCALATION_LABEL_REQUIRED: _config(
        "`retry.escalate.label` is one of `tracker.required_labels`.",
        "Pick another escalation label.",
    ),
    _C.WORKER_DETACHED_FALSE: _config(
        "`worker.detached: false` is refused: runs always execute in detached workers.",
        "Delete `worker.detached` or set it to `true`.",
    ),
    _C.WORKER_POD_SETTINGS_UNUSED: _config(
        "Pod settings are given while `worker.kind` is not `pod`.",
        "Set `worker.kind: pod`, or remove the Pod settings.",
    ),
    _C.WORKER_KIND_CONFLICT: _config(
        "`worker.kind: pod` (the operator's default) next to settings only local or SSH workers "
        "use (`workspace.kind: worktree`, `ssh_hosts`, `detached`).",
        "Remove those settings (clone in `hooks.after_create`), or set `worker.kind: local`.",
    ),
    _C.WORKER_POD_VALUE_INVALID: _config(
        "A Pod setting holds a value Kubernetes would refuse (a name, a quantity, a "
        "toleration) or one that overrides Lorenz's own paths.",
        "Fix the value at the key the message names.",
    ),
    # -- tracker -------------------------------------------------------------------------------
    _C.TRACKER_ERROR: _tracker(
        "Base code of tracker request failures; seen only when no narrower code fits.",
        "Read the message; it names the request that failed.",
    ),
    _C.INVALID_TRACKER_CONFIG: _tracker(
        "A `tracker.provider` key is unknown to this tracker kind or has a bad value.",
        "Fix or remove the key `key_path` names.",
    ),
    _C.INVALID_TRACKER_REPOSITORY: _tracker(
        "`tracker.repository` is not `owner/name`.",
        "Write it like `octo/app`.",
    ),
    _C.MEMORY_TRACKER_NEEDS_INSTANCE: _tracker(
        "`tracker.kind: memory` has no issues of its own; it is built only from a "
        "`MemoryTracker` object.",
        "Pass a `MemoryTracker` to `build_tracker` (tests, benchmarks), or choose another kind.",
    ),
    _C.TRACKER_CLOSED: _tracker(
        "A request was made on a Linear, GitHub, GitLab or Jira tracker after it was closed.",
        "Build a new tracker from the settings (a bug if Lorenz itself did this).",
    ),
    _C.TRACKER_REQUEST: _tracker(
        "The memory tracker's injected failure (tests and benchmarks); retryable.",
        "Nothing: it clears by itself.",
    ),
    _C.TRACKER_STATE_NOT_FOUND: _tracker(
        "The issue's Linear team has no workflow state named like `retry.cancel_state`, or no "
        "Jira transition leads the issue there.",
        "Set `retry.cancel_state` to a state the issue can reach (the message lists them).",
    ),
    _C.LINEAR_API_REQUEST: _tracker(
        "A Linear request failed in transport (connect, timeout, dropped connection); "
        "retryable.",
        "Check the network; Lorenz retries on the next poll.",
    ),
    _C.LINEAR_API_STATUS: _tracker(
        "Linear answered with an HTTP status other than 200 (retryable for 5xx); the message "
        "carries the body.",
        "401: check `tracker.api_key`; 5xx: wait, Lorenz retries.",
    ),
    _C.LINEAR_GRAPHQL_ERRORS: _tracker(
        "Linear's response holds an `errors` array.",
        "Read the GraphQL errors in the message; check the project slug and the key's access.",
    ),
    _C.LINEAR_UNKNOWN_PAYLOAD: _tracker(
        "Linear's answer is not the expected shape (not JSON, no `data`, no issue list or "
        "`pageInfo`, a malformed record).",
        "Retry later; if it persists, report it with the message (the API may have changed).",
    ),
    _C.LINEAR_MISSING_END_CURSOR: _tracker(
        "Linear said `hasNextPage: true` without an `endCursor`; retryable.",
        "Nothing: the next poll asks again.",
    ),
    _C.LINEAR_RATE_LIMITED: _tracker(
        "Linear rate-limited the key beyond the bounded wait; `retry_after_ms` says when to "
        "come back.",
        "Wait, poll less often (`polling.interval_ms`), or use a key of its own.",
    ),
    _C.LINEAR_WRITE_FAILED: _tracker(
        "Linear did not apply a write (a state change, a comment, a label).",
        "Check that the API key may write to the team's issues.",
    ),
    _C.MISSING_LINEAR_VIEWER_IDENTITY: _tracker(
        "`tracker.assignee: me` is set but Linear's `viewer { id }` came back empty.",
        "Set `tracker.assignee` to a user id instead of `me`.",
    ),
    _C.INVALID_GRAPHQL_OPERATION: _tracker(
        "A `linear_graphql` tool call's document does not parse or does not hold exactly one "
        "operation.",
        "Send one GraphQL query or mutation per call.",
    ),
    _C.GITHUB_API_REQUEST: _tracker(
        "A GitHub request failed in transport (connect, timeout, dropped connection); "
        "retryable.",
        "Check the network; Lorenz retries on the next poll.",
    ),
    _C.GITHUB_API_STATUS: _tracker(
        "GitHub answered with an unexpected HTTP status (retryable for 5xx).",
        "401/403: check the token and its access; 404: check `tracker.repository`.",
    ),
    _C.GITHUB_UNKNOWN_PAYLOAD: _tracker(
        "GitHub's answer is not the expected shape (not JSON, a listing that is not a list, a "
        "malformed issue).",
        "Retry later; if it persists, report it with the message.",
    ),
    _C.GITHUB_RATE_LIMITED: _tracker(
        "GitHub's primary or secondary rate limit lasts beyond the bounded wait; "
        "`retry_after_ms` says when to come back.",
        "Wait, poll less often (`polling.interval_ms`), or use a token of its own.",
    ),
    _C.MISSING_GITHUB_VIEWER_IDENTITY: _tracker(
        "`tracker.assignee: me` is set but GitHub's `GET /user` returned no login.",
        "Set `tracker.assignee` to a login instead of `me`.",
    ),
    _C.FILES_FOLDER_MISSING: _tracker(
        "`tracker.path` does not exist or is not a folder.",
        "Create the folder or point `tracker.path` at it.",
    ),
    _C.FILES_FOLDER_UNREADABLE: _tracker(
        "The issue folder cannot be listed (permissions); retryable.",
        "Fix the folder's permissions.",
    ),
    _C.FILES_MALFORMED_ISSUE: _tracker(
        "An issue file is malformed (read by id), or has no front matter (`set-state`).",
        "Fix the file the message names.",
    ),
    _C.FILES_ISSUE_NOT_FOUND: _tracker(
        "`set-state` found no issue file with that path, id, identifier or stem.",
        "Pass a file path, or an existing id or identifier with the folder.",
    ),
    _C.FILES_INVALID_STATE: _tracker(
        "`set-state` was given a blank state.",
        "Pass the state to write.",
    ),
    _C.INVALID_TRACKER_ENDPOINT: _tracker(
        "`tracker.endpoint` of a gitlab or jira tracker is not an `http(s)://host[/path]` URL "
        "(no query, no fragment).",
        "Write the instance or site URL, like `https://gitlab.example.com` or "
        "`https://example.atlassian.net`.",
    ),
    _C.INVALID_TRACKER_PROJECT_SLUG: _tracker(
        "`tracker.project_slug` is not a GitLab project path or numeric id, or not a Jira "
        "project key (letters, digits, `_`).",
        "Write `group/app` or `42` for GitLab, `ENG` (not `ENG-1`) for Jira.",
    ),
    _C.MISSING_TRACKER_EMAIL: _tracker(
        "A jira tracker has no account email after `$VAR` and fallback resolution.",
        "Set `tracker.email` or `JIRA_EMAIL` to the account the API token belongs to.",
    ),
    _C.MISSING_TRACKER_ENDPOINT: _tracker(
        "A jira tracker has no `tracker.endpoint`: Jira has no default site.",
        "Set `tracker.endpoint` to the site URL, like `https://example.atlassian.net`.",
    ),
    _C.GITLAB_API_REQUEST: _tracker(
        "A GitLab request failed in transport (connect, timeout, dropped connection); "
        "retryable.",
        "Check the network; Lorenz retries on the next poll.",
    ),
    _C.GITLAB_API_STATUS: _tracker(
        "GitLab answered with an unexpected HTTP status (retryable for 5xx); the message "
        "carries GitLab's `message`/`error` text.",
        "401/403: check the token and its scope; 404: check `tracker.project_slug`.",
    ),
    _C.GITLAB_UNKNOWN_PAYLOAD: _tracker(
        "GitLab's answer is not the expected shape (not JSON, a listing that is not a list, a "
        "next-page link off the instance, a malformed issue).",
        "Check `tracker.endpoint`; if it persists, report it with the message.",
    ),
    _C.GITLAB_TOO_MANY_PAGES: _tracker(
        "A GitLab listing has more pages than `tracker.provider.max_pages`.",
        "Narrow the states or labels polled, or raise `tracker.provider.max_pages`.",
    ),
    _C.GITLAB_RESPONSE_TOO_LARGE: _tracker(
        "A GitLab response body is larger than `tracker.provider.max_response_bytes`.",
        "Raise `tracker.provider.max_response_bytes`, or check `tracker.endpoint`.",
    ),
    _C.GITLAB_RATE_LIMITED: _tracker(
        "GitLab answered 429 (or a spent `RateLimit-Remaining`) beyond the bounded wait; "
        "`retry_after_ms` says when to come back.",
        "Wait, poll less often (`polling.interval_ms`), or use a token of its own.",
    ),
    _C.GITLAB_STATES_NEED_LABEL_SCOPE: _tracker(
        "Without `tracker.provider.state_label_scope` a GitLab issue is only opened or closed, "
        "so an active state other than `opened` is never reached.",
        "Set `tracker.provider.state_label_scope` (e.g. `status`), or `active_states: [opened]`.",
    ),
    _C.GITLAB_STATE_UNREACHABLE: _tracker(
        "A state change (`cancel`) names a state GitLab cannot set without "
        "`tracker.provider.state_label_scope` (only `opened` and terminal states).",
        "Set a state label scope, or `retry.cancel_state` to a terminal state.",
    ),
    _C.MISSING_GITLAB_VIEWER_IDENTITY: _tracker(
        "`tracker.assignee: me` is set but GitLab's `GET /user` returned no username.",
        "Set `tracker.assignee` to a username instead of `me`.",
    ),
    _C.GITLAB_API_METHOD_REFUSED: _tracker(
        "A `gitlab_api` tool call used a method outside `tracker.provider.api_methods`; "
        "nothing was sent.",
        "Use an allowed method, or allow it in `tracker.provider.api_methods`.",
    ),
    _C.GITLAB_API_PATH_REFUSED: _tracker(
        "A `gitlab_api` tool call's path is not under the tracker's own project (or names "
        "`/projects` or `/users` itself); nothing was sent.",
        "Call a path relative to the project, like `issues/7/notes`.",
    ),
    _C.GITLAB_API_BODY_REFUSED: _tracker(
        "A `gitlab_api` tool call sent a body on GET/DELETE, or one carrying `sudo` or a "
        "credential; nothing was sent.",
        "Drop the body (or its `sudo`/credential fields): calls run as the tracker's token.",
    ),
    _C.GITLAB_API_BODY_TOO_LARGE: _tracker(
        "A `gitlab_api` tool call's body is larger than 1 MiB; nothing was sent.",
        "Send a smaller body.",
    ),
    _C.GITLAB_API_QUERY_INVALID: _tracker(
        "A `gitlab_api` tool call's `query` is not an object of scalars (or lists of them), or "
        "names a refused parameter such as `sudo`; nothing was sent.",
        "Pass plain query parameters only.",
    ),
    _C.JIRA_API_REQUEST: _tracker(
        "A Jira request failed in transport (connect, timeout, dropped connection); "
        "retryable.",
        "Check the network; Lorenz retries on the next poll.",
    ),
    _C.JIRA_API_STATUS: _tracker(
        "Jira answered with an unexpected HTTP status (retryable for 5xx); the message "
        "carries Jira's `errorMessages`.",
        "401: check the email and token; 403: the project's permissions; 400/404: the project "
        "key or site.",
    ),
    _C.JIRA_UNKNOWN_PAYLOAD: _tracker(
        "Jira's answer is not the expected shape (not JSON, no `issues`/`transitions`/"
        "`comments` list, a repeated page token, a malformed issue); retryable.",
        "Check `tracker.endpoint`; if it persists, report it with the message.",
    ),
    _C.JIRA_ISSUE_ERRORS: _tracker(
        "Jira's bulk fetch answered `issueErrors` for some of the ids asked for; retryable.",
        "Nothing: Lorenz asks again on the next tick; check the issues' permissions if it "
        "repeats.",
    ),
    _C.JIRA_TOO_MANY_PAGES: _tracker(
        "A Jira state scan ran past `tracker.provider.max_pages` pages.",
        "Narrow `tracker.provider.jql`, or raise `tracker.provider.max_pages`.",
    ),
    _C.JIRA_RESPONSE_TOO_LARGE: _tracker(
        "A Jira response (or a `jira_rest` answer) exceeded its byte bound.",
        "Raise `tracker.provider.max_response_bytes`, or ask the `jira_rest` call for less.",
    ),
    _C.JIRA_RATE_LIMITED: _tracker(
        "Jira answered 429 (or 503 with `Retry-After`) beyond the bounded wait; "
        "`retry_after_ms` says when to come back.",
        "Wait, poll less often (`polling.interval_ms`), or use a token of its own.",
    ),
    _C.MISSING_JIRA_VIEWER_IDENTITY: _tracker(
        "`tracker.assignee: me` is set but Jira's `GET /myself` returned no `accountId`.",
        "Set `tracker.assignee` to an account id instead of `me`.",
    ),
    _C.INVALID_JIRA_LABEL: _tracker(
        "`retry.escalate.label` has a space, which a Jira label cannot hold.",
        "Set `retry.escalate.label` to a label without spaces.",
    ),
    _C.INVALID_JIRA_REST_CALL: _tracker(
        "A `jira_rest` tool call was refused before any request (its method, path, body or "
        "query); the message says why.",
        "Fix the call as the message says.",
    ),
    # -- agent ---------------------------------------------------------------------------------
    _C.AGENT_RUN_FAILED: _agent(
        "Base code of a failed agent run; seen only when no narrower code fits.",
        "Read the message and the agent's stderr in the run's log.",
    ),
    _C.AGENT_PROTOCOL_UNAVAILABLE: _agent(
        "`agents.<kind>.protocol` names no runner, or its runner is not in this build.",
        "Pick a protocol docs/agents.md lists.",
    ),
    _C.AGENT_SPAWN_FAILED: _agent(
        "The agent command could not be started (the workspace is missing, or bash is not "
        "installed).",
        "Check that the workspace exists and bash is installed on the worker's host.",
    ),
    _C.AGENT_EXITED: _agent(
        "The agent process exited before the run finished (non-zero for `command`, at any "
        "time for the others); the message quotes its status and stderr.",
        "Status 127 is command not found: check `agents.<kind>.command`; otherwise read the "
        "stderr.",
    ),
    _C.AGENT_LINE_TOO_LONG: _agent(
        "The agent wrote a stdout line over 16 MB; the rest of the line was discarded "
        "(reported as an event, the run goes on).",
        "Nothing, unless the agent's output is broken; then fix the agent command.",
    ),
    _C.READ_TIMEOUT: _agent(
        "The agent did not answer a protocol request within `read_timeout_ms`.",
        "Check that the command really speaks the protocol (`codex app-server`, an ACP "
        "agent), or raise `agents.<kind>.read_timeout_ms`.",
    ),
    _C.HANDSHAKE_FAILED: _agent(
        "The agent refused the session set-up (`initialize`, `thread/start`, `session/new`), "
        "asked for authentication, or speaks another protocol version.",
        "Check the agent's command, version, sandbox/approval values and login.",
    ),
    _C.STARTUP_TIMEOUT: _agent(
        "The agent did not read its first request (`initialize`) within `startup_timeout_ms` "
        "of being spawned (codex, acp).",
        "Check that the command starts the agent; raise `agents.<kind>.startup_timeout_ms` if "
        "its login shell is slow.",
    ),
    _C.AGENT_PROTOCOL_ERROR: _agent(
        "The agent sent a payload the protocol does not allow (no thread, turn or session id; "
        "an invalid ACP message).",
        "Use an agent release that speaks the protocol Lorenz speaks; check the command.",
    ),
    _C.AGENT_OVERLOADED: _agent(
        "The Codex server kept refusing a request as overloaded (`-32001`).",
        "Nothing: the run is retried later; lower concurrency if it repeats.",
    ),
    _C.TURN_FAILED: _agent(
        "The agent reported the turn failed (an error result, a refused `turn/start`, an error "
        "answer to `session/prompt`).",
        "Read the agent's message; fix the prompt, the model settings or the agent's account.",
    ),
    _C.TURN_TIMEOUT: _agent(
        "A turn (for `command`: the whole run) took longer than `turn_timeout_ms`; the agent "
        "was stopped.",
        "Raise `agents.<kind>.turn_timeout_ms` if turns legitimately take longer.",
    ),
    _C.TURN_INTERRUPTED: _agent(
        "The agent ended the turn as interrupted or cancelled without Lorenz asking.",
        "See the agent's logs for who interrupted it.",
    ),
    _C.TURN_REFUSED: _agent(
        "The agent refused to continue (ACP `stopReason: refusal`).",
        "Rephrase the issue or the prompt template.",
    ),
    _C.MAX_TURNS_REACHED: _agent(
        "Claude used all of its `--max-turns` agentic turns in one turn.",
        "Raise `agent.max_turns`, or put a larger `--max-turns` in the command.",
    ),
    _C.INPUT_REQUIRED: _agent(
        "The agent asked for user input: the slot waits for an answer (the `waiting` lane; no "
        "retry, no failure counted) and the question is posted on the issue.",
        "Answer it: a reply on the issue, `lorenz answer`, the API or the dashboard "
        "(docs/questions.md).",
    ),
    # -- run -----------------------------------------------------------------------------------
    _C.RUN_ABORTED: _run(
        "Lorenz stopped the run (stalled, canceled by reconciliation or a deleted Claim, "
        "shutdown, leadership lost); the text says which.",
        "Nothing: the slot is retried or released as the reason requires.",
    ),
    _C.ISSUE_FIELD_INVALID: _run(
        "The issue was not dispatched: one of its fields holds a NUL byte, which cannot be "
        "passed to hooks or agents.",
        "Edit the issue to remove the NUL byte.",
    ),
    _C.RESERVATION_LOST: _run(
        "The slot's reservation was given up while its worker started.",
        "Nothing: the slot is dispatched again.",
    ),
    _C.PLACEMENT_FAILED: _run(
        "The run could not be placed (its Pod unscheduled, its image not pulled, a quota); "
        "nothing started, so its reservation is given back and no attempt is counted; dispatch "
        "pauses (one probe run at a time) until a run is placed again.",
        "Read the reason (Kubernetes' words); fix the Pod template or wait for room.",
    ),
    _C.TERMINAL_ACTION_FAILED: _run(
        "A blocked slot's terminal action (`escalate`, `cancel`) failed; it is kept and tried "
        "again.",
        "Read the error it shows; check the tracker's access and the action's settings.",
        kind=Kind.ERROR,
    ),
    _C.TERMINAL_ACTION_UNSUPPORTED: _run(
        "The tracker cannot apply the configured terminal action, or `cancel` has no "
        "`retry.cancel_state` any more.",
        "Use `retry.terminal_action: block`, or set `retry.cancel_state`.",
        kind=Kind.ERROR,
    ),
    _C.ISSUE_NOT_WAITING: _run(
        "An answer was given for an issue none of whose slots waits for one (never asked, "
        "answered already, or released).",
        "Check `lorenz status` (the waiting lane) and the identifier.",
        kind=Kind.ERROR,
    ),
    _C.ANSWER_INVALID: _run(
        "An answer was empty, longer than 20000 characters, or not text.",
        "Send the answer as non-empty text (`--text`, or `{\"text\": ...}`).",
        kind=Kind.ERROR,
    ),
    _C.QUESTION_CHANNEL_UNSUPPORTED: _run(
        "The tracker cannot carry questions (no comments), so a waiting slot's question is only "
        "shown, not posted.",
        "Answer with `lorenz answer`, the API or the dashboard.",
        kind=Kind.ERROR,
    ),
    _C.QUESTION_POST_FAILED: _run(
        "Posting a waiting slot's question (or reading the replies, or its waiting state or "
        "label) failed; it is tried again on the next poll.",
        "Read the error; check the tracker's access.",
        kind=Kind.ERROR,
    ),
    # -- budget -------------------------------------------------------------------------------
    _C.PRICING_INVALID: _budget(
        "A `pricing` entry (or the shipped price table) is malformed: not a map, a missing "
        "`input`/`output`, an unknown price kind, a price that is not a number, negative or over "
        "100000 USD per million tokens, an empty glob, more than 1000 entries.",
        "Fix the entry the key path names.",
    ),
    _C.MODEL_UNPRICED: _budget(
        "A warning: a dollar cap is set and an agent kind's command names a model no price "
        "matches; its tokens still count against token caps.",
        "Add the model under `pricing`.",
    ),
    _C.BUDGET_CANCEL_STATE_MISSING: _budget(
        "`budget.on_exhausted: cancel` without `retry.cancel_state`.",
        "Set `retry.cancel_state` to the state to move the issue to.",
    ),
    _C.BUDGET_EXHAUSTED: _budget(
        "A token or dollar cap was reached during the run; the agent was stopped. Not "
        "retried: `budget.on_exhausted` runs once.",
        "Raise the cap in `budget` (a reload applies it), or wait for the day to turn.",
        kind=Kind.OUTCOME,
    ),
    # -- worker --------------------------------------------------------------------------------
    _C.WORKER_NEVER_STARTED: _worker(
        "The run's controller was lost while launching its worker, and no trace of the worker "
        "exists.",
        "Nothing: compensated, the same attempt runs again after 1 s, no failure counted.",
        kind=Kind.OUTCOME,
    ),
    _C.SPAWN_INTENT_FAILED: _worker(
        "The run's spawn intent could not be written to the claim store; no worker was "
        "started.",
        "Check the claim store (the message quotes its error); the run is retried.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_GONE: _worker(
        "The worker ended without a final record (killed, crashed, its host rebooted).",
        "Nothing: the run is retried as a failure; check the host if it repeats.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_UNKNOWN: _worker(
        "The worker's fate cannot be proven (its host or socket does not answer); the slot is "
        "quarantined.",
        "Check the worker's host; the worker is probed again until it answers or ends.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_LAUNCH_FAILED: _worker(
        "The worker command could not be run, or exited before it reported ready; counted "
        "against no retry budget, and dispatch pauses until a probe run's worker starts.",
        "Check the worker command, the output the message quotes and the worker state root "
        "(full, read-only?); dispatch resumes by itself.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_LAUNCH_TIMEOUT: _worker(
        "Starting the worker took longer than the launch bound (a loaded host, a stopped "
        "launcher); counted against no retry budget, and dispatch pauses until a probe run's "
        "worker starts.",
        "Check the host's load and the launcher process; the run is retried and dispatch "
        "resumes by itself.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_START_FAILED: _worker(
        "The worker exited before it was ready, or its Pod ended or was deleted before the "
        "worker served.",
        "Read the worker's log (the message names it) or the Pod's status.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_HOST_UNREACHABLE: _worker(
        "An SSH worker host could not be reached.",
        "Check that the host is up and `ssh` to it works without a prompt.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_HOST_INVALID: _worker(
        "A `worker.ssh_hosts` entry is not `host`, `host:port` or `[v6]:port`.",
        "Fix the `worker.ssh_hosts` entry.",
    ),
    _C.WORKER_KIND_UNAVAILABLE: _worker(
        "`worker.kind: pod` outside the operator, where nothing places runs in Pods.",
        "Use `worker.kind: local` on a single host.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_STATE_ERROR: _worker(
        "Base code of worker state-directory errors; seen only when no narrower code fits.",
        "Read the message; it names the state directory.",
    ),
    _C.WORKER_SPEC_INVALID: _worker(
        "The run spec cannot be read or does not validate (too large, another lorenz version).",
        "Run the same lorenz version on the controller and the worker hosts.",
    ),
    _C.WORKER_SOCKET_PATH_TOO_LONG: _worker(
        "The worker's control socket path would exceed the 107-byte unix socket limit.",
        "Use a shorter worker state root (`LORENZ_WORKER_STATE`).",
    ),
    _C.WORKER_STATE_ROOT_TOO_LONG: _worker(
        "The state root is too long for sockets and no safe short link to it can be made "
        "(`/tmp/lorenz-<uid>` is not this user's private directory or not writable).",
        "Remove `/tmp/lorenz-<uid>`, or set `LORENZ_WORKER_STATE` to a directory of at most "
        "32 bytes.",
    ),
    _C.WORKER_STATE_DIR_FOREIGN: _worker(
        "A worker state directory belongs to another user or is not a directory.",
        "Remove it, or pick another worker state root.",
    ),
    _C.WORKER_HANDLE_INVALID: _worker(
        "A string given as a worker handle is not one.",
        "Report a bug: the caller built a bad handle.",
    ),
    _C.WORKER_HANDLE_USED: _worker(
        "The handle's worker (or Pod) already ran and died without a final record.",
        "Nothing: a new attempt gets a new handle.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_HANDLES_EXHAUSTED: _worker(
        "Every run handle of this attempt already has a state directory.",
        "Clean the worker state root.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_ALREADY_RUNNING: _worker(
        "Another worker already serves this handle's control socket.",
        "Nothing: the running worker is the run's; do not start a second one.",
    ),
    _C.WORKER_JOURNAL_CORRUPT: _worker(
        "A worker journal has a malformed record before its end, skips a sequence number, or "
        "was written after its final record.",
        "Inspect or remove the run's state directory.",
    ),
    _C.WORKER_SEQUENCE_GAP: _worker(
        "A worker's records did not continue the collected sequence (a bug or a foreign "
        "journal).",
        "Report a bug with the run's state directory.",
        kind=Kind.OUTCOME,
    ),
    _C.WORKER_CONTROLLED_ELSEWHERE: _worker(
        "The slot's worker is followed by another live controller of this workflow; nothing "
        "was started beside it (no retry spent).",
        "Stop the other `lorenz` of this workflow.",
        kind=Kind.OUTCOME,
    ),
    _C.PROTOCOL_ERROR: _worker(
        "A worker's control socket got a message that is not one JSON object on a bounded "
        "line; it closes the connection.",
        "Run the same lorenz version on the controller and the worker hosts.",
    ),
    _C.BAD_REQUEST: _worker(
        "A worker's control socket got an `attach` whose `after_seq` is not a non-negative "
        "integer.",
        "Run the same lorenz version on the controller and the worker hosts.",
    ),
    _C.UNKNOWN_OP: _worker(
        "A worker's control socket got an operation it does not know.",
        "Run the same lorenz version on the controller and the worker hosts.",
    ),
    # -- workspace -----------------------------------------------------------------------------
    _C.WORKSPACE_ERROR: _workspace(
        "Base code of workspace errors; seen only when no narrower code fits.",
        "Read the message; it names the path.",
    ),
    _C.WORKSPACE_EQUALS_ROOT: _workspace(
        "The workspace path is the workspace root itself (removing the root is refused).",
        "Give every issue an identifier that maps to a directory inside `workspace.root`.",
    ),
    _C.WORKSPACE_SYMLINK_ESCAPE: _workspace(
        "The workspace path is under the root, but a symlink takes it elsewhere.",
        "Remove the symlink.",
    ),
    _C.WORKSPACE_OUTSIDE_ROOT: _workspace(
        "The workspace path is outside `workspace.root` (`..`, an absolute path, a symlink "
        "into the root from outside).",
        "Keep workspaces under `workspace.root`; use the path under the root.",
    ),
    _C.WORKSPACE_PATH_UNREADABLE: _workspace(
        "A segment of the workspace path (or the root) cannot be examined (permissions, a "
        "symlink loop).",
        "Fix the permissions or remove the symlink loop.",
    ),
    _C.WORKSPACE_IDENTIFIER_BLANK: _workspace(
        "The issue's identifier is empty, so it has no workspace name.",
        "Give the issue an identifier in the tracker.",
    ),
    _C.WORKSPACE_CREATE_FAILED: _workspace(
        "The workspace directory cannot be created.",
        "Check that `workspace.root` is a writable directory with space left.",
    ),
    _C.WORKSPACE_MISSING: _workspace(
        "The workspace disappeared before the run, or does not exist on the worker's host.",
        "Nothing: it is recreated on the next attempt; find out what deletes it if it repeats.",
    ),
    _C.WORKSPACE_REMOVE_FAILED: _workspace(
        "The workspace directory cannot be removed.",
        "Check its permissions and remove it by hand.",
    ),
    _C.WORKSPACE_HOOK_FAILED: _workspace(
        "A workspace hook exited non-zero, or could not start; the message quotes its output.",
        "Fix the hook script (`hooks.<name>`); check that sh is installed.",
    ),
    _C.WORKSPACE_HOOK_TIMEOUT: _workspace(
        "A workspace hook ran longer than `hooks.timeout_ms` and was killed.",
        "Make the script finish sooner or raise `hooks.timeout_ms`.",
    ),
    _C.WORKSPACE_HOOK_INVALID_INPUT: _workspace(
        "A hook's environment (from the issue) or script holds a NUL byte, so it cannot start.",
        "Remove the NUL byte from the issue or the hook.",
    ),
    _C.WORKTREE_REPO_INVALID: _workspace(
        "`workspace.repo` is not a git repository.",
        "Point `workspace.repo` at a clone.",
    ),
    _C.WORKTREE_BASE_REF_INVALID: _workspace(
        "`workspace.base_ref` does not name a commit in `workspace.repo`.",
        "Set it to an existing branch, tag or commit.",
    ),
    _C.WORKTREE_GIT_FAILED: _workspace(
        "A git command on the worktree exited non-zero; the message quotes git.",
        "Fix what git says (locks, disk, permissions).",
    ),
    _C.WORKTREE_DIRTY: _workspace(
        "A worktree was kept instead of removed: it has uncommitted changes.",
        "Commit, stash or discard the changes, then remove it.",
    ),
    _C.WORKTREE_FOREIGN: _workspace(
        "A worktree was kept instead of removed: Lorenz cannot prove it made it.",
        "Move it away or remove it by hand.",
    ),
    # -- claims --------------------------------------------------------------------------------
    _C.CLAIM_STORE_ERROR: _claims(
        "Base code of claim-store errors; seen only when no narrower code fits.",
        "Read the message; it names `claim_store.path`.",
    ),
    _C.CLAIM_STORE_SCHEMA_UNSUPPORTED: _claims(
        "The claim store holds another schema version, or a foreign database; nothing was "
        "read or written.",
        "Upgrade Lorenz, or point `claim_store.path` at another file.",
    ),
    _C.CLAIM_STORE_UNREADABLE: _claims(
        "The claim-store file is not a database, cannot be opened, or refuses WAL.",
        "Fix its permissions or point `claim_store.path` elsewhere.",
    ),
    _C.CLAIM_STORE_BUSY: _claims(
        "A write found the claim store locked for 10 s.",
        "Stop the process that holds a write transaction on it.",
    ),
    _C.CLAIM_STORE_WRITE_FAILED: _claims(
        "The file system refused a claim-store write (full, read-only, I/O error); nothing was "
        "half-written.",
        "Free space on the store's file system or make it writable; writes and dispatch resume "
        "by themselves.",
    ),
    _C.CLAIM_REBIND_TOO_LARGE: _claims(
        "Recovery would read or rebind more than 1,000 claims; nothing was recovered or moved "
        "(exit 1 at start, retried by recovery passes).",
        "Inspect the claim store (`claims.db`): a workflow never holds that many claims.",
    ),
    _C.CLAIM_GENERATION_STALE: _claims(
        "A newer leader generation fenced the store; this process may not write it any more.",
        "Nothing: this process stops without writing; the new leader owns the workflow.",
    ),
    _C.CLAIM_OWNER_LOST: _claims(
        "Our heartbeat went stale and another process took our claims over.",
        "Restart; make the heartbeat faster than `owner_stale_ms`.",
    ),
    _C.CLAIM_RECORD_INVALID: _claims(
        "A stored claim's slot key does not match its issue and slot; it is not restored.",
        "Delete that claim row from the claim store.",
    ),
    _C.CLAIM_CHECKPOINT_INVALID: _claims(
        "The stored checkpoint (usage totals, retry state) is unreadable; those parts start "
        "afresh.",
        "Nothing, or delete the checkpoint row to silence it.",
    ),
    _C.ORCHESTRATOR_ERROR: _claims(
        "Base code of the core scheduler's errors; seen only when no narrower code fits.",
        "Read the message.",
    ),
    _C.ORCHESTRATOR_ALREADY_STARTED: _claims(
        "`hydrate()` was called after the orchestrator already held scheduling state.",
        "Report a bug: hydration runs once, before the first dispatch.",
    ),
    # -- daemon --------------------------------------------------------------------------------
    _C.LEADERSHIP_ERROR: _daemon(
        "Base code of leadership (lease) errors; seen only when no narrower code fits.",
        "Read the message; it names the lease.",
    ),
    _C.DAEMON_ALREADY_RUNNING: _daemon(
        "A live (or unverifiable but fresh) daemon holds the workflow's lease.",
        "Attach with `lorenz status`, or stop it with `lorenz stop`.",
    ),
    _C.DAEMON_RUNNING: _daemon(
        "`lorenz` or `lorenz --once` ran without the lease beside a live daemon of the same "
        "workflow (exit 2): it would run its issues twice.",
        "`lorenz refresh` to make the daemon poll now, `lorenz status` to see it, `lorenz stop` "
        "first to run without it.",
    ),
    _C.WORKFLOW_SHARES_TRACKER_PROJECT: _daemon(
        "A warning at start-up: another workflow file in the folder names the same tracker "
        "project and workspace root, so run by two processes every issue runs twice.",
        "Keep one of them, or give each its own project or `workspace.root`.",
    ),
    _C.DAEMON_LOCK_STALE: _daemon(
        "The lease's holder cannot be proven dead, and it stopped renewing.",
        "If no daemon runs, remove the lock file the message names.",
    ),
    _C.DAEMON_LOCK_UNREADABLE: _daemon(
        "The lease file exists but does not parse.",
        "If no daemon runs, remove the file.",
    ),
    _C.DAEMON_LOCK_BUSY: _daemon(
        "Another process held the lease's guard past the 5 s bound.",
        "Find the stopped process holding it (`fuser <file>`).",
    ),
    _C.LEADERSHIP_LOST: _daemon(
        "Our lease vanished or changed hands while running; the process stops (exit 1).",
        "Start again once the other daemon is stopped.",
    ),
    _C.DAEMON_ERROR: _daemon(
        "Base code of the daemon's errors; seen only when no narrower code fits.",
        "Read the message.",
    ),
    _C.DAEMON_ORPHANS_ALIVE: _daemon(
        "Agents of a dead daemon outlived SIGKILL for 10 s; starting now could run an issue "
        "twice.",
        "Find out why they survive (`ps -o stat,wchan`), then start again.",
    ),
    _C.CONTROL_DIR_UNSAFE: _daemon(
        "The control-socket directory is a symlink, not a directory, or another user's.",
        "Remove it, set `XDG_RUNTIME_DIR`, or use `--port`.",
    ),
    _C.CONTROL_SOCKET_PATH_TOO_LONG: _daemon(
        "The control socket path exceeds the 107-byte unix socket limit.",
        "Use a shorter `XDG_RUNTIME_DIR`, or `--port`.",
    ),
    _C.CONTROL_URL_INVALID: _daemon(
        "`--url` / `--port` is not a daemon endpoint (exit 2).",
        "Give `http://HOST:PORT` or `unix:///path`.",
    ),
    _C.DAEMON_NOT_RUNNING: _daemon(
        "No daemon holds the workflow's lease, or its holder is dead.",
        "Start it: `lorenz WORKFLOW.md --feature daemon`.",
    ),
    _C.DAEMON_UNREACHABLE: _daemon(
        "A daemon holds the lease, but its control endpoint does not answer (or has none yet).",
        "Retry; check the daemon's log.",
    ),
    _C.DAEMON_REQUEST_FAILED: _daemon(
        "The daemon answered an attach command with an error.",
        "Read the code and message it gave.",
    ),
    _C.DAEMON_STOP_TIMEOUT: _daemon(
        "`lorenz stop --wait` gave up: the daemon accepted the stop but is still running.",
        "Wait longer (`--timeout`) and check its log.",
    ),
    _C.DAEMON_STARTING: _daemon(
        "A refresh reached the daemon before its runtime was up (503).",
        "Retry in a moment.",
    ),
    # -- server --------------------------------------------------------------------------------
    _C.SERVER_BIND_FAILED: _server(
        "The server cannot listen on the address or unix socket.",
        "`server.host` must be an address of this machine, the port allowed, the socket's "
        "directory writable.",
    ),
    _C.SERVER_PORT_IN_USE: _server(
        "The server's port is already in use.",
        "Choose another `server.port` / `--port`, or `0` for a free one.",
    ),
    _C.SERVER_LISTENER_MISSING: _server(
        "The server was started with neither a port nor a unix socket.",
        "Set `server.port` (or `--port`), or a unix socket.",
    ),
    _C.SERVER_SOCKET_PATH_TOO_LONG: _server(
        "The server's unix socket path exceeds 107 bytes.",
        "Use a shorter directory.",
    ),
    _C.SERVER_SOCKET_PATH_TAKEN: _server(
        "The server's socket path exists and is not a socket.",
        "Remove the file or choose another socket path.",
    ),
    _C.SERVER_SOCKET_IN_USE: _server(
        "Another process listens on the server's unix socket.",
        "Stop it first, or choose another socket path.",
    ),
    _C.ROUTE_NOT_FOUND: _server(
        "No such API route (404, any method).",
        "See `/api/v1/openapi.json` for the routes the server has.",
    ),
    _C.METHOD_NOT_ALLOWED: _server(
        "A known path with another method (405); the `Allow` header lists the allowed ones.",
        "Use a method from `Allow`.",
    ),
    _C.ISSUE_NOT_FOUND: _server(
        "The runtime knows nothing of that issue (404).",
        "Check the identifier against `GET /api/v1/state`.",
    ),
    _C.INVALID_REQUEST_BODY: _server(
        "A body other than empty or `{}`, not UTF-8 or not JSON, or unreadable (broken "
        "chunking or `Content-Encoding`) (400).",
        "Send an empty body or `{}`, plain, with a correct `Content-Length`.",
    ),
    _C.REQUEST_BODY_TOO_DEEP: _server(
        "A JSON body nests deeper than 32 levels (400).",
        "Send a flat body.",
    ),
    _C.UNSUPPORTED_MEDIA_TYPE: _server(
        "A state-changing request whose body is not `application/json` (415).",
        "Send `Content-Type: application/json`.",
    ),
    _C.HOST_NOT_ALLOWED: _server(
        "The `Host` header is not loopback, the bound address or in `server.allowed_hosts` "
        "(403).",
        "Add the host name to `server.allowed_hosts`.",
    ),
    _C.CROSS_ORIGIN_REFUSED: _server(
        "A state-changing request came from another origin (`Origin`, `Sec-Fetch-Site`) "
        "(403); the operator's API refuses it too.",
        "Call the API from a client, not from a web page of another origin.",
    ),
    _C.AUTH_TOKEN_MISSING: _server(
        "A state-changing request over TCP without `Authorization: Bearer …` (401).",
        "Send the server's token (see docs/api.md).",
    ),
    _C.AUTH_TOKEN_INVALID: _server(
        "The bearer token is not the server's; it changes at every start (401).",
        "Read the current token again.",
    ),
    _C.PEER_UID_REFUSED: _server(
        "A request over the daemon's unix socket came from a process of another uid "
        "(`SO_PEERCRED`) (403).",
        "Run the command as the user that runs the daemon.",
    ),
    _C.ORCHESTRATOR_UNAVAILABLE: _server(
        "Refresh or health was asked after the runtime stopped (503).",
        "Nothing while Lorenz shuts down; otherwise restart it.",
    ),
    _C.REQUEST_REJECTED: _server(
        "The HTTP layer rejected the request (a body over 64 KiB: 413, bad framing).",
        "Check the request's size, framing and headers.",
    ),
    _C.INTERNAL_ERROR: _server(
        "A handler failed (500); the cause is in the server log, never in the response.",
        "Report a bug with the server log.",
    ),
    _C.DASHBOARD_NOT_INSTALLED: _server(
        "The dashboard's `index.html` is missing from the installed package (404).",
        "Reinstall Lorenz.",
    ),
    _C.DASHBOARD_ASSET_NOT_FOUND: _server(
        "`/static/<name>` is not one of the shipped dashboard assets (404).",
        "Use a name the message lists.",
    ),
    _C.METRICS_WORKFLOW_LABEL_IN_USE: _server(
        "A runtime is already attached to the metrics under the same `workflow` label.",
        "Detach it first, or choose another workflow label.",
    ),
    _C.SERVER_TOKEN_FILE_UNWRITABLE: _server(
        "The server's token file could not be written (logged); the server serves anyway, "
        "but `lorenz refresh`/`stop` over TCP are refused.",
        "Make the token file's directory writable and restart.",
    ),
    # -- webhooks -----------------------------------------------------------------------------
    _C.WEBHOOK_NOT_FOUND: _webhooks(
        "A webhook delivery while `tracker.webhook_secret` is unset, or to another kind than "
        "`tracker.kind` (404).",
        "Set `tracker.webhook_secret`, and point the tracker at `/api/v1/webhooks/<kind>`.",
    ),
    _C.WEBHOOK_SIGNATURE_MISSING: _webhooks(
        "A webhook delivery without the sender's signature (or token) header (401).",
        "Configure the signing secret on the tracker's webhook too.",
    ),
    _C.WEBHOOK_SIGNATURE_INVALID: _webhooks(
        "A webhook signature (or token) does not match the raw body under the secret (401).",
        "Give the tracker's webhook the same secret as `tracker.webhook_secret`.",
    ),
    _C.WEBHOOK_STALE: _webhooks(
        "A Linear delivery's `webhookTimestamp` is missing or more than 60 s from now (400).",
        "Nothing for a replay; if genuine deliveries fail, sync this host's clock (NTP).",
    ),
    _C.WEBHOOK_REPLAYED: _webhooks(
        "A delivery id already taken in the last 24 h (the last 10,000 ids) (400).",
        "Nothing: the change it announced was already polled for.",
    ),
    _C.WEBHOOK_BODY_TOO_LARGE: _webhooks(
        "A webhook body over 1 MiB, declared or read (400).",
        "Nothing: trackers send smaller deliveries; check what sends it.",
    ),
    _C.WEBHOOK_BODY_TOO_DEEP: _webhooks(
        "A webhook body nests JSON deeper than 64 levels (400).",
        "Nothing: it is not a tracker's delivery; check what sends it.",
    ),
    _C.WEBHOOK_BODY_INVALID: _webhooks(
        "A webhook body is not a UTF-8 JSON object (400).",
        "Send the tracker's JSON delivery (`Content-Type: application/json`).",
    ),
    _C.WEBHOOK_NOT_LED_HERE: _webhooks(
        "A delivery to the operator's webhook Service reached a replica that does not lead "
        "the Workflow, and could not be forwarded to the one that does (503, `Retry-After`).",
        "Nothing: the sender's retry or the backstop poll picks the change up; if it repeats, "
        "check that replicas reach each other's webhook port.",
    ),
    # -- operator ------------------------------------------------------------------------------
    _C.OPERATOR_ERROR: _operator(
        "Base code of the operator's errors; seen only when no narrower code fits.",
        "Read the message.",
    ),
    _C.KUBE_API_ERROR: _operator(
        "The Kubernetes API server refused a request, or could not be reached.",
        "The message names the request and a hint per status (403: grant `OPERATOR_RULES`).",
    ),
    _C.KUBE_CONFIG_MISSING: _operator(
        "Neither a kubeconfig nor an in-cluster ServiceAccount was found (exit 2).",
        "Set `KUBECONFIG`, pass `--kubeconfig`, or run in a Pod.",
    ),
    _C.INVALID_OPERATOR_SETTINGS: _operator(
        "An operator setting (a `lorenz operator` flag or its environment variable) is "
        "invalid (exit 2).",
        "Fix the named flag or variable.",
    ),
    _C.CRDS_STALE: _operator(
        "`lorenz crds --check` found a CRD file that differs from the models (exit 1).",
        "Run `lorenz crds --write crds/`.",
    ),
    _C.LEASE_HELD_ELSEWHERE: _operator(
        "Another replica holds the Workflow's Lease; this replica is a follower.",
        "Nothing.",
    ),
    _C.SHARD_COUNT_MISMATCH: _operator(
        "Live replicas run with different `--shards` (logged); no new shard is taken until "
        "they agree.",
        "Give every replica the same `--shards`.",
    ),
    _C.TRACKER_SECRET_MISSING: _operator(
        "`spec.tracker.apiKeySecretRef` names a Secret (or key) that cannot be read "
        "(`Degraded` reason).",
        "Create the Secret and key, then set `lorenz.dev/refresh`.",
    ),
    _C.TRACKER_PATH_OUTSIDE_WORKFLOW: _operator(
        "`tracker.path` leaves the Workflow's own folder on the operator's volume (`Degraded` "
        "reason).",
        "Use a relative `tracker.path` inside the Workflow's folder, no `..`, no symlink out.",
    ),
    _C.WORKFLOW_DIR_UNUSABLE: _operator(
        "The Workflow's folder on the workspace volume cannot be created (`Degraded` reason).",
        "Check the volume: space, permissions, a file in the way.",
    ),
    _C.WORKFLOW_RELOAD_FAILED: _operator(
        "The Workflow's new spec failed to load and the failure gave no narrower code "
        "(`Degraded` reason); the last good spec keeps running.",
        "Read the condition's message and fix the spec.",
    ),
    _C.START_FAILED: _operator(
        "The Workflow's runtime failed to start and the failure gave no narrower code "
        "(`Degraded` reason, `StartFailed` Event); it is started again after a backoff.",
        "Read the condition's message and the operator's log.",
    ),
    _C.WORKFLOW_NOT_FOUND: _operator(
        "The operator's API was asked about a Workflow it does not watch (404).",
        "List the watched ones with `GET /api/v1/workflows`.",
    ),
    _C.WORKFLOW_NOT_LED_HERE: _operator(
        "The operator's API was asked about a Workflow another replica leads (409).",
        "Ask the replica that leads it (the message names its endpoint).",
    ),
    _C.UNAUTHENTICATED: _operator(
        "The operator's API got no bearer token, or the API server did not accept it (401).",
        "Send a Kubernetes token: `Authorization: Bearer <token>`.",
    ),
    _C.FORBIDDEN: _operator(
        "The caller's Kubernetes identity may not make this operator API request (403).",
        "Grant it with a Role (a ClusterRole for a non-resource URL).",
    ),
    _C.AUTH_UNAVAILABLE: _operator(
        "The operator could not ask the API server to review a request's token or access "
        "(503).",
        "Grant the operator's ServiceAccount create on tokenreviews and subjectaccessreviews.",
    ),
    _C.WORKER_IMAGE_MISSING: _operator(
        "`worker.kind: pod` without an image; the run fails.",
        "Set `worker.podTemplate.image`, or the operator's `--worker-image`.",
        kind=Kind.OUTCOME,
    ),
    _C.LOCAL_RUNS_FORBIDDEN: _operator(
        "A Workflow asks for `worker.kind: local` (the agent inside the operator's Pod, with "
        "its ServiceAccount) and the operator does not allow it in that namespace "
        "(`Degraded` reason; no run starts).",
        "Remove `worker.kind: local` so each run gets a Pod of its own; on a single-team "
        "cluster the platform team may allow it (`--local-runs`, the chart's "
        "`operator.localRuns`).",
    ),
    _C.POD_START_TIMEOUT: _operator(
        "The run's Pod did not serve within `worker.startTimeoutMs` (unschedulable, image, "
        "container); unplaced, the reservation is given back.",
        "Fix the node selector, tolerations, image or resources the message names, or wait "
        "for room.",
        kind=Kind.OUTCOME,
    ),
    _C.POD_REFUSED: _operator(
        "The API refused the run's Pod, its spec Secret or its workspace claim (quota, "
        "admission, RBAC).",
        "Read the API's answer in the message.",
        kind=Kind.OUTCOME,
    ),
    _C.POD_SPEC_TOO_LARGE: _operator(
        "The run spec (mostly the prompt) does not fit in a Secret.",
        "Shorten the prompt.",
        kind=Kind.OUTCOME,
    ),
    _C.POD_NAME_TAKEN: _operator(
        "A Pod, spec Secret or workspace claim of the run's name exists that is not Lorenz's "
        "for this run.",
        "Delete the object the message names.",
        kind=Kind.OUTCOME,
    ),
    _C.POD_SERVICE_ACCOUNT_REFUSED: _operator(
        "`worker.service_account_name` is the operator's own ServiceAccount.",
        "Name another ServiceAccount or unset it (`lorenz-agent`).",
        kind=Kind.OUTCOME,
    ),
    _C.POD_SERVICE_ACCOUNT_FAILED: _operator(
        "The operator could not read or create the `lorenz-agent` ServiceAccount for run Pods.",
        "Create it yourself, or grant the operator serviceaccounts get/create.",
        kind=Kind.OUTCOME,
    ),
    _C.POD_NETWORK_POLICY_FAILED: _operator(
        "The operator could not create or update the NetworkPolicy of a Workflow's run Pods "
        "(`lorenz-runs-<workflow>`); no run Pod starts without it.",
        "Grant the operator networkpolicies get/create/update in the Workflow's namespace "
        "(the chart does).",
        kind=Kind.OUTCOME,
    ),
    _C.POD_WORKSPACE_TERMINATING: _operator(
        "The issue's workspace claim is still being deleted (the issue was terminal a moment "
        "ago).",
        "Nothing: the failure retry makes a new claim.",
        kind=Kind.OUTCOME,
    ),
    # -- general -------------------------------------------------------------------------------
    _C.LORENZ_ERROR: CodeDoc(
        area=Area.GENERAL,
        meaning="Base code of every coded error; seen only when nothing narrower fits.",
        action="Read the message; report a bug if it does not say what to do.",
    ),
})
"""The documentation of every :class:`ErrorCode` (a test checks none is missing)."""
