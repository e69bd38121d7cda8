"""Pure scheduling rules: eligibility, order, admission, caps, placement, backoff, the
continuation limit, stalls, outcomes.

Every function here is a plain computation over model objects and settings, with no state and
no I/O, so each rule is tested on its own and the orchestrator (layer 3) only combines them.
"""

from lorenz.policies.admission import Admission, Admitted, Refusal, admission
from lorenz.policies.backoff import (
    CONTINUATION_ATTEMPT,
    CONTINUATION_DELAY_MS,
    FAILURE_BASE_DELAY_MS,
    RESERVATION_EXPIRY_MARGIN_MS,
    failure_backoff_ms,
    next_failure_attempt,
    placement_wait_ms,
    reservation_lifetime_ms,
    retry_plan,
)
from lorenz.policies.concurrency import (
    HOST_UNREACHABLE_CODE,
    CapacityShortage,
    agent_kind_for,
    available_slots,
    capacity_shortage,
    kind_limit,
    retry_host,
    select_worker_host,
    state_limit,
)
from lorenz.policies.continuations import (
    DEFAULT_MAX_CONTINUATION_RUNS,
    continuation_limit_reached,
    next_continuation_streak,
)
from lorenz.policies.eligibility import (
    Ineligibility,
    IssueRules,
    dispatchable_issues,
    has_open_blockers,
    is_routable,
    issue_ineligibility,
    retry_is_due,
    slot_ineligibility,
)
from lorenz.policies.ordering import (
    UNRANKED_PRIORITY,
    created_rank,
    dispatch_sort_key,
    priority_rank,
    sort_for_dispatch,
)
from lorenz.policies.outcomes import (
    POISON_WORKER_ERROR_CODES,
    WorkerHealth,
    classify_worker_outcome,
)
from lorenz.policies.placement import (
    ClaimPlacement,
    RunLocation,
    claim_placement,
    run_location,
    runs_in_pods,
)
from lorenz.policies.reconciliation import reconciliation_decision
from lorenz.policies.stalls import is_stalled, last_activity_ms, stall_error, stalled_for_ms

__all__ = [
    "CONTINUATION_ATTEMPT",
    "CONTINUATION_DELAY_MS",
    "DEFAULT_MAX_CONTINUATION_RUNS",
    "FAILURE_BASE_DELAY_MS",
    "HOST_UNREACHABLE_CODE",
    "POISON_WORKER_ERROR_CODES",
    "RESERVATION_EXPIRY_MARGIN_MS",
    "UNRANKED_PRIORITY",
    "Admission",
    "Admitted",
    "CapacityShortage",
    "ClaimPlacement",
    "Ineligibility",
    "IssueRules",
    "Refusal",
    "RunLocation",
    "WorkerHealth",
    "admission",
    "agent_kind_for",
    "available_slots",
    "capacity_shortage",
    "claim_placement",
    "classify_worker_outcome",
    "continuation_limit_reached",
    "created_rank",
    "dispatch_sort_key",
    "dispatchable_issues",
    "failure_backoff_ms",
    "has_open_blockers",
    "is_routable",
    "is_stalled",
    "issue_ineligibility",
    "kind_limit",
    "last_activity_ms",
    "next_continuation_streak",
    "next_failure_attempt",
    "placement_wait_ms",
    "priority_rank",
    "reconciliation_decision",
    "reservation_lifetime_ms",
    "retry_host",
    "retry_is_due",
    "retry_plan",
    "run_location",
    "runs_in_pods",
    "select_worker_host",
    "slot_ineligibility",
    "sort_for_dispatch",
    "stall_error",
    "stalled_for_ms",
    "state_limit",
]
