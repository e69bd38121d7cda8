"""Names of everything the operator creates or reads in the cluster, derived in one place.

A Claim's name, a Lease's name and the label that ties both to their Workflow are computed,
never stored: any replica that takes a Workflow over must find the same objects from nothing
but the Workflow's name and a slot key. So the rules (sanitizing, truncation, the hash suffix
that keeps truncated names unique) live here once, and every writer and reader calls them.

NB: Kubernetes object names are DNS subdomains (at most 253 characters of ``[a-z0-9.-]``,
alphanumeric at both ends), label values at most 63 characters of ``[A-Za-z0-9._-]``
(alphanumeric at both ends). Slot keys contain ``#`` and issue ids may contain anything, so
every derived name is sanitized and carries a hash of the exact original.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

GROUP: Final = "lorenz.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

WORKFLOW_KIND: Final = "Workflow"
WORKFLOW_PLURAL: Final = "workflows"
WORKFLOW_SINGULAR: Final = "workflow"
WORKFLOW_SHORT_NAMES: Final = ("wf",)

CLAIM_KIND: Final = "Claim"
CLAIM_PLURAL: Final = "claims"
CLAIM_SINGULAR: Final = "claim"
CLAIM_SHORT_NAMES: Final = ("clm",)

CATEGORIES: Final = ("lorenz",)
"""``kubectl get lorenz`` lists Workflows and Claims together."""

WORKFLOW_LABEL: Final = f"{GROUP}/workflow"
"""Label on every Claim and Lease: the (label-safe) name of the Workflow it belongs to."""
SLOT_LABEL: Final = f"{GROUP}/slot"
"""Label on every Claim: the label-safe form of its slot key (for humans; not a selector)."""
REFRESH_ANNOTATION: Final = f"{GROUP}/refresh"
"""Any new value on a Workflow asks its runtime to poll now (and re-read its Secret)."""
HOLD_ANNOTATION: Final = f"{GROUP}/hold"
"""On a Claim: stop its run and keep the issue from being dispatched while it is there (the
value is a note for people). Removing it releases the issue; deleting the Claim instead
re-dispatches an eligible issue at once."""


def on_hold(obj: Mapping[str, Any]) -> str | None:
    """The hold note of a Claim object (``None``: not held)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(HOLD_ANNOTATION)
    return None if value is None else str(value)


def refresh_of(obj: Mapping[str, Any]) -> str | None:
    """The ``lorenz.dev/refresh`` value of a Workflow object (``None``: not set)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(REFRESH_ANNOTATION)
    return None if value is None else str(value)


ANSWER_ANNOTATION: Final = f"{GROUP}/answer"
"""On a Claim whose slot waits for input (phase ``WaitingForInput``): the answer to its agent's
question, as text. The leader takes it (the issue's waiting slots resume their sessions with
it) and removes it; a refused one is removed too, with a Warning Event saying why."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClaimAnswer:
    """An answer annotation as a Claim carried it."""

    name: str
    """The Claim's name."""
    uid: str
    issue_id: str
    """The issue the Claim's slot belongs to (the answer goes to its waiting slots)."""
    text: str


def answer_of(obj: Mapping[str, Any]) -> ClaimAnswer | None:
    """The answer annotation of a Claim object (``None``: none, or not a whole Claim)."""
    metadata = obj.get("metadata") or {}
    value = (metadata.get("annotations") or {}).get(ANSWER_ANNOTATION)
    issue_id = (obj.get("spec") or {}).get("issueId")
    if value is None or not metadata.get("name") or not metadata.get("uid") or not issue_id:
        return None
    return ClaimAnswer(
        name=str(metadata["name"]), uid=str(metadata["uid"]), issue_id=str(issue_id),
        text=str(value),
    )


ENDPOINT_ANNOTATION: Final = f"{GROUP}/endpoint"
"""On a Lease: where the holding replica serves its API."""
CLEANUP_FINALIZER: Final = f"{GROUP}/cleanup"
"""Held on a Workflow while a leader may still own Claims, runs or the Lease for it."""

LEASE_PREFIX: Final = "lorenz-wf-"

