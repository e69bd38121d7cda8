"""pytest glue for tests that need a real Kubernetes API: the `kube_control_plane` fixture.

Loaded suite-wide through `pytest_plugins` in tests/conftest.py, so any test under tests/ (the
operator tests in tests/kube/ included) can ask for `kube_control_plane` or `kube_namespace`.

The backend is chosen by `--test-cluster=envtest|kind` or $LORENZ_TEST_CLUSTER (default
envtest): envtest starts etcd + kube-apiserver + kube-controller-manager from the binaries
tests/cluster/build.sh builds; kind uses pytest-kind's `kind_cluster` (needs Docker). Both give
the same `tests.cluster.cluster.Cluster`.

`kube_node` (session) adds a real node to it — kubelet + containerd + runc in namespaces of
its own (tests/cluster/node.py) plus kube-scheduler — so Pods run; on kind the cluster's own
node stands in (images loaded with `kind load image-archive`). `node_images` builds the
project's image without Docker (tests/cluster/images.py) and loads it into the node.
`kwok_nodes` (module) adds 100 fake nodes kept by the kwok controller (tests/cluster/kwok.py):
Pods that tolerate and select them are scheduled there and Running at once, running nothing.

Missing binaries or a control plane that does not come up make every test that uses the
fixture fail (an error at setup), never skip: a skipped cluster suite looks green.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest

from tests.cluster.cluster import Cluster, cluster_from_kubeconfig
from tests.cluster.controlplane import (
    BUILD_SCRIPT,
    Binaries,
    ControlPlane,
    ControlPlaneError,
    runs_root,
)
from tests.cluster.kwok import FakeNodes
from tests.cluster.node import KindNode, Node, NodeError

BACKENDS = ("envtest", "kind")
_ENV_BACKEND = "LORENZ_TEST_CLUSTER"
_CLUSTER_FIXTURES = frozenset({"kube_control_plane", "kube_namespace", "kube_node", "kwok_nodes"})


@dataclass
class _SessionState:
    backend: str
    control_plane: ControlPlane | None = None
    startup_seconds: float | None = None
    node: Node | None = None


_STATE = pytest.StashKey[_SessionState]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lorenz-cluster", "Kubernetes test cluster")
    group.addoption(
        "--test-cluster",
        choices=BACKENDS,
        default=None,
        help=f"Cluster backend for `cluster` tests (default: ${_ENV_BACKEND} or envtest).",
    )


def _backend(config: pytest.Config) -> str:
    chosen = config.getoption("--test-cluster") or os.environ.get(_ENV_BACKEND) or "envtest"
    if chosen not in BACKENDS:
        raise pytest.UsageError(f"{_ENV_BACKEND}={chosen!r}: expected one of {BACKENDS}")
    return str(chosen)


def pytest_configure(config: pytest.Config) -> None:
    # NB: pyproject.toml registers it too; this keeps the plugin usable on its own (-p).
    config.addinivalue_line("markers", "cluster: needs the real Kubernetes test control plane")
    config.stash[_STATE] = state = _SessionState(backend=_backend(config))
    if state.backend == "kind" and not getattr(config.option, "kind_kubectl_bin", None):
        # NB: pytest-kind would otherwise download kubectl v1.25 (no network here, and far
        # too old): hand it the one build.sh made, when there is one.
        own = Binaries.locate().path("kubectl")
        if own.is_file():
            config.option.kind_kubectl_bin = str(own)


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash[_STATE]
    if state.backend == "kind":
        return ["test cluster: kind (pytest-kind `kind_cluster`; needs Docker)"]
    binaries = Binaries.locate()
    v = binaries.versions
    missing = binaries.missing()
    status = f"MISSING {', '.join(missing)} (run {BUILD_SCRIPT})" if missing else "built"
    return [
        f"test cluster: envtest (kubernetes {v.get('K8S_VERSION')}, etcd {v.get('ETCD_VERSION')}, "
        f"helm {v.get('HELM_VERSION')}); binaries {binaries.directory}: {status}",
        f"control-plane logs: under {runs_root()}/ (exact directory in the summary)",
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Whatever uses the cluster is a `cluster` test, so `-m "not cluster"` deselects it even
    # when its author forgot the mark.
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if _CLUSTER_FIXTURES.intersection(fixtures) and "cluster" not in item.keywords:
            item.add_marker(pytest.mark.cluster)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    state = terminalreporter.config.stash.get(_STATE, None)
    if state is None or state.control_plane is None:
        return
    took = f" (started in {state.startup_seconds:.1f}s)" if state.startup_seconds else ""
    terminalreporter.write_line(f"control-plane logs: {state.control_plane.log_dir}{took}")
    if state.node is not None and "ready" in state.node.timings:
        terminalreporter.write_line(
            f"test node: kubelet/containerd logs in the same directory (Ready in "
            f"{state.node.timings['ready']:.1f}s, node start {state.node.timings['total']:.1f}s)"
        )


@contextlib.contextmanager
def _terminate_means_interrupt() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt while the control plane runs.

    NB: Python dies on SIGTERM without running finalizers or atexit; as KeyboardInterrupt it
    unwinds like Ctrl-C, pytest tears the session fixtures down and the processes are stopped.
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous: dict[signal.Signals, object] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            if signal.getsignal(sig) is signal.SIG_DFL:
                previous[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _envtest(state: _SessionState) -> Iterator[Cluster]:
    binaries = Binaries.locate()
    missing = binaries.missing_reason()
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    control_plane = ControlPlane(binaries=binaries)
    state.control_plane = control_plane
    # NB: atexit covers an exit that skips fixture teardown; stop() is idempotent.
    atexit.register(control_plane.stop)
    try:
        with _terminate_means_interrupt():
            began = time.monotonic()
            failure: str | None = None
            try:
                cluster = control_plane.start()
            except ControlPlaneError as err:
                failure = f"test control plane did not start: {err}"
            if failure is not None:  # NB: outside `except`, so no chained-traceback noise
                pytest.fail(failure, pytrace=False)
            state.startup_seconds = time.monotonic() - began
            yield cluster
    finally:
        control_plane.stop()
        atexit.unregister(control_plane.stop)


def _kind(request: pytest.FixtureRequest, workdir: Path) -> Cluster:
    kind = request.getfixturevalue("kind_cluster")  # pytest-kind: creates the cluster
    binaries = Binaries.locate()
    own_kubectl = binaries.path("kubectl")
    kubectl = own_kubectl if own_kubectl.is_file() else Path(kind.kubectl_path).resolve()
    return cluster_from_kubeconfig(
        backend="kind",
        kubeconfig=Path(kind.kubeconfig_path).resolve(),
        workdir=workdir,
        kubectl_bin=kubectl,
        helm_bin=binaries.path("helm"),
    )


@pytest.fixture(scope="session")
def kube_control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A running Kubernetes cluster for the whole session (see tests.cluster.cluster.Cluster)."""
    state = request.config.stash[_STATE]
    if state.backend == "kind":
        yield _kind(request, tmp_path_factory.mktemp("kind"))
        return
    yield from _envtest(state)


