"""The Claims of a Workflow, listed together with those of the Workflows that ask at once.

A leader lists a Workflow's Claims when its term starts (to hydrate the orchestrator) and when
the Workflow is deleted (to delete them). One at a time that is a list with the Workflow's
label selector. When many Workflows of a namespace ask together — 1,000 Workflows created or
deleted at once, a namespace being deleted, a replica taking over a shard — one request per
Workflow was most of the operator's requests (each a scan of every Claim of the namespace on
the API server's side). :class:`ClaimLister` answers the Workflows that are waiting together
with one list of the namespace's Claims instead.

Freshness is that of a list of one's own: a caller is only answered by a list that started
after it asked (one list per namespace is in flight at a time; who asks meanwhile waits for
the next one), so a new leader still sees every write of the leader before it. A batch of one
caller is the label-selected list, as before.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from typing import Any

from lorenz.kube import resources
from lorenz.kube.clients import KubeApi, claims_path
from lorenz.kube.resources import WorkflowRef


@dataclasses.dataclass(eq=False)
class _Batch:
    """Callers of one namespace waiting for the same list."""

    answer: asyncio.Future[dict[str, list[dict[str, Any]]]]
    names: set[str] = dataclasses.field(default_factory=set)


class ClaimLister:
    """Claim lists shared by the Workflows of one namespace that need them at the same time."""

    def __init__(self, *, api: KubeApi) -> None:
        self._api = api
        self._waiting: dict[str, _Batch] = {}
        """Per namespace: the batch whose list has not started yet (new callers join it)."""
        self._locks: collections.defaultdict[str, asyncio.Lock] = collections.defaultdict(
            asyncio.Lock
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self.lists = 0
        """Lists sent so far (namespace-wide and label-selected)."""

    async def claims_of(self, workflow: WorkflowRef) -> list[dict[str, Any]]:
        """The Claims whose ``spec.workflow`` is the Workflow's name, from a list that started
        after this call (Claims of a re-created Workflow of the same name included: the
        callers judge the owner)."""
        namespace = workflow.namespace
        batch = self._waiting.get(namespace)
        if batch is None:
            batch = _Batch(answer=asyncio.get_running_loop().create_future())
            batch.answer.add_done_callback(_retrieve)
            self._waiting[namespace] = batch
            # NB: the task holds the batch; a caller that is cancelled leaves it running for
            # the others.
            task = asyncio.get_running_loop().create_task(
                self._list(namespace, batch), name=f"lorenz-claim-list:{namespace}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        batch.names.add(workflow.name)
        grouped = await asyncio.shield(batch.answer)
        return list(grouped.get(workflow.name, ()))

    async def _list(self, namespace: str, batch: _Batch) -> None:
        async with self._locks[namespace]:
            # From here on, whoever asks waits for the next list: this one may have started
            # before their question.
            if self._waiting.get(namespace) is batch:
                del self._waiting[namespace]
            try:
                self.lists += 1
                if len(batch.names) == 1:
                    (name,) = batch.names
                    items = await self._api.list_items(
                        claims_path(namespace), label_selector=resources.workflow_selector(name)
                    )
                else:
                    items = await self._api.list_items(
                        claims_path(namespace), label_selector=resources.WORKFLOW_LABEL
                    )
            except asyncio.CancelledError:
                batch.answer.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - every waiting caller gets it, as its own
                batch.answer.set_exception(exc)
                return
            grouped: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
            for item in items:
                owner = (item.get("spec") or {}).get("workflow")
                if isinstance(owner, str) and owner in batch.names:
                    grouped[owner].append(item)
            batch.answer.set_result(dict(grouped))


def _retrieve(answer: asyncio.Future[Any]) -> None:
    """A failed list whose callers all left (cancelled) is not an unhandled error: they would
    have had it."""
    with contextlib.suppress(asyncio.CancelledError):
        answer.exception()
