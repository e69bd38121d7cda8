"""The pure parts of ``lorenz teardown``: what it writes into a Workflow's conditions."""

from __future__ import annotations

import datetime
from typing import Any

from lorenz.kube.operator.teardown import UNINSTALLED_REASON, uninstalled_conditions

AT = datetime.datetime(2026, 12, 7, 8, 0, tzinfo=datetime.UTC)


def test_ready_and_leading_become_false_and_the_rest_is_kept() -> None:
    before: list[dict[str, Any]] = [
        {"type": "Ready", "status": "True", "reason": "Polling", "message": "ok",
         "lastTransitionTime": "2026-12-01T00:00:00Z", "observedGeneration": 3},
        {"type": "Leading", "status": "True", "reason": "LeaseHeld", "message": "x",
         "lastTransitionTime": "2026-12-01T00:00:00Z"},
        {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "",
         "lastTransitionTime": "2026-12-01T00:00:00Z"},
    ]
    after = uninstalled_conditions(before, now=AT)
    assert after is not None
    ready, leading, degraded = after
    for condition in (ready, leading):
        assert condition["status"] == "False"
        assert condition["reason"] == UNINSTALLED_REASON
        assert condition["lastTransitionTime"] == "2026-12-07T08:00:00Z"
        assert "uninstalled" in condition["message"]
    assert ready["observedGeneration"] == 3
    assert degraded == before[2]


def test_nothing_to_change_is_none_and_a_false_condition_keeps_its_transition_time() -> None:
    done = uninstalled_conditions(
        [{"type": "Ready", "status": "True", "reason": "Polling", "message": "",
          "lastTransitionTime": "2026-12-01T00:00:00Z"}], now=AT)
    assert done is not None
    assert uninstalled_conditions(done, now=AT) is None
    assert uninstalled_conditions([], now=AT) is None
    was_false = uninstalled_conditions(
        [{"type": "Leading", "status": "False", "reason": "Follower", "message": "",
          "lastTransitionTime": "2026-12-01T00:00:00Z"}], now=AT)
    assert was_false is not None
    assert was_false[0]["lastTransitionTime"] == "2026-12-01T00:00:00Z"
    assert was_false[0]["reason"] == UNINSTALLED_REASON
