"""Running the pinned helm CLI against the chart, offline: lint and template.

The helm binary is the one tests/cluster/build.sh builds from the Go module proxy (pinned in
tests/cluster/versions.env). A missing binary is an error naming the build script, never a
skip: a chart suite that silently skips looks green.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import Binaries

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "lorenz"


def helm_binary() -> Path:
    binaries = Binaries.locate()
    reason = binaries.missing_reason(["helm"])
    if reason is not None:
        raise RuntimeError(reason)
    return binaries.path("helm")


def helm(
    *args: str, check: bool = True, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run helm offline (no kubeconfig is read: lint and template never contact a cluster)."""
    return subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=timeout,
        env={"HOME": "/nonexistent", "PATH": "/usr/bin:/bin", "KUBECONFIG": "/dev/null"},
    )


def values_args(values: Mapping[str, Any] | None, tmp: Path) -> list[str]:
    """``--values <file>`` for a values mapping (written as JSON, which is YAML)."""
    if not values:
        return []
    path = tmp / f"values-{len(list(tmp.glob('values-*.json')))}.json"
    path.write_text(json.dumps(values))
    return ["--values", str(path)]


def template(
    *,
    tmp: Path,
    values: Mapping[str, Any] | None = None,
    release: str = "lorenz",
    namespace: str = "lorenz-system",
    extra: Sequence[str] = (),
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    return helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        *values_args(values, tmp),
        *extra,
        check=check,
    )


def render(
    *,
    tmp: Path,
    values: Mapping[str, Any] | None = None,
    release: str = "lorenz",
    namespace: str = "lorenz-system",
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The rendered objects (empty documents dropped)."""
    out = template(tmp=tmp, values=values, release=release, namespace=namespace, extra=extra)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def by_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