@pytest.fixture
def kube_namespace(kube_control_plane: Cluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = kube_control_plane.create_namespace()
    yield name
    kube_control_plane.delete_namespace(name, wait=False)


@pytest.fixture(scope="session")
def kube_node(
    request: pytest.FixtureRequest, kube_control_plane: Cluster
) -> Iterator[Node | KindNode]:
    """A Ready node that runs the test cluster's Pods (see tests.cluster.node.Node).

    Test Pods must tolerate `tests.cluster.node.NODE_TOLERATION` (the node is tainted so that
    other tests' Pods stay Pending as before) and use images loaded with `import_image()`.
    """
    state = request.config.stash[_STATE]
    if state.backend == "kind":
        yield KindNode.from_kind(request.getfixturevalue("kind_cluster"), kube_control_plane)
        return
    assert state.control_plane is not None
    node = Node(control_plane=state.control_plane, binaries=Binaries.locate())
    atexit.register(node.stop)
    try:
        with _terminate_means_interrupt():
            failure: str | None = None
            try:
                node.start()
            except NodeError as err:
                failure = f"test node did not start: {err}"
            if failure is not None:
                pytest.fail(failure, pytrace=False)
            state.node = node
            yield node
    finally:
        node.stop()
        atexit.unregister(node.stop)


@dataclass(frozen=True)
class NodeImages:
    """The images `node_images` built and loaded: references for Pod specs."""

    project: str  # the project's Dockerfile on the Debian base: python3, `lorenz`


@pytest.fixture(scope="session")
def node_images(kube_node: Node | KindNode) -> NodeImages:
    """The project's image (its Dockerfile, built by buildah on the Debian base), in the node.

    NB: only this one is imported: it contains the base's layer, and every import unpacks
    (tens of seconds on a busy host)."""
    from tests.cluster.images import ImageError, project_image

    failure: str | None = None
    try:
        project = project_image()
        kube_node.import_image(project.archive)
    except (ImageError, NodeError) as err:
        failure = f"test images could not be built or loaded: {err}"
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    return NodeImages(project=project.ref)


@pytest.fixture(scope="session")
def kube_scheduler(request: pytest.FixtureRequest, kube_control_plane: Cluster) -> None:
    """The control plane's kube-scheduler runs (on envtest it is started if the test node or
    the fake nodes have not started it yet; kind has its own), so a Pod that fits no node gets
    ``PodScheduled=False`` instead of waiting unscheduled with no condition at all."""
    from tests.cluster.scheduler import ensure_scheduler

    state = request.config.stash[_STATE]
    if state.backend == "kind":
        return
    assert state.control_plane is not None
    try:
        ensure_scheduler(state.control_plane, Binaries.locate())
    except ControlPlaneError as err:
        pytest.fail(f"kube-scheduler did not start: {err}", pytrace=False)


@pytest.fixture(scope="module")
def kwok_nodes(
    request: pytest.FixtureRequest,
    kube_control_plane: Cluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[FakeNodes]:
    """100 fake nodes, Ready (see tests.cluster.kwok.FakeNodes); deleted after the module.

    Pods land there only with `FAKE_TOLERATION` and `FAKE_NODE_SELECTOR`. On envtest the
    control plane's kube-scheduler is started if the test node has not started it yet.
    """
    from tests.cluster.scheduler import ensure_scheduler

    state = request.config.stash[_STATE]
    binaries = Binaries.locate()
    if state.backend == "kind":
        work = tmp_path_factory.mktemp("kwok")
        nodes = FakeNodes(
            cluster=kube_control_plane, binaries=binaries, directory=work, log_dir=work
        )
    else:
        control_plane = state.control_plane
        assert control_plane is not None
        assert control_plane.pki is not None
        nodes = FakeNodes(
            cluster=kube_control_plane,
            binaries=binaries,
            directory=control_plane.run_dir / "kwok",
            log_dir=control_plane.log_dir,
            tls=(control_plane.pki.serving.cert, control_plane.pki.serving.key),
        )
    atexit.register(nodes.stop)
    try:
        with _terminate_means_interrupt():
            failure: str | None = None
            try:
                if state.backend != "kind":
                    assert state.control_plane is not None
                    ensure_scheduler(state.control_plane, binaries)
                nodes.start()
            except ControlPlaneError as err:
                failure = f"kwok fake nodes did not start: {err}"
            if failure is not None:
                pytest.fail(failure, pytrace=False)
            yield nodes
    finally:
        nodes.stop()
        atexit.unregister(nodes.stop)
