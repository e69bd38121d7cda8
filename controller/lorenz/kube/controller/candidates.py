"""Which workflow a Workflow's newest spec loads to: the candidate the runtime reloads from.

The runtime reloads transactionally: it asks whether the source changed (a stamp unlike the
loaded one) and, if so, for the new workflow — which may be an error, in which case it keeps the
last known good one. On a single host the source is the WORKFLOW.md file; in the operator it is
the Workflow object, so every spec change (or ``lorenz.dev/refresh`` annotation) is loaded here
first (reading its Secret), and the outcome — a workflow or the error — waits as the candidate.

NB: loads can overlap (two quick edits) and finish out of order; a candidate never goes back to
an older generation than the one already held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lorenz.kube.clients import KubeApi
from lorenz.kube.controller.specs import failed_stamp, generation_of, load_workflow_object
from lorenz.kube.errors import KubeApiError
from lorenz.workflow import LoadedWorkflow, WorkflowStamp

TRANSIENT_RETRIES = 3
"""Retries (one retry period apart) of a spec load whose API read failed transiently."""


def transient(exc: KubeApiError) -> bool:
    """An API failure worth retrying (no answer, throttled, server error)."""
    return exc.status == 0 or exc.status == 429 or exc.status >= 500


class SpecCandidates:
    """The newest loaded spec of one Workflow (or why it did not load)."""

    def __init__(
        self,
        *,
        api: KubeApi,
        workflow_dir: Path,
        retry_period_s: float,
        allow_local: bool,
        continuation_ceiling: int = 0,
    ) -> None:
        self._api = api
        self._workflow_dir = workflow_dir
        self._retry_period_s = retry_period_s
        self._continuation_ceiling = continuation_ceiling
        self._allow_local = allow_local
        """Whether ``worker.kind: local`` is allowed in the Workflow's namespace."""
        self.candidate: LoadedWorkflow | BaseException | None = None
        self.stamp: WorkflowStamp | None = None
        self.generation = 0
        """The generation of the current candidate (0: none yet)."""

    def adopt(self, loaded: LoadedWorkflow, *, generation: int) -> None:
        """``loaded`` is what a new runtime starts from: it is the candidate now."""
        self.candidate = loaded
        self.stamp = loaded.stamp
        self.generation = generation

    async def rebuild(self, body: Mapping[str, Any]) -> bool:
        """Load ``body``'s spec as the new candidate; ``False`` if a newer one won meanwhile."""
        generation = generation_of(body)
        outcome: LoadedWorkflow | BaseException
        for attempt in range(TRANSIENT_RETRIES + 1):
            try:
                outcome = await load_workflow_object(
                    body,
                    api=self._api,
                    workflow_dir=self._workflow_dir,
                    allow_local=self._allow_local,
                    continuation_ceiling=self._continuation_ceiling,
                )
                break
            except KubeApiError as exc:
                outcome = exc
                if not transient(exc) or attempt == TRANSIENT_RETRIES:
                    break
                await asyncio.sleep(self._retry_period_s)
            except Exception as exc:  # noqa: BLE001 - any load failure is the candidate's error
                outcome = exc
                break
        if generation < self.generation:
            return False
        self.candidate = outcome
        self.stamp = outcome.stamp if isinstance(outcome, LoadedWorkflow) else failed_stamp(
            body, outcome
        )
        self.generation = generation
        return True

    def source_stamp(self) -> WorkflowStamp:
        """The runtime's ``source_stamp``: the candidate's stamp."""
        if self.stamp is None:
            raise RuntimeError("no candidate workflow yet")
        return self.stamp

    def reload(self) -> LoadedWorkflow:
        """The runtime's ``reload_workflow``: the candidate, or its error raised."""
        candidate = self.candidate
        if isinstance(candidate, BaseException):
            raise candidate
        if candidate is None:
            raise RuntimeError("no candidate workflow yet")
        return candidate
