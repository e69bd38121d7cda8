"""The documentation of the codes of the services around runs: claims, daemon, server, operator.

The second half of :data:`lorenz.codes.catalog.CODE_DOCS` (which merges it in), apart so
neither half outgrows a module: these are the codes of the long-lived parts that host runs
(the claim store, the daemon, the HTTP server and its webhooks, the Kubernetes operator) plus
the general base code.

NB: like the rest of the registry, this module imports nothing of Lorenz outside
:mod:`lorenz.codes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from lorenz.codes import Area, CodeDoc, ErrorCode, Kind


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

SERVICE_DOCS: Final[Mapping[ErrorCode, CodeDoc]] = MappingProxyType({
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
        "Recovery would rebind more than 1,000 claims (those of stale owners and this owner's "
        "own), or the store names more than 1,000 owners; nothing was recovered or moved "
        "(exit 1 at start, retried by recovery passes). Live owners' claims do not count.",
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
    _C.LOCAL_RUNS_FORBIDDEN: _operator(
        "A Workflow asks for `worker.kind: local` (the agent inside the operator's Pod, with "
        "its ServiceAccount) and the operator does not allow it in that namespace "
        "(`Degraded` reason; no run starts).",
        "Remove `worker.kind: local` so each run gets a Pod of its own; on a single-team "
        "cluster the platform team may allow it (`--local-runs`, the chart's "
        "`operator.localRuns`).",
    ),
    _C.NETWORK_POLICY_NOT_ENFORCED: _operator(
        "The operator's probe Pod, selected by the run Pods' NetworkPolicy "
        "(`lorenz-runs-<workflow>`), reached the operator's own API port, which that policy "
        "refuses: nothing enforces NetworkPolicy in the namespace, so a run Pod can reach the "
        "operator, other namespaces' Pods and anything else on the network "
        "(`NetworkPolicyEnforced=False` reason and a `NetworkPolicyNotEnforced` Event; runs go "
        "on).",
        "The platform team installs a CNI that enforces NetworkPolicy (Calico, Cilium, "
        "kube-network-policies, …); the next probe (hourly, or a new leader) clears it.",
        kind=Kind.OUTCOME,
    ),
    _C.NETWORK_POLICY_PROBE_FAILED: _operator(
        "The operator's NetworkPolicy probe Pod did not run to an answer (its image did not "
        "pull, no node took it, the API refused it) or the operator knows no address of its "
        "own to probe (`NetworkPolicyEnforced=Unknown` reason; never `Degraded` on its own).",
        "Read the condition's message: it says why; the probe uses the Workflow's run image "
        "and scheduling, so a run Pod would likely fail the same way. Set "
        "`--advertise-url` (the chart does) for an address to probe, or turn the probe off "
        "with `--network-policy-probe false` (the chart's `operator.networkPolicyProbe`).",
        kind=Kind.OUTCOME,
    ),
    # -- general -------------------------------------------------------------------------------
    _C.LORENZ_ERROR: CodeDoc(
        area=Area.GENERAL,
        meaning="Base code of every coded error; seen only when nothing narrower fits.",
        action="Read the message; report a bug if it does not say what to do.",
    ),
})
"""The entries of the claims, daemon, server, webhooks, operator and general areas."""
