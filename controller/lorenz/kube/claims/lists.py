"""The Claims (and run objects) of a Workflow, listed together with those of the Workflows
that ask at once.

A leader lists a Workflow's Claims when its term starts (to hydrate the orchestrator) and when
the Workflow is deleted (to delete them). One at a time that is a list with the Workflow's
label selector. When many Workflows of a namespace ask together — 1,000 Workflows created or
deleted at once, a namespace being deleted, a replica taking over a shard — one request per
Workflow was most of the operator's requests (each a scan of every Claim of the namespace on
the API server's side). :class:`SharedLists` answers the Workflows that are waiting together
with one list of the namespace's Claims instead. A deletion's cleanup of runs in Pods lists
the Workflow's run Pods and workspace PersistentVolumeClaims the same way
(:meth:`SharedLists.labelled`).

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
from collections.abc import Awaitable, Callable
from typing import Any

from lorenz.kube.api import resources
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.clients import KubeApi, claims_path


@dataclasses.dataclass(eq=False)
class _Batch:
    """Callers of one list (a namespace's Claims, a label's Pods…) waiting for its answer."""

    answer: asyncio.Future[dict[str, list[dict[str, Any]]]]
    one: Callable[[str], Awaitable[list[dict[str, Any]]]]
    """The list for a batch of one caller (by its name)."""
    every: Callable[[], Awaitable[list[dict[str, Any]]]]
    """The namespace-wide list for a batch of many."""
    owner_of: Callable[[dict[str, Any]], str | None]
    """Whose an item of the namespace-wide list is (a caller's name)."""
    names: set[str] = dataclasses.field(default_factory=set)


class SharedLists:
    """Lists shared by the Workflows of one namespace that need them at the same time: their
    Claims (:meth:`claims_of`) and the run objects a deletion cleans up (:meth:`labelled`)."""

    def __init__(self, *, api: KubeApi) -> None:
        self._api = api
        self._waiting: dict[str, _Batch] = {}
        """Per list (its path and selector): the batch whose list has not started yet (new
        callers join it)."""
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
        path = claims_path(workflow.namespace)

        async def one(name: str) -> list[dict[str, Any]]:
            return await self._api.list_items(
                path, label_selector=resources.workflow_selector(name)
            )

        async def every() -> list[dict[str, Any]]:
            return await self._api.list_items(path, label_selector=resources.WORKFLOW_LABEL)

        return await self._ask(
            path, workflow.name, one=one, every=every, owner_of=_claim_workflow
        )

    async def labelled(
        self, path: str, *, selector: str, label: str, value: str
    ) -> list[dict[str, Any]]:
        """The objects under ``path`` (a namespace's Pods, PersistentVolumeClaims…) matching
        ``selector`` whose ``label`` is ``value``, from a list that started after this call;
        callers asking meanwhile for other values of the same label share one list."""

        async def one(name: str) -> list[dict[str, Any]]:
            return await self._api.list_items(path, label_selector=f"{selector},{label}={name}")

        async def every() -> list[dict[str, Any]]:
            return await self._api.list_items(path, label_selector=f"{selector},{label}")

        def owner_of(item: dict[str, Any]) -> str | None:
            labels = (item.get("metadata") or {}).get("labels") or {}
            found = labels.get(label)
            return found if isinstance(found, str) else None

        return await self._ask(
            f"{path}?{selector},{label}", value, one=one, every=every, owner_of=owner_of
        )

    async def _ask(
        self,
        key: str,
        name: str,
        *,
        one: Callable[[str], Awaitable[list[dict[str, Any]]]],
        every: Callable[[], Awaitable[list[dict[str, Any]]]],
        owner_of: Callable[[dict[str, Any]], str | None],
    ) -> list[dict[str, Any]]:
        batch = self._waiting.get(key)
        if batch is None:
            batch = _Batch(
                answer=asyncio.get_running_loop().create_future(),
                one=one, every=every, owner_of=owner_of,
            )
            batch.answer.add_done_callback(_retrieve)
            self._waiting[key] = batch
            # NB: the task holds the batch; a caller that is cancelled leaves it running for
            # the others.
            task = asyncio.get_running_loop().create_task(
                self._list(key, batch), name=f"lorenz-shared-list:{key}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        batch.names.add(name)
        grouped = await asyncio.shield(batch.answer)
        return list(grouped.get(name, ()))

    async def _list(self, key: str, batch: _Batch) -> None:
        async with self._locks[key]:
            # From here on, whoever asks waits for the next list: this one may have started
            # before their question.
            if self._waiting.get(key) is batch:
                del self._waiting[key]
            try:
                self.lists += 1
                if len(batch.names) == 1:
                    (name,) = batch.names
                    items = await batch.one(name)
                else:
                    items = await batch.every()
            except asyncio.CancelledError:
                batch.answer.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - every waiting caller gets it, as its own
                batch.answer.set_exception(exc)
                return
            grouped: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
            for item in items:
                owner = batch.owner_of(item)
                if owner is not None and owner in batch.names:
                    grouped[owner].append(item)
            batch.answer.set_result(dict(grouped))


ClaimLister = SharedLists
"""NB: the name the claim store and its tests know the shared lists by."""


def _claim_workflow(item: dict[str, Any]) -> str | None:
    owner = (item.get("spec") or {}).get("workflow")
    return owner if isinstance(owner, str) else None


def _retrieve(answer: asyncio.Future[Any]) -> None:
    """A failed list whose callers all left (cancelled) is not an unhandled error: they would
    have had it."""
    with contextlib.suppress(asyncio.CancelledError):
        answer.exception()
