"""One kube-scheduler per test control plane, shared by the real node and the fake ones.

Both the test node (tests/cluster/node.py) and the kwok fake nodes (tests/cluster/kwok.py)
need Pods scheduled, and both may run in one pytest session (the suite's cluster group). Two
schedulers with the default name and no leader election would both bind every Pod (one of them
refused with a conflict each time) and keep two caches of the same nodes: so the first that
needs one starts it, the other finds it running, and it stops with the control plane.
"""

from __future__ import annotations

from tests.cluster.certs import issue_client_cert
from tests.cluster.cluster import write_kubeconfig
from tests.cluster.controlplane import (
    Binaries,
    ControlPlane,
    ControlPlaneError,
    _free_port,
)

SCHEDULER = "kube-scheduler"


def ensure_scheduler(control_plane: ControlPlane, binaries: Binaries) -> int:
    """Start the control plane's kube-scheduler unless it runs already; its pid."""
    running = control_plane.pids().get(SCHEDULER)
    if running is not None:
        return running
    pki = control_plane.pki
    if pki is None:
        raise ControlPlaneError("control plane has no PKI")
    binaries.require((SCHEDULER,))
    directory = control_plane.run_dir / "scheduler"
    pair = issue_client_cert(
        ca=pki.ca, directory=directory, stem="scheduler", user="system:kube-scheduler"
    )
    cluster = control_plane.cluster
    kubeconfig = write_kubeconfig(
        path=directory / "scheduler.kubeconfig",
        server=cluster.server,
        ca_pem=cluster.ca_pem,
        user="system:kube-scheduler",
        client_cert_pem=pair.cert.read_bytes(),
        client_key_pem=pair.key.read_bytes(),
    )
    process = control_plane._spawn(
        SCHEDULER,
        [
            str(binaries.path(SCHEDULER)),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1",
            f"--secure-port={_free_port()}",
            "--leader-elect=false",
            "--profiling=false",
        ],
    )
    assert process.popen is not None
    return process.popen.pid