MAX_NAME: Final = 253
MAX_LABEL_VALUE: Final = 63
HASH_CHARS: Final = 10

_NOT_NAME_CHARS = re.compile(r"[^a-z0-9.-]+")
_NOT_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_DASHES = re.compile(r"-{2,}")


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowRef:
    """Which Workflow an object belongs to: enough to name, label and own its children."""

    namespace: str
    name: str
    uid: str | None = None
    """Set once the Workflow has been seen; owner references need it."""

    @property
    def display(self) -> str:
        """``<namespace>/<name>``, as logs and events name the Workflow."""
        return f"{self.namespace}/{self.name}"


def digest(*parts: str) -> str:
    """The first :data:`HASH_CHARS` hex digits of sha256 over ``parts`` (NUL-separated)."""
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()[:HASH_CHARS]


def _trimmed(text: str, *, limit: int, alnum: str = "a-z0-9") -> str:
    text = text[:limit]
    return re.sub(rf"^[^{alnum}]+|[^{alnum}]+$", "", text)


def _name_part(text: str, *, limit: int) -> str:
    cleaned = _DASHES.sub("-", _NOT_NAME_CHARS.sub("-", text.lower()))
    return _trimmed(cleaned, limit=limit)


def label_value(text: str) -> str:
    """``text`` if it is a valid label value, else a sanitized prefix plus a hash of ``text``."""
    if (
        len(text) <= MAX_LABEL_VALUE
        and not _NOT_LABEL_CHARS.search(text)
        and re.fullmatch(r"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?", text)
    ):
        return text
    cleaned = _DASHES.sub("-", _NOT_LABEL_CHARS.sub("-", text))
    prefix = _trimmed(cleaned, limit=MAX_LABEL_VALUE - HASH_CHARS - 1, alnum="A-Za-z0-9")
    return f"{prefix}-{digest(text)}" if prefix else digest(text)


def workflow_label(workflow_name: str) -> str:
    """The value of :data:`WORKFLOW_LABEL` for a Workflow name."""
    return label_value(workflow_name)


def workflow_selector(workflow_name: str) -> str:
    """The label selector that lists a Workflow's Claims."""
    return f"{WORKFLOW_LABEL}={workflow_label(workflow_name)}"


def claim_name(workflow_name: str, slot_key: str) -> str:
    """The Claim name of one slot: ``<workflow>-<slot>-<hash>``, deterministic and unique.

    The hash covers the exact Workflow name and slot key, so two slots whose sanitized forms
    collide (``A#0`` and ``a#0``) still get different names.
    """
    suffix = digest(workflow_name, slot_key)
    room = MAX_NAME - HASH_CHARS - 2
    workflow_part = _name_part(workflow_name, limit=min(room // 2, 100))
    slot_part = _name_part(slot_key, limit=room - len(workflow_part))
    parts = [p for p in (workflow_part, slot_part, suffix) if p]
    return "-".join(parts)


def lease_name(workflow_name: str) -> str:
    """``lorenz-wf-<name>``; hashed when that would be longer than a name may be."""
    plain = f"{LEASE_PREFIX}{workflow_name}"
    if len(plain) <= MAX_NAME:
        return plain
    room = MAX_NAME - len(LEASE_PREFIX) - HASH_CHARS - 1
    return f"{LEASE_PREFIX}{_name_part(workflow_name, limit=room)}-{digest(workflow_name)}"


def owner_reference(ref: WorkflowRef) -> dict[str, Any]:
    """An ownerReference to the Workflow (garbage collection of Claims and the Lease).

    NB: not ``blockOwnerDeletion``: that needs update rights on ``workflows/finalizers``, and
    cleanup never relies on the garbage collector anyway (the finalizer deletes Claims).
    """
    if ref.uid is None:
        raise ValueError(f"the Workflow {ref.display} has no uid yet")
    return {
        "apiVersion": API_VERSION,
        "kind": WORKFLOW_KIND,
        "name": ref.name,
        "uid": ref.uid,
        "controller": True,
    }


def compact_json(body: Mapping[str, Any]) -> str:
    """``body`` as one line of JSON (no spaces, non-ASCII kept): how objects are logged."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)
