"""The operator process: kopf watches, one controller per Workflow, one API server.

kopf runs standalone (no peering: the shard Leases decide who works, so replicas share
Workflows instead of freezing each other) and is used for what it does well — watching with
reconnects and bookmarks, posting Events, the liveness probe. Its only handlers are
``@kopf.on.event`` ones, which persist nothing: no diff-base annotations, no progress
annotations, no kopf finalizer. The decisions live in :class:`Supervisor` and
:class:`~lorenz.kube.controller.workflow.WorkflowController`, level-based: an event only hands over
the newest object.

* Workflow events are recorded per Workflow (:class:`Watched`: its newest object as compact
  JSON); a Workflow gets a controller only while its shard is offered here (held, not being
  handed over), and goes back to its record once the controller let go (a re-created Workflow
  of the same name is a new uid, so a new record).
* Claim deletions are passed to the Workflow's controller, which cancels the run if the Claim
  was live and not deleted by the store itself.
* On shutdown (SIGTERM/SIGINT; kopf turns them into its stop sequence) the cleanup handler
  stops every controller (runtimes drain), then releases this replica's shard Leases, so other
  replicas take over at their next round instead of after a full lease duration.

NB: kopf's resource scanning is disabled (no RBAC on CRDs needed); the CRDs must therefore be
installed before the operator starts, which the Helm chart and ``deploy/`` guarantee.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lorenz.kube.api import resources
from lorenz.kube.api.resources import WorkflowRef, compact_json
from lorenz.kube.claims.lists import ClaimLister
from lorenz.kube.clients import KubeApi, load_configuration
from lorenz.kube.controller.posting import Post, kopf_post
from lorenz.kube.controller.publisher import RuntimeAttacher
from lorenz.kube.controller.specs import workflow_ref
from lorenz.kube.controller.workflow import WorkflowController
from lorenz.kube.leaderelection.sharding import Shard, ShardCoordinator
from lorenz.kube.operator.api_auth import KubernetesAuth
from lorenz.kube.pods.transport import AgentAccounts
from lorenz.kube.settings import OperatorSettings
from lorenz.leadership import LeaseRecord
from lorenz.model import SlotKey
from lorenz.runtime import LorenzRuntime
from lorenz.secrets import SecretRedactor, hide_process_environment, tracker_secrets
from lorenz.tasks import install_child_watcher

logger = logging.getLogger("lorenz.kube.operator")

STRIPPED_AGENT_ENV = ("KUBECONFIG",)
"""Variables agents and hooks never inherit, even when listed in ``agent_env_passthrough``."""


@dataclasses.dataclass(slots=True, eq=False)
class Watched:
    """What this replica keeps of one Workflow it watches: the newest object, and a controller
    only while the Workflow's shard is offered here.

    NB: every replica watches every Workflow but leads about a third of them (a shard of each
    3); a full :class:`WorkflowController` per watched Workflow (its flags, Event poster, spec
    candidates, background set and a task waiting for the shard) was ~10 KiB per Workflow per
    replica, twice over for each Workflow led elsewhere. A follower needs only the newest
    object, to start from the moment its shard comes here.
    """

    ref: WorkflowRef
    shard: Shard
    body_text: str
    """The newest watched object as compact JSON (the controller's, while there is one)."""
    controller: WorkflowController | None = None
    posted: int = 0
    """Events posted by this Workflow's earlier controllers in this process."""
    dropped: int = 0
    """Events dropped by those (rate limit, silenced)."""

    @property
    def leading(self) -> bool:
        controller = self.controller
        return controller is not None and controller.leading

    @property
    def runtime(self) -> LorenzRuntime | None:
        controller = self.controller
        return controller.runtime if controller is not None else None

    @property
    def observed(self) -> LeaseRecord | None:
        """The shard Lease as last observed, naming this Workflow."""
        record = self.shard.lease.observed
        if record is None:
            return None
        return dataclasses.replace(record, workflow_path=self.ref.display)

    @property
    def events_posted(self) -> int:
        controller = self.controller
        return self.posted + (controller.events.posted if controller is not None else 0)

    @property
    def events_dropped(self) -> int:
        controller = self.controller
        return self.dropped + (controller.events.dropped if controller is not None else 0)


class Supervisor:
    """Every Workflow this process watches, and the controllers of those its shards hold."""

    def __init__(
        self,
        *,
        api: KubeApi,
        settings: OperatorSettings,
        coordinator: ShardCoordinator,
        base_env: Mapping[str, str] | None = None,
        post: Post = kopf_post,
        metrics: RuntimeAttacher | None = None,
        log_secrets: Callable[[Iterable[str]], None] | None = None,
    ) -> None:
        self.api = api
        self.settings = settings
        self.coordinator = coordinator
        source = os.environ if base_env is None else base_env
        # NB: an allow-list, not a deny-list: whatever a platform team sets on the operator
        # (tokens, proxies with credentials) stays with the operator.
        env = {name: source[name] for name in settings.agent_env_passthrough if name in source}
        for name in list(env):
            if name in STRIPPED_AGENT_ENV or name.startswith("LORENZ_OPERATOR_"):
                del env[name]
        self._base_env = env
        self._post = post
        self.metrics = metrics
        self._log_secrets = log_secrets
        self.claim_lister = ClaimLister(api=api)
        """Claim lists shared by the Workflows that start or are deleted together."""
        self.agent_accounts = AgentAccounts()
        """The ``lorenz-agent`` ServiceAccounts this process made sure of (per namespace, for
        every Workflow's runs in Pods)."""
        self.workflows: dict[tuple[str, str], Watched] = {}
        """Every Workflow this process watches."""
        self.controllers: dict[tuple[str, str], WorkflowController] = {}
        """The controllers of those whose shard is offered here (or that still let go)."""
        self._retired: set[WorkflowController] = set()
        self._closing = False
        self._context: contextvars.Context | None = None
        """The context of kopf's handlers (its Event queue), for controllers made elsewhere."""
        coordinator.when_available(self._shard_available)

    # -- kopf's handlers call these --------------------------------------------------------

    def workflow_event(self, kind: str | None, body: Mapping[str, Any]) -> None:
        """One watch event of a Workflow (``kind`` None = the initial listing)."""
        if self._context is None:
            # NB: kopf posts Events through a queue its handlers' context names; a controller
            # made when a shard comes (the coordinator's task, not a handler's) runs in this
            # copy, or its Events would go nowhere.
            self._context = contextvars.copy_context()
        ref = workflow_ref(body)
        key = (ref.namespace, ref.name)
        watched = self.workflows.get(key)
        if kind == "DELETED":
            if watched is not None and watched.ref.uid in (None, ref.uid):
                self._forget(key, watched)
            return
        if self._closing:
            return
        if watched is not None and ref.uid is not None and watched.ref.uid not in (None, ref.uid):
            self._forget(key, watched)
            watched = None
        text = compact_json(body)
        if watched is None:
            watched = Watched(ref=ref, shard=self.coordinator.shard_for(ref), body_text=text)
            self.workflows[key] = watched
            logger.info("Workflow watched workflow=%s uid=%s", ref.display, ref.uid)
            if watched.shard.available.is_set():
                self._promote(key, watched)
            return
        watched.body_text = text
        if ref.uid is not None and watched.ref.uid is None:
            watched.ref = ref
        current = watched.controller
        if current is None:
            # NB: level-based: a controller that ended on its own (a failure) while its shard
            # is still offered here comes back with the next event.
            if watched.shard.available.is_set():
                self._promote(key, watched)
            return
        current.observe(body, text=text)
        if current.finished:
            self._forget(key, watched)

    def claim_event(self, kind: str | None, body: Mapping[str, Any]) -> None:
        """One watch event of a Claim: deletions, holds and answers matter."""
        hold = resources.on_hold(body)
        answer = resources.answer_of(body) if kind != "DELETED" and hold is None else None
        if kind != "DELETED" and hold is None and answer is None:
            return
        metadata = body.get("metadata") or {}
        spec = body.get("spec") or {}
        workflow = spec.get("workflow")
        slot = spec.get("slotKey")
        uid = metadata.get("uid")
        if not workflow or not slot or not uid:
            return
        controller = self.controllers.get((str(metadata.get("namespace")), str(workflow)))
        if controller is None:
            return
        if kind == "DELETED":
            controller.claim_deleted(uid=str(uid), slot_key=SlotKey(str(slot)))
        elif hold is not None:
            controller.claim_held(
                uid=str(uid), slot_key=SlotKey(str(slot)), name=str(metadata.get("name")),
                note=hold,
            )
        elif answer is not None:
            controller.claim_answered(answer)

    def healthy(self) -> bool:
        """Whether this process serves (not shutting down): all ``/healthz`` tells anyone."""
        return not self._closing

    def probe(self) -> dict[str, Any]:
        """What kopf's liveness endpoint reports: ok or not, nothing about the Workflows
        (NB: the port answers any Pod that reaches it)."""
        return {"ok": self.healthy()}

    async def shutdown(self) -> None:
        """Stop every controller (drain), concurrently, then release the shards; idempotent."""
        self._closing = True
        self.coordinator.stop_acquiring()
        controllers = [*self.controllers.values(), *self._retired]
        self.controllers.clear()
        if controllers:
            await asyncio.gather(*(c.shutdown() for c in controllers), return_exceptions=True)
        self._retired.clear()
        await self.coordinator.close()

    # -- pieces ----------------------------------------------------------------------------

    def _shard_available(self, shard: Shard) -> None:
        """``shard`` is offered here now: its Workflows get their controllers at once."""
        if self._closing:
            return
        for key, watched in list(self.workflows.items()):
            if watched.shard is shard and watched.controller is None:
                self._promote(key, watched)

    def _promote(self, key: tuple[str, str], watched: Watched) -> None:
        controller = WorkflowController(
            body_text=watched.body_text,
            api=self.api,
            settings=self.settings,
            coordinator=self.coordinator,
            base_env=self._base_env,
            post=self._post,
            metrics=self.metrics,
            log_secrets=self._log_secrets,
            claim_lister=self.claim_lister,
            agent_accounts=self.agent_accounts,
        )
        watched.controller = controller
        self.controllers[key] = controller
        controller.start(context=self._context)
        assert controller.task is not None
        controller.task.add_done_callback(
            lambda task: self._controller_ended(key, watched, controller, task)
        )

    def _controller_ended(
        self,
        key: tuple[str, str],
        watched: Watched,
        controller: WorkflowController,
        task: asyncio.Task[None],
    ) -> None:
        """A controller's loop ended: its shard left (a follower again), or it finished."""
        if watched.controller is not controller:
            return  # NB: retired (deleted, replaced): _forget took care of it
        watched.controller = None
        watched.posted += controller.events.posted
        watched.dropped += controller.events.dropped
        if self.controllers.get(key) is controller:
            del self.controllers[key]
        if controller.finished:
            if self.workflows.get(key) is watched:
                del self.workflows[key]
            return
        if task.cancelled() or task.exception() is not None:
            # NB: logged by the task's own handler; the next event or shard brings it back.
            return
        if not self._closing and watched.shard.available.is_set():
            self._promote(key, watched)  # NB: the shard came back while it let go

    def _forget(self, key: tuple[str, str], watched: Watched) -> None:
        if self.workflows.get(key) is watched:
            del self.workflows[key]
        controller = watched.controller
        watched.controller = None
        if controller is not None:
            self._retire(key, controller)
        logger.info("Workflow retired workflow=%s uid=%s", watched.ref.display, watched.ref.uid)

    def _retire(self, key: tuple[str, str], controller: WorkflowController) -> None:
        if self.controllers.get(key) is controller:
            del self.controllers[key]
        controller.gone()
        self._retired.add(controller)
        if controller.task is not None:
            controller.task.add_done_callback(lambda _: self._retired.discard(controller))


def build_registry(supervisor: Supervisor) -> Any:
    """A kopf registry whose handlers feed ``supervisor`` (and configure kopf)."""
    import kopf

    registry = kopf.OperatorRegistry()
    identity = supervisor.settings.identity

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True
        settings.scanning.disabled = True
        settings.posting.reporting_component = "lorenz-operator"
        settings.posting.reporting_instance = identity
        settings.posting.level = logging.INFO
        # NB: long watch requests with a client timeout just above them: a half-dead stream
        # behind a load balancer is noticed and re-opened instead of going silent.
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 30
        settings.networking.error_backoffs = [1, 2, 3, 5, 8]
        settings.persistence.diffbase_storage = no_diffbase()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> Any:
        # NB: the same credentials as the operator's own client (kubeconfig first, then the
        # ServiceAccount); kopf calls this again when the API answers 401 (a rotated token).
        return connection_info(load_configuration(kubeconfig=supervisor.settings.kubeconfig))

    @kopf.on.event(resources.GROUP, resources.VERSION, resources.WORKFLOW_PLURAL, registry=registry)
    async def workflow_seen(type: str | None, body: kopf.Body, **_: Any) -> None:
        supervisor.workflow_event(type, _plain(body))

    @kopf.on.event(resources.GROUP, resources.VERSION, resources.CLAIM_PLURAL, registry=registry)
    async def claim_seen(type: str | None, body: kopf.Body, **_: Any) -> None:
        supervisor.claim_event(type, _plain(body))

    @kopf.on.probe(id="lorenz", registry=registry)
    def probe(**_: Any) -> dict[str, Any]:
        return supervisor.probe()

    @kopf.on.cleanup(registry=registry)
    async def stop_controllers(**_: Any) -> None:
        await supervisor.shutdown()

    return registry


def connection_info(configuration: Any) -> Any:
    """kopf's credentials from a ``kubernetes.client.Configuration``."""
    import kopf

    header = configuration.get_api_key_with_prefix(
        "BearerToken"
    ) or configuration.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else parts
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def _plain(body: Any) -> dict[str, Any]:
    """A plain dict of what the controllers read of a kopf body: identity, metadata, the spec
    and the status conditions.

    NB: ``metadata.managedFields`` and the rest of the status are left out: every replica keeps
    the newest body of every Workflow it watches, so with 1,000 Workflows these were most of
    the bytes kept. Its parts are the watch event's own (not copied): a controller keeps its
    object only as compact JSON (``WorkflowController._body``), and a Claim's is only read.
    """
    raw = dict(body)
    metadata = {k: v for k, v in (raw.get("metadata") or {}).items() if k != "managedFields"}
    plain: dict[str, Any] = {
        "apiVersion": raw.get("apiVersion"),
        "kind": raw.get("kind"),
        "metadata": metadata,
        "spec": raw.get("spec") or {},
    }
    conditions = (raw.get("status") or {}).get("conditions")
    if conditions:
        plain["status"] = {"conditions": conditions}
    return plain


def no_diffbase() -> Any:
    """A kopf diff-base storage that keeps nothing and builds nothing.

    NB: kopf builds an object's "essence" (a deep copy of the whole body, then trimmed) on
    every watch event to detect changes for on-create/update handlers; this operator has only
    event handlers, so the essence was never read — it was the largest single cost of a watch
    event in a replica (every replica sees every Workflow's events).
    """
    import kopf

    class NoDiffBase(kopf.DiffBaseStorage):
        def build(self, *, body: Any, extra_fields: Any = None) -> Any:
            return kopf.BodyEssence()

        def fetch(self, *, body: Any) -> Any:
            return None

        def store(self, *, body: Any, patch: Any, essence: Any) -> None:
            return None

    return NoDiffBase()


MALLOC_ARENAS = 2
"""glibc malloc arenas the operator process uses at most (see :func:`limit_malloc_arenas`)."""

_M_ARENA_MAX = -8
"""``mallopt``'s parameter number for the arena cap (glibc's ``malloc.h``)."""


def limit_malloc_arenas(*, arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas; ``True`` if it was done here.

    NB: glibc gives threads their own arenas (up to 8 per core), and the operator has several
    dozen (the API client's pool, the Lease renewer, asyncio's executor): memory freed in one
    arena is not reused by another, so resident memory crept up with every burst of requests.
    Two arenas keep the process's RSS close to what Python holds. An explicit
    ``MALLOC_ARENA_MAX`` in the environment wins; other C libraries are left alone.
    """
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


def configure_logging(settings: OperatorSettings) -> SecretRedactor:
    """The process log on stderr, with every tracker secret it learns scrubbed.

    Returns the handler's :class:`~lorenz.secrets.SecretRedactor`: each Workflow's controller
    adds its tracker token to it when it builds (or reloads) its runtime, since the tokens come
    from the Workflows' Secrets, not from the operator's environment.
    """
    level = getattr(logging, settings.log_level.upper())
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    redactor = SecretRedactor(tracker_secrets(api_key=None, environ=os.environ))
    for handler in logging.getLogger().handlers:
        handler.addFilter(redactor)
    logging.getLogger("lorenz").setLevel(level)
    # kopf logs every handler invocation at INFO; only its warnings matter here.
    logging.getLogger("kopf").setLevel(logging.DEBUG if level <= logging.DEBUG else logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # httpx logs every tracker request at INFO; its lines come back at log level debug.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else logging.WARNING)
    return redactor


async def run_operator(
    settings: OperatorSettings,
    *,
    ready: Callable[[Supervisor], None] | None = None,
    stop_flag: asyncio.Event | None = None,
    log_redactor: SecretRedactor | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or ``stop_flag``); returns the process exit code."""
    import kopf

    limit_malloc_arenas()
    hide_process_environment()
    install_child_watcher()

    from lorenz.kube.operator import serving

    api = KubeApi.from_kubeconfig(
        kubeconfig=settings.kubeconfig, request_timeout_s=settings.request_timeout_seconds
    )
    metrics = serving.Metrics(api=api)
    timing = settings.lease_timing()
    # NB: Lease renewals get their own connections and threads: they never queue behind
    # status patches, Claim writes or Secret reads.
    lease_api = api.dedicated(request_timeout_s=timing.request_timeout_s)
    coordinator = ShardCoordinator(
        api=lease_api,
        namespace=settings.lease_namespace,
        prefix=settings.lease_name_prefix,
        shards=settings.shards,
        identity=settings.identity,
        timing=timing,
        handover_timeout_s=settings.drain_timeout_seconds + settings.renew_deadline_seconds,
        endpoint=settings.advertise_url,
    )
    supervisor = Supervisor(
        api=api,
        settings=settings,
        coordinator=coordinator,
        metrics=metrics.lorenz,
        log_secrets=log_redactor.add if log_redactor is not None else None,
    )
    auth = (
        KubernetesAuth(api=api, open_paths=settings.api_open_paths)
        if settings.api_auth == "kubernetes"
        else None
    )
    server = serving.OperatorServer(
        supervisor=supervisor, metrics=metrics, settings=settings, auth=auth
    )
    from lorenz.kube.operator.webhooks import WebhookServer

    webhooks = WebhookServer(supervisor=supervisor, metrics=metrics.lorenz, settings=settings)
    try:
        await server.start()
        await webhooks.start()
        coordinator.start()
        registry = build_registry(supervisor)
        ready_flag = asyncio.Event()

        async def announce() -> None:
            await ready_flag.wait()
            logger.info(
                "Operator running identity=%s namespaces=%s api=%s webhooks=%s",
                settings.identity,
                ",".join(settings.namespaces) or "<all>",
                server.url or "off",
                webhooks.url or "off",
            )
            if ready is not None:
                ready(supervisor)

        announcer = asyncio.get_running_loop().create_task(announce())
        try:
            await kopf.operator(
                registry=registry,
                standalone=True,
                clusterwide=not settings.namespaces,
                namespaces=list(settings.namespaces),
                liveness_endpoint=settings.liveness_endpoint,
                stop_flag=stop_flag,
                ready_flag=ready_flag,
            )
        finally:
            announcer.cancel()
    finally:
        await supervisor.shutdown()
        # NB: the operator is exiting: a server that fails to stop changes nothing.
        with contextlib.suppress(Exception):
            await webhooks.stop()
        with contextlib.suppress(Exception):
            await server.stop()
        await lease_api.close()
        await api.close()
    return 0
