"""One list+watch of a namespace's run Pods, shared by every launch waiting for its worker.

A launch of a run in a Pod waits — up to ``worker.start_timeout_ms`` — until its Pod runs the
worker. It used to find that out by reading its Pod (a GET) about twice a second, through the
API client's few threads (:data:`lorenz.kube.clients.CONCURRENT_REQUESTS`): with hundreds of
launches waiting (a cluster pulling images, kwok's fake nodes) the operator wanted hundreds of
GETs a second, got a few dozen, and every other request — Claim writes, Pod creates — waited
seconds in the same queue (bench/README.md, ``kwok_bench.py``). Here one watch per namespace
and API client keeps every run Pod's newest object in memory instead: a list, then a watch
resumed from the newest ``resourceVersion`` it saw (bookmarks keep that fresh), listed again
only when the server says the version is too old (410 Gone). Launches wait on the cache's
change of their Pod, so a thousand waiting launches cost one stream, not a thousand polls, and
the exec probe runs only once the cache says the worker's container runs.

The stream is an ``aiohttp`` request with the API client's credentials
(:class:`~lorenz.kube.pods.execs.PodExec` reads them anew for every connection, so a rotated token
is picked up), not one of the client's threads: a watch holds its request open for minutes. Its
requests are counted in the client's request counter like every other (``list pods``, ``watch
pods``).

Lifecycle: a watch runs while anyone holds it (:meth:`RunPodWatch.held`: every Pod run, from
its launch to its end) and for :data:`LINGER_S` after the last one let go, so a burst of runs
does not start and stop it over and over. Listeners (:meth:`RunPodWatch.listen`) hear every
change, e.g. the Claim store that shows a run's Pod phase and node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

import aiohttp

from lorenz.kube.clients import KubeApi
from lorenz.kube.errors import KubeApiError
from lorenz.kube.pods.execs import PodExec

logger = logging.getLogger(__name__)

RUN_PODS_SELECTOR: Final = "app.kubernetes.io/managed-by=lorenz,lorenz.dev/handle"
"""Every run Pod of every Workflow of a namespace (they all carry a handle label)."""
LINGER_S: Final = 30.0
"""How long a watch nobody holds keeps running (the next run of a burst finds it synced)."""
WATCH_TIMEOUT_S: Final = 290
"""The server ends each watch request after this long; the next one resumes where it ended."""
READ_BUFFER_BYTES: Final = 4 * 1024 * 1024
"""The longest watch event line read (a Pod object with its managed fields is ~10 KiB)."""
MAX_BACKOFF_S: Final = 30.0

PodListener = Callable[[str, Mapping[str, Any] | None], None]
"""``(pod name, newest object or None when deleted)`` after every change the watch sees."""


class _Expired(Exception):
    """The server no longer has the resourceVersion the watch resumes from: list again."""


_BROKEN: Final = (KubeApiError, aiohttp.ClientError, OSError, TimeoutError, ValueError)
"""What ends a watch stream early: it is resumed (or listed again) after a backoff."""


class RunPodWatch:
    """The run Pods of one namespace, as one list+watch sees them (see the module docstring)."""

    def __init__(
        self,
        *,
        api: KubeApi,
        execs: PodExec,
        namespace: str,
        selector: str = RUN_PODS_SELECTOR,
        linger_s: float = LINGER_S,
        on_stop: Callable[[RunPodWatch], None] | None = None,
    ) -> None:
        self.api = api
        self.execs = execs
        self.namespace = namespace
        self.selector = selector
        self.linger_s = linger_s
        self._on_stop = on_stop
        self.pods: dict[str, Mapping[str, Any]] = {}
        """Pod name → the newest object seen (only while :attr:`synced`)."""
        self.synced = asyncio.Event()
        """Set once the first list is in :attr:`pods` (cleared while listing again)."""
        self.lists = 0
        """Lists made so far (the first, and one per 410 or broken stream)."""
        self.streams = 0
        """Watch requests made so far."""
        self._changed: dict[str, set[asyncio.Event]] = {}
        self._listeners: list[PodListener] = []
        self._named: dict[str, list[PodListener]] = {}
        """Listeners of one Pod each (a thousand runs' listeners are not all called for every
        event)."""
        self._holders = 0
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._resource_version: str | None = None

    # -- holding -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[RunPodWatch]:
        """Keep the watch running while inside (started if it is not)."""
        self.hold()
        try:
            yield self
        finally:
            self.release()

    def hold(self) -> None:
        self._holders += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"lorenz-pod-watch:{self.namespace}"
            )

    def release(self) -> None:
        self._holders = max(0, self._holders - 1)
        if self._holders == 0 and self._task is not None and self._idle is None:
            self._idle = asyncio.get_running_loop().call_later(self.linger_s, self._stop_idle)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def _stop_idle(self) -> None:
        self._idle = None
        if self._holders == 0:
            self._cancel()

    def _cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self.synced.clear()
        self.pods.clear()
        self._resource_version = None
        if self._on_stop is not None:
            self._on_stop(self)

    async def close(self) -> None:
        """Stop the stream now (its session closed) whoever holds it."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        task = self._task
        self._cancel()
        if task is not None:
            with contextlib.suppress(BaseException):
                await task

    # -- reading -----------------------------------------------------------------------------

    def get(self, name: str) -> Mapping[str, Any] | None:
        """The newest object of Pod ``name`` the watch saw (``None``: none, or not synced)."""
        return self.pods.get(name) if self.synced.is_set() else None

    async def changed(self, name: str, *, timeout_s: float) -> bool:
        """Wait until the watch sees Pod ``name`` change (or lists again); ``False`` when
        ``timeout_s`` passed first."""
        event = asyncio.Event()
        self._changed.setdefault(name, set()).add(event)
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            waiting = self._changed.get(name)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._changed[name]

    def listen(self, listener: PodListener, *, name: str | None = None) -> Callable[[], None]:
        """Call ``listener`` on every change (of Pod ``name`` only, when given); returns the
        function that stops it."""
        listeners = self._listeners if name is None else self._named.setdefault(name, [])
        listeners.append(listener)

        def stop() -> None:
            with contextlib.suppress(ValueError):
                listeners.remove(listener)
            if name is not None and not listeners and self._named.get(name) is listeners:
                del self._named[name]

        return stop

    # -- the stream --------------------------------------------------------------------------

    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{urllib.parse.quote(self.namespace, safe='')}/pods"

    def _notify(self, name: str, pod: Mapping[str, Any] | None) -> None:
        for event in self._changed.get(name, ()):
            event.set()
        for listener in [*self._listeners, *self._named.get(name, ())]:
            try:
                listener(name, pod)
            except Exception:
                logger.exception("run Pod listener failed pod=%s/%s", self.namespace, name)

    async def _list(self) -> None:
        self.lists += 1
        self.synced.clear()
        body = await self.api.request(
            "GET", self._pods_path(), query={"labelSelector": self.selector}, verb="list"
        )
        before = self.pods
        self.pods = {
            str((item.get("metadata") or {}).get("name")): item
            for item in body.get("items") or []
        }
        self._resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        self.synced.set()
        for name in set(before) | set(self.pods) | set(self._changed):
            pod = self.pods.get(name)
            if pod is None or before.get(name) is not pod:
                self._notify(name, pod)

    async def _run(self) -> None:
        backoff = 1.0
        connector_session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.execs.connect_timeout_s,
                sock_read=WATCH_TIMEOUT_S + 30,
            ),
            read_bufsize=READ_BUFFER_BYTES,
        )
        try:
            while True:
                try:
                    if not self._resource_version or not self.synced.is_set():
                        await self._list()
                    await self._stream(connector_session)
                    backoff = 1.0
                except _Expired:
                    self._resource_version = None
                except asyncio.CancelledError:
                    raise
                except _BROKEN as exc:
                    logger.warning(
                        "run Pod watch broke namespace=%s error=%s; again in %.0f s",
                        self.namespace, exc, backoff,
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            await connector_session.close()

    async def _stream(self, session: aiohttp.ClientSession) -> None:
        """One watch request from the newest resourceVersion, until the server ends it."""
        query = {
            "watch": "true",
            "labelSelector": self.selector,
            "resourceVersion": self._resource_version or "",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT_S),
        }
        url = f"{self.execs.http_base()}{self._pods_path()}?{urllib.parse.urlencode(query)}"
        self.streams += 1
        self.api.requests[("watch", "pods")] += 1
        async with session.get(
            url,
            headers={"Accept": "application/json", **self.execs.auth_headers()},
            ssl=self.execs.ssl_context(),
        ) as response:
            if response.status == 410:
                raise _Expired()
            if response.status != 200:
                text = (await response.text())[:300]
                raise KubeApiError(
                    method="GET", path=self._pods_path(), status=response.status,
                    reason=response.reason or "Error", detail=text,
                )
            async for line in response.content:
                if line.strip():
                    self._event(json.loads(line))

    def _event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        metadata = obj.get("metadata") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired()
            raise ValueError(f"watch error {obj.get('code')}: {obj.get('message')}")
        version = metadata.get("resourceVersion")
        if version:
            self._resource_version = str(version)
        if kind == "BOOKMARK":
            return
        name = str(metadata.get("name"))
        if kind == "DELETED":
            self.pods.pop(name, None)
            self._notify(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self.pods[name] = obj
            self._notify(name, obj)


class RunPodWatches:
    """The :class:`RunPodWatch` of each namespace and API client (and event loop)."""

    def __init__(self, *, linger_s: float = LINGER_S) -> None:
        self.linger_s = linger_s
        self._watches: dict[tuple[int, str, int], RunPodWatch] = {}

    def of(self, *, api: KubeApi, execs: PodExec, namespace: str) -> RunPodWatch:
        key = (id(api), namespace, id(asyncio.get_running_loop()))
        watch = self._watches.get(key)
        if watch is None or watch.api is not api:
            watch = RunPodWatch(
                api=api, execs=execs, namespace=namespace, linger_s=self.linger_s,
                on_stop=lambda stopped: self._forget(key, stopped),
            )
            self._watches[key] = watch
        return watch

    def _forget(self, key: tuple[int, str, int], watch: RunPodWatch) -> None:
        if self._watches.get(key) is watch:
            del self._watches[key]

    async def close(self) -> None:
        """Stop every watch now."""
        for watch in list(self._watches.values()):
            await watch.close()


WATCHES: Final = RunPodWatches()
"""The process's watches (the operator's Workflows of a namespace share one)."""
