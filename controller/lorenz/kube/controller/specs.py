"""A Workflow object → the same :class:`~lorenz.workflow.LoadedWorkflow` a WORKFLOW.md gives.

The runtime knows one kind of workflow: settings validated by the one settings model plus a
parsed prompt. This module turns a Workflow's spec into exactly that, through the same loader
pipeline (:func:`lorenz.workflow.settings_from_mapping`) that reads WORKFLOW.md, so a spec and a
file with the same content behave identically. What differs is decided here:

* keys are camelCase in the spec and mapped back by the generated table (:mod:`.casing`);
* ``spec.prompt`` is the template; ``spec.tracker.apiKeySecretRef`` is read from the Secret,
  and so is ``spec.tracker.webhookSecretRef`` (it becomes ``tracker.webhook_secret``, which
  turns the Workflow's route of the operator's webhook Service on and makes polling the 5 min
  backstop, exactly as the key does in a WORKFLOW.md);
* nothing comes from the operator's environment: no ``$VAR`` values, no ``LINEAR_API_KEY``
  fallback, no ``LORENZ_FLAG_*`` — a Workflow is self-contained, and its author cannot read the
  operator pod's environment through it;
* ``workspace.root`` is the Workflow's folder on the operator's volume, and ``tracker.path``
  must stay inside that folder (no absolute path, no ``..``, no symlink out of it): one team's
  Workflow must never read another team's issues;
* a key the spec leaves unset gets the operator's default where it has one
  (:data:`~lorenz.kube.api.crds.OPERATOR_DEFAULTS`): ``worker.kind`` is ``pod``, each run in a Pod
  of its own; ``local`` (a worker inside the operator's Pod, unisolated) only when the spec
  says so *and* the platform team allowed it for the namespace (``--local-runs``); otherwise
  the spec is refused with :class:`~lorenz.kube.errors.LocalRunsForbidden`. NB: CEL at
  admission cannot see an operator flag, so this is the one place that decides.

The :class:`~lorenz.workflow.WorkflowStamp` of the result is derived from the spec and the
Secret's content, so the runtime's transactional reload runs exactly when either changed.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from lorenz.config import WorkerKind, WorkflowSettings
from lorenz.kube.api.casing import front_matter_from_spec
from lorenz.kube.api.crds import (
    OPERATOR_DEFAULTS,
    PROMPT_FIELD,
    SECRET_REF_FIELD,
    WEBHOOK_SECRET_REF_FIELD,
)
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.clients import KubeApi, secret_path
from lorenz.kube.errors import (
    KubeApiError,
    LocalRunsForbidden,
    TrackerPathOutsideWorkflow,
    TrackerSecretMissing,
)
from lorenz.policies import DEFAULT_MAX_CONTINUATION_RUNS
from lorenz.secrets import tracker_secrets
from lorenz.workflow import (
    DEFAULT_WORKFLOW_FILENAME,
    LoadedWorkflow,
    PromptTemplate,
    WorkflowStamp,
    settings_from_mapping,
)

WORKSPACES_DIR = "workspaces"


def workflow_ref(body: Mapping[str, Any]) -> WorkflowRef:
    """Namespace, name and uid of a Workflow object."""
    metadata = body.get("metadata") or {}
    return WorkflowRef(
        namespace=str(metadata.get("namespace") or "default"),
        name=str(metadata["name"]),
        uid=str(metadata["uid"]) if metadata.get("uid") else None,
    )


def generation_of(body: Mapping[str, Any]) -> int:
    return int((body.get("metadata") or {}).get("generation") or 0)


def secret_ref_of(
    spec: Mapping[str, Any], *, field: str = SECRET_REF_FIELD
) -> tuple[str, str] | None:
    """``(name, key)`` of ``spec.tracker.<field>`` (``apiKeySecretRef`` unless told), if set."""
    ref = (spec.get("tracker") or {}).get(field)
    if not isinstance(ref, Mapping) or not ref.get("name") or not ref.get("key"):
        return None
    return str(ref["name"]), str(ref["key"])


async def read_secret_key(
    api: KubeApi, *, namespace: str, name: str, key: str, field: str = SECRET_REF_FIELD
) -> str:
    """The decoded value of one Secret key; :class:`TrackerSecretMissing` (naming
    ``tracker.<field>``) if unusable."""
    named = f"tracker.{field}"

    def missing(detail: str) -> TrackerSecretMissing:
        return TrackerSecretMissing(
            namespace=namespace, name=name, key=key, detail=detail, field=named
        )

    try:
        secret = await api.get(secret_path(namespace, name))
    except KubeApiError as exc:
        raise missing("no such Secret" if exc.not_found else f"{exc.status} {exc.reason}") from exc
    data = secret.get("data") or {}
    if key in data:
        try:
            value = base64.b64decode(str(data[key])).decode("utf-8")
        except (ValueError, UnicodeDecodeError) as exc:
            raise missing("the value is not UTF-8") from exc
    elif key in (secret.get("stringData") or {}):
        value = str(secret["stringData"][key])
    else:
        raise missing(f"no such key; keys: {', '.join(sorted(data)) or 'none'}")
    if not value.strip():
        raise missing("it is empty")
    return value.strip()


def confine_tracker_path(tracker: object, *, workflow_dir: Path) -> None:
    """Refuse a ``tracker.path`` that leaves the Workflow's folder.

    NB: checked on every load (start, spec change, refresh), with symlinks resolved as they
    are then. An agent that can write into the folder (``local`` mode: the operator's uid)
    can still plant a symlink later; the Pod placement is what really separates teams.
    """
    if not isinstance(tracker, Mapping) or tracker.get("path") in (None, ""):
        return
    raw = str(tracker["path"])
    relative = PurePosixPath(raw)
    if relative.is_absolute() or raw.startswith("~"):
        raise TrackerPathOutsideWorkflow(path=raw, why="is absolute")
    if ".." in relative.parts:
        raise TrackerPathOutsideWorkflow(path=raw, why="climbs out with '..'")
    root = workflow_dir.resolve()
    resolved = (root / relative).resolve()
    if resolved != root and not resolved.is_relative_to(root):
        raise TrackerPathOutsideWorkflow(
            path=raw, why=f"leads through a symlink to {resolved}, outside the folder"
        )


def apply_operator_defaults(front_matter: dict[str, Any]) -> None:
    """Fill in :data:`~lorenz.kube.api.crds.OPERATOR_DEFAULTS` where ``front_matter`` leaves them
    unset (missing or ``null``); a value the spec gives always wins, ``worker.kind: local``
    included. A section that is not a mapping is left to the loader's error."""
    for dotted, value in OPERATOR_DEFAULTS.items():
        *sections, key = dotted.split(".")
        node: Any = front_matter
        for section in sections:
            if node.get(section) is None:
                node[section] = {}
            node = node[section]
            if not isinstance(node, dict):
                break
        else:
            if node.get(key) is None:
                node[key] = value


def apply_continuation_ceiling(front_matter: dict[str, Any], *, ceiling: int) -> None:
    """Bound ``agent.max_continuation_runs`` by the operator's ``--max-continuation-runs``.

    The continuation limit is a rule of the core (:mod:`lorenz.policies.continuations`): the
    Workflow's own ``agent.maxContinuationRuns`` (default 10) decides. The platform team's
    flag is a ceiling over every Workflow: a spec that asks for more, or for none (``0``), gets
    the ceiling. ``0`` leaves each Workflow's own value. A section that is not a mapping is left
    to the loader's error.
    """
    if ceiling <= 0:
        return
    agent = front_matter.get("agent")
    if agent is None:
        agent = front_matter["agent"] = {}
    if not isinstance(agent, dict):
        return
    wanted = agent.get("max_continuation_runs")
    if wanted is None:
        wanted = DEFAULT_MAX_CONTINUATION_RUNS
    if not isinstance(wanted, int) or isinstance(wanted, bool):
        return  # NB: the loader refuses it with its own coded error
    if wanted == 0 or wanted > ceiling:
        agent["max_continuation_runs"] = ceiling


def workflow_from_spec(
    body: Mapping[str, Any],
    *,
    workflow_dir: Path,
    api_key: str | None,
    webhook_secret: str | None = None,
    secret_digest: str = "",
    continuation_ceiling: int = 0,
) -> LoadedWorkflow:
    """The loaded workflow of a Workflow object; raises the loader's coded errors.

    ``api_key`` is the Secret's value (``None`` when the spec names none), ``webhook_secret``
    the value ``tracker.webhookSecretRef`` names (``None``: webhooks off); ``secret_digest``
    goes into the stamp so that a changed Secret reloads; ``continuation_ceiling`` is the
    operator's bound on ``agent.max_continuation_runs`` (:func:`apply_continuation_ceiling`).
    """
    ref = workflow_ref(body)
    spec = copy.deepcopy(dict(body.get("spec") or {}))
    prompt_text = str(spec.pop(PROMPT_FIELD, "") or "").strip()
    tracker = spec.get("tracker")
    if isinstance(tracker, dict):
        tracker.pop(SECRET_REF_FIELD, None)
        tracker.pop(WEBHOOK_SECRET_REF_FIELD, None)
    front_matter = front_matter_from_spec(spec)
    confine_tracker_path(front_matter.get("tracker"), workflow_dir=workflow_dir)
    raw = copy.deepcopy(front_matter)
    workspace = front_matter.setdefault("workspace", {})
    if isinstance(workspace, dict):
        workspace["root"] = str(workflow_dir / WORKSPACES_DIR)
    if api_key is not None and isinstance(front_matter.get("tracker"), dict):
        front_matter["tracker"]["api_key"] = api_key
    if webhook_secret is not None and isinstance(front_matter.get("tracker"), dict):
        front_matter["tracker"]["webhook_secret"] = webhook_secret
    # NB: after ``raw`` (the rendered WORKFLOW.md shows what the spec says), before validation:
    # the model's own default is local, the single-host kind.
    apply_operator_defaults(front_matter)
    apply_continuation_ceiling(front_matter, ceiling=continuation_ceiling)
    resolved = settings_from_mapping(
        front_matter,
        base_dir=workflow_dir,
        environ={},
        origin=f"Workflow {ref.display}",
    )
    prompt = PromptTemplate(prompt_text)
    if prompt.parse_error is not None:
        raise prompt.parse_error
    canonical = json.dumps(body.get("spec") or {}, sort_keys=True, default=str)
    content = hashlib.sha256(f"{canonical}\0{secret_digest}".encode()).hexdigest()
    return LoadedWorkflow(
        path=workflow_dir / DEFAULT_WORKFLOW_FILENAME,
        settings=resolved.settings,
        prompt_template=prompt_text,
        prompt=prompt,
        raw=raw,
        warnings=resolved.warnings,
        flag_sources=resolved.flag_sources,
        feature_sources=resolved.feature_sources,
        stamp=WorkflowStamp(mtime_ns=generation_of(body), size=len(canonical), sha256=content),
    )


def refuse_local_runs(loaded: LoadedWorkflow, *, namespace: str, allowed: bool) -> None:
    """Raise :class:`LocalRunsForbidden` when ``loaded`` runs its agents in the operator's Pod
    (``worker.kind: local``) and the operator does not allow that in ``namespace``."""
    if loaded.settings.worker.kind is WorkerKind.LOCAL and not allowed:
        raise LocalRunsForbidden(namespace=namespace)


async def load_workflow_object(
    body: Mapping[str, Any],
    *,
    api: KubeApi,
    workflow_dir: Path,
    allow_local: bool,
    continuation_ceiling: int = 0,
) -> LoadedWorkflow:
    """:func:`workflow_from_spec` with the tracker Secret read from the API, refused when it
    asks for ``worker.kind: local`` and ``allow_local`` is false (the operator's
    :meth:`~lorenz.kube.settings.OperatorSettings.allows_local_runs` for its namespace)."""
    ref = workflow_ref(body)
    spec = body.get("spec") or {}
    values: dict[str, str | None] = {}
    for field in (SECRET_REF_FIELD, WEBHOOK_SECRET_REF_FIELD):
        secret = secret_ref_of(spec, field=field)
        if secret is not None:
            name, key = secret
            values[field] = await read_secret_key(
                api, namespace=ref.namespace, name=name, key=key, field=field
            )
    api_key = values.get(SECRET_REF_FIELD)
    webhook_secret = values.get(WEBHOOK_SECRET_REF_FIELD)
    digest = ""
    if api_key is not None:
        digest = hashlib.sha256(api_key.encode()).hexdigest()
    if webhook_secret is not None:
        # NB: a changed webhook secret reloads too (the route verifies with the new one).
        digest += ":" + hashlib.sha256(webhook_secret.encode()).hexdigest()
    loaded = workflow_from_spec(
        body,
        workflow_dir=workflow_dir,
        api_key=api_key,
        webhook_secret=webhook_secret,
        secret_digest=digest,
        continuation_ceiling=continuation_ceiling,
    )
    refuse_local_runs(loaded, namespace=ref.namespace, allowed=allow_local)
    return loaded


def failed_stamp(body: Mapping[str, Any], error: BaseException) -> WorkflowStamp:
    """A stamp for a spec that did not load: unlike any loaded one, so the runtime's reload
    runs (and fails with the stored error, keeping the last known good workflow)."""
    text = f"{generation_of(body)}\0{type(error).__name__}\0{error}"
    return WorkflowStamp(
        mtime_ns=generation_of(body), size=-1, sha256=hashlib.sha256(text.encode()).hexdigest()
    )


def write_workflow_file(loaded: LoadedWorkflow) -> None:
    """Write the applied workflow as a WORKFLOW.md at ``loaded.path`` (the Workflow's folder).

    Agents get ``LORENZ_WORKFLOW`` naming this file, as on a single host; in the operator it
    is a rendering of the spec (front matter without secrets, then the prompt), rewritten
    whenever a new generation is applied. Nothing reads it back.
    """
    front_matter = yaml.safe_dump(loaded.raw, sort_keys=False, allow_unicode=True)
    text = f"---\n{front_matter}---\n{loaded.prompt_template}\n"
    loaded.path.parent.mkdir(parents=True, exist_ok=True)
    temporary = loaded.path.with_name(f".{loaded.path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(loaded.path)


def logged_secrets(settings: WorkflowSettings, *, environ: Mapping[str, str]) -> list[str]:
    """The values the process log scrubs for a Workflow: its tracker token and webhook secret
    (read from its Secrets), as :func:`lorenz.secrets.tracker_secrets` finds them."""
    values = tracker_secrets(api_key=settings.tracker.api_key, environ=environ)
    if settings.tracker.webhook_secret:
        values.append(settings.tracker.webhook_secret)
    return values
