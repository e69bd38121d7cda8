"""A pending retry on a Claim is due by the API server's clock, not by a controller's.

Issue #32 point 6 (seed 004: "the daemon's wall clock never releases that capacity"). A
leader schedules a retry 60 s after a failure; a new leader whose wall clock is two hours off
takes the Workflow over. Before, the Claim's wall-clock ``dueAt`` decided: two hours ahead ran
the retry at once, two hours behind waited two hours. Now the retry's write is stamped by the
API server (the ``lorenz-retry`` field manager's ``managedFields`` time) and the new leader
counts the writer's 60 s from that stamp to the server's ``Date``
(:mod:`lorenz.kube.claims.clock`). A Claim without the stamp (an older operator wrote it) keeps
its wall-clock ``dueAt``, as the SQL stores' rows without ``stored_at`` do.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from lorenz.config import WorkflowSettings
from lorenz.kube.api.resources import WorkflowRef, claim_name
from lorenz.kube.claims.clock import (
    RETRY_FIELD_MANAGER,
    retry_field_manager,
    retry_ready_in_ms,
    retry_written_at,
)
from lorenz.kube.clients import KubeApi, ServerDate, claims_path
from lorenz.model import ClaimPhase, ClaimRecord, ManualClock, SlotKey
from lorenz.orchestrator import Orchestrator
from tests.kube.test_claims import Leadership, claim_object, record, store_for
from tests.kube.test_claims import workflow as workflow  # NB: the fixture, re-exported
from tests.orchestrator.claims_helpers import run
from tests.orchestrator.factories import issue

K1 = SlotKey("i1#0")
DELAY_MS = 60_000
RUN_MS = 1_500
"""How long the run took by the writer's clock."""
ROUNDING_MS = 2_000
"""What the server's whole-second stamps may add to the wait (never take from it)."""
HOURS_2 = datetime.timedelta(hours=2)


def _settings() -> WorkflowSettings:
    return WorkflowSettings.model_validate(
        {
            "tracker": {"kind": "memory"},
            "retry": {"max_attempts": 5, "backoff": {"initial_ms": DELAY_MS}},
        }
    )


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


async def _pending_retry(
    api: KubeApi, workflow: WorkflowRef, *, writer_wall: datetime.datetime
) -> datetime.datetime:
    """Leader ``old`` (its wall clock at ``writer_wall``) runs i1 slot 0 and schedules its
    retry ``DELAY_MS`` after a failure; the retry's wall-clock ``due_at``."""
    clock = ManualClock(wall=writer_wall)
    writer = Orchestrator(
        settings=_settings(),
        store=store_for(api, workflow, "old", Leadership("old")),
        clock=clock,
    )
    await writer.hydrate()
    await run(writer, issue(1))
    clock.advance(RUN_MS)  # NB: the retry's write sets a new updatedAt, as a real clock does
    finished = await writer.finish(K1, normal=False, error="boom")
    assert finished is not None
    assert finished.retry is not None
    assert finished.retry.due_at == clock.now() + datetime.timedelta(milliseconds=DELAY_MS)
    return finished.retry.due_at


async def _new_leader_left_ms(
    api: KubeApi, workflow: WorkflowRef, *, reader_wall: datetime.datetime
) -> tuple[float, Orchestrator, ManualClock]:
    """Leader ``new`` (its wall clock at ``reader_wall``) takes over: how long until i1's
    retry is due on its clocks."""
    clock = ManualClock(wall=reader_wall)
    reader = Orchestrator(
        settings=_settings(),
        store=store_for(api, workflow, "new", Leadership("new")),
        clock=clock,
    )
    report = await reader.hydrate()
    assert report.restored_retries == (K1,)
    retry = reader.state.retry_attempts[K1]
    return retry.due_at_ms - clock.monotonic_ms(), reader, clock


@pytest.mark.parametrize(
    ("writer_skew", "reader_skew"),
    [
        pytest.param(datetime.timedelta(0), HOURS_2, id="new-leader-2h-ahead"),
        pytest.param(datetime.timedelta(0), -HOURS_2, id="new-leader-2h-behind"),
        pytest.param(-datetime.timedelta(days=1), datetime.timedelta(0), id="writer-1d-behind"),
    ],
)
async def test_a_new_leader_waits_the_delay_on_the_api_servers_clock(
    kube_api: KubeApi,
    workflow: WorkflowRef,
    writer_skew: datetime.timedelta,
    reader_skew: datetime.timedelta,
) -> None:
    await _pending_retry(kube_api, workflow, writer_wall=_utc_now() + writer_skew)

    left_ms, _, _ = await _new_leader_left_ms(
        kube_api, workflow, reader_wall=_utc_now() + reader_skew
    )
    # NB: the delay less what passed since the write (generous: a loaded machine), plus at
    # most the rounding of the server's whole-second stamps.
    assert 0 < left_ms <= DELAY_MS + ROUNDING_MS


