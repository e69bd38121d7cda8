"""The documentation of every error code: what it means and what the user does about it.

The codes themselves (:class:`lorenz.codes.ErrorCode`) and the shape of an entry
(:class:`lorenz.codes.CodeDoc`) stay in the package's ``__init__``, which every layer imports;
this table is the long part (one entry per code), kept apart so the registry's interface reads
in one screen. It holds the codes of a run's path (config, tracker, agent, run, budget, worker,
workspace) and merges in those of the services around runs (:mod:`lorenz.codes.services`).
``docs/errors.md`` is rendered from it (``python -m lorenz.codes.docs``) and
``tests/codes/test_registry.py`` checks no code is missing here.

NB: like the rest of the registry, this module imports nothing of Lorenz outside
:mod:`lorenz.codes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from lorenz.codes import Area, CodeDoc, ErrorCode, Kind
from lorenz.codes.services import SERVICE_DOCS


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
    _C.WORKER_KILL_UNCONFIRMED: _worker(
        "A stopped run's worker did not end it (frozen, gone or unknown), and its processes "
        "could not be proven killed: its SSH host does not answer, or its Pod is not gone yet "
        "(a finalizer, an unreachable API server). The slot stays held, counted against "
        "concurrency, and is not retried.",
        "Check the worker's host or the Pod (`kubectl get pod`, its finalizers); the kill is "
        "tried again until it is confirmed, then the slot is retried.",
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
    **SERVICE_DOCS,
})
"""The documentation of every :class:`ErrorCode` (a test checks none is missing)."""
