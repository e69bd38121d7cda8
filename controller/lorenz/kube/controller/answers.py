"""The operator's answer channel: the ``lorenz.dev/answer`` annotation on a waiting Claim.

A slot whose agent asked a question shows phase ``WaitingForInput`` on its Claim (the question
in ``status.question``). A person answers with ``kubectl annotate claim <name>
lorenz.dev/answer="..."``; the leader's Claim watch hands the text to the runtime's answer
(the same one as the HTTP route, the tracker reply and, on a single host, ``lorenz answer``),
so every waiting slot of the Claim's issue resumes its session with it. Then the annotation is
removed — taken or refused, so a Claim never carries a stale answer — with an Event saying
which: ``InputAnswered`` (Normal) or ``AnswerRefused`` (Warning, with the error code).

The removal is a JSON patch that first tests the annotation still holds the text taken: an
answer edited meanwhile stays, and its own watch event takes it. A Claim annotated while no
replica led the Workflow is taken by the next leader's first load (:meth:`take_found`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from lorenz.kube.api import resources
from lorenz.kube.api.resources import ClaimAnswer, WorkflowRef
from lorenz.kube.clients import KubeApi, claims_path
from lorenz.kube.controller.posting import EventKind
from lorenz.kube.errors import KubeApiError
from lorenz.model import LorenzError
from lorenz.runtime import LorenzRuntime

logger = logging.getLogger("lorenz.kube.controllers")

ANSWER_SOURCE = "claim"
"""The ``reason`` of the ``input_answered`` event of an answer taken from a Claim."""


class ClaimAnswers:
    """Takes the answer annotations of one Workflow's Claims (one take per Claim at a time)."""

    def __init__(
        self,
        *,
        api: KubeApi,
        workflow: WorkflowRef,
        post: Callable[[EventKind, str, str], None],
    ) -> None:
        self._api = api
        self._workflow = workflow
        self._post = post
        self._taking: set[tuple[str, str]] = set()
        """(uid, text) of the answers being taken: every status write of the Claim is a watch
        event that still shows the annotation until it is removed."""

    def taking(self, answer: ClaimAnswer) -> bool:
        """Whether ``answer`` is being taken already (its watch events are ignored then)."""
        return (answer.uid, answer.text) in self._taking

    async def take(self, runtime: LorenzRuntime, answer: ClaimAnswer) -> bool:
        """Answer the issue with ``answer`` and remove the annotation; ``True`` when taken."""
        mark = (answer.uid, answer.text)
        if mark in self._taking:
            return False
        self._taking.add(mark)
        try:
            try:
                receipt = await runtime.answer(
                    answer.issue_id, text=answer.text, source=ANSWER_SOURCE
                )
            except LorenzError as exc:
                # NB: refused (issue_not_waiting, answer_invalid, template_render_error): it is
                # removed all the same, and the Event says why; the slot keeps waiting.
                logger.warning(
                    "Claim answer refused workflow=%s claim=%s code=%s: %s",
                    self._workflow.display,
                    answer.name,
                    exc.code,
                    exc.message,
                )
                self._post(
                    "Warning",
                    "AnswerRefused",
                    f"{resources.ANSWER_ANNOTATION} on Claim {answer.name} refused "
                    f"({exc.code}): {exc.message}"[:1000],
                )
                taken = False
            else:
                sessions = ", ".join(s or "(new)" for s in receipt.session_ids)
                self._post(
                    "Normal",
                    "InputAnswered",
                    f"answer from Claim {answer.name} taken: {receipt.identifier} resumes "
                    f"session(s) {sessions}"[:1000],
                )
                taken = True
            await self._remove(answer)
            return taken
        finally:
            self._taking.discard(mark)

    async def _remove(self, answer: ClaimAnswer) -> None:
        key = resources.ANSWER_ANNOTATION.replace("~", "~0").replace("/", "~1")
        ops = [
            {"op": "test", "path": "/metadata/uid", "value": answer.uid},
            {"op": "test", "path": f"/metadata/annotations/{key}", "value": answer.text},
            {"op": "remove", "path": f"/metadata/annotations/{key}"},
        ]
        try:
            await self._api.json_patch(claims_path(self._workflow.namespace, answer.name), ops)
        except KubeApiError as exc:
            if exc.not_found or exc.conflict:
                return  # gone, or another answer since: its own event takes it
            logger.warning(
                "Claim answer not removed workflow=%s claim=%s error=%s",
                self._workflow.display,
                answer.name,
                exc,
            )