async def test_the_retry_write_is_stamped_by_the_server_and_a_takeover_keeps_the_stamp(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    await _pending_retry(kube_api, workflow, writer_wall=_utc_now())
    before = await claim_object(kube_api, workflow, "i1#0")
    stamped = retry_written_at(before)
    assert stamped is not None
    date = kube_api.server_date.at_least()
    assert date is not None
    assert stamped <= date
    # NB: a second later the stamp of any write by that manager would differ.
    await asyncio.sleep(1.1)

    _, reader, _ = await _new_leader_left_ms(kube_api, workflow, reader_wall=_utc_now())
    after = await claim_object(kube_api, workflow, "i1#0")
    assert after["status"]["owner"] == "new"  # the takeover wrote the Claim...
    assert retry_written_at(after) == stamped  # ...and the retry's write time stayed
    managers = {entry["manager"] for entry in after["metadata"]["managedFields"]}
    assert RETRY_FIELD_MANAGER in managers
    assert reader.state.retry_attempts[K1].attempt == 1


async def test_a_claim_an_older_operator_wrote_keeps_its_wall_clock_due_at(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    await _pending_retry(kube_api, workflow, writer_wall=_utc_now())
    # An older operator (the default field manager) schedules the retry again: its stamp is
    # not the server's time of this dueAt.
    written = _utc_now() - HOURS_2
    due = written + datetime.timedelta(milliseconds=DELAY_MS)
    await kube_api.merge_patch(
        claims_path(workflow.namespace, claim_name(workflow.name, "i1#0"), status=True),
        {"status": {"dueAt": due.isoformat(), "updatedAt": written.isoformat()}},
    )
    obj = await claim_object(kube_api, workflow, "i1#0")
    assert retry_written_at(obj) is None

    loaded = await store_for(kube_api, workflow, "probe", Leadership("probe")).load()
    assert loaded.retry_ready_in_ms == {}
    reader_wall = _utc_now()
    left_ms, reader, _ = await _new_leader_left_ms(kube_api, workflow, reader_wall=reader_wall)
    assert reader.state.retry_attempts[K1].due_at == due  # the wall clock's, as before
    assert left_ms < 0


# -- the rules, without a server ------------------------------------------------------------

NOW = datetime.datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=datetime.UTC)
WRITTEN = datetime.datetime(2026, 3, 4, 5, 6, 0, tzinfo=datetime.UTC)


def _pending(*, owner: str = "old", **fields: Any) -> ClaimRecord:
    fields.setdefault("due_at", NOW + datetime.timedelta(seconds=60))
    fields.setdefault("updated_at", NOW)
    return record(owner=owner, phase=ClaimPhase.RETRY_PENDING, attempt=1, **fields)


def _claim(*, fields: tuple[str, ...] = ("f:updatedAt", "f:dueAt"), **entry: Any) -> Any:
    managed = {
        "manager": RETRY_FIELD_MANAGER,
        "operation": "Update",
        "apiVersion": "lorenz.dev/v1alpha1",
        "time": "2026-03-04T05:06:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {name: {} for name in fields}},
        "subresource": "status",
    }
    managed.update(entry)
    return {"metadata": {"managedFields": [{"manager": "lorenz-operator"}, managed]}}


def test_the_elapsed_time_is_rounded_towards_a_later_retry() -> None:
    # 10 s passed by the stamps; the write may have been up to 1 s after its stamp: 9 s.
    now = WRITTEN + datetime.timedelta(seconds=10)
    assert retry_ready_in_ms(_pending(), _claim(), server_now=now) == 51_000.0
    # A server "now" before the stamp (another API server's Date) never adds to the delay.
    early = WRITTEN - datetime.timedelta(seconds=5)
    assert retry_ready_in_ms(_pending(), _claim(), server_now=early) == 60_000.0


def test_without_a_stamp_or_a_date_the_wall_clock_due_at_decides() -> None:
    now = WRITTEN + datetime.timedelta(seconds=10)
    assert retry_ready_in_ms(_pending(), {"metadata": {}}, server_now=now) is None
    assert retry_ready_in_ms(_pending(), _claim(), server_now=None) is None
    assert retry_ready_in_ms(_pending(), _claim(fields=("f:dueAt",)), server_now=now) is None
    assert retry_ready_in_ms(_pending(), _claim(subresource=None), server_now=now) is None
    assert retry_ready_in_ms(_pending(), _claim(time="soon"), server_now=now) is None
    assert retry_ready_in_ms(_pending(updated_at=None), _claim(), server_now=now) is None
    running = record(owner="old", updated_at=NOW, due_at=NOW)
    assert retry_ready_in_ms(running, _claim(), server_now=now) is None


def test_only_writes_that_schedule_a_retry_use_the_retry_manager() -> None:
    pending = _pending()
    assert retry_field_manager(before=record(owner="old"), after=pending) == RETRY_FIELD_MANAGER
    assert retry_field_manager(before=record(owner=""), after=pending) == RETRY_FIELD_MANAGER
    later = _pending(due_at=NOW + datetime.timedelta(seconds=90))
    assert retry_field_manager(before=pending, after=later) == RETRY_FIELD_MANAGER
    taken = _pending(owner="new")  # a takeover: same retry, new owner
    assert retry_field_manager(before=pending, after=taken) is None
    assert retry_field_manager(before=pending, after=record(owner="old")) is None


def test_the_server_date_is_a_lower_bound_that_moves_on_our_monotonic_clock() -> None:
    date = ServerDate()
    assert date.at_least() is None
    date.note("Wed, 04 Mar 2026 05:06:07 GMT", received=100.0)
    assert date.at_least(monotonic=102.5) == datetime.datetime(
        2026, 3, 4, 5, 6, 9, 500000, tzinfo=datetime.UTC
    )
    date.note("Wed, 04 Mar 2026 05:06:01 GMT", received=99.0)  # an answer that came earlier
    date.note("not a date", received=101.0)
    assert date.at_least(monotonic=100.0) == datetime.datetime(
        2026, 3, 4, 5, 6, 7, tzinfo=datetime.UTC
    )
