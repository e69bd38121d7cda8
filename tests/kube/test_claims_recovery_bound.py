"""The Claim store's start-up read is bounded: above the bound it fails closed, holding nothing.

Issue #32 point 6. The read lists this Workflow's Claims by its label (never every Claim of
the namespace); with a bound, more Claims than the bound raise ``claim_rebind_too_large`` and
the store holds none of them (nothing to recover, adopt or retry). The orchestrator passes
1,000; here the bound is small so the cluster test creates three Claims, not 1,001.
"""

from __future__ import annotations

import pytest

from lorenz.claims import ClaimRecoveryTooLarge
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.clients import KubeApi
from tests.kube.test_claims import Leadership, record, store_for
from tests.kube.test_claims import workflow as workflow  # NB: the fixture, re-exported

pytestmark = pytest.mark.cluster


async def test_a_bounded_load_above_the_bound_fails_closed(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    writer = store_for(kube_api, workflow, "leader", Leadership("leader"))
    for issue in ("A", "B", "C"):
        assert await writer.acquire(record(issue))
    successor = store_for(kube_api, workflow, "next", Leadership("next"))
    with pytest.raises(ClaimRecoveryTooLarge) as caught:
        await successor.load(bound=2)
    assert caught.value.code == "claim_rebind_too_large"
    assert dict(successor.held) == {}
    loaded = await successor.load(bound=3)
    assert len(loaded.claims) == 3
    assert {claim.owner for claim in loaded.claims} == {"leader"}
