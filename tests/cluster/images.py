"""Container images for the test node, built without a Docker engine.

- the sandbox ("pause") image: our static `pause` command (tests/cluster/tools/pause) as a
  one-layer OCI archive written here byte by byte — no tool needed;
- `lorenz-base`: Debian bookworm with python3 (3.11, what the project needs) and pip, from
  Debian packages with mmdebstrap, imported by buildah. It stands in for the public
  `python:3.11-slim` base, which cannot be pulled here;
- `lorenz`: the project's own Dockerfile, built by buildah (`bud`, chroot isolation, vfs
  storage) with `--build-arg PYTHON_IMAGE=<lorenz-base>`; users' builds keep the public default;
- `lorenz-agent`: the project image plus the scripted test agent (/opt/lorenz-test/agent.py).

Each image is an OCI archive under ~/.cache/lorenz/images (or $LORENZ_IMAGE_CACHE), named by a
hash of its inputs (the Dockerfile, the files the wheel is built from, the base's inputs), so a
second run builds nothing; `Node.import_image()` loads them into containerd's `k8s.io`
namespace. A file lock makes concurrent sessions wait for one build instead of racing it.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.controlplane import Binaries

REPO = Path(__file__).resolve().parents[2]
PAUSE_IMAGE = "localhost/lorenz-pause:test"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-pip", "passwd", "ca-certificates")
# NB: where a TLS-inspecting proxy sits between this machine and PyPI, pip inside the build
# only trusts it with the host's extra CAs; they are copied into the base (and hashed).
HOST_EXTRA_CAS = Path("/usr/local/share/ca-certificates")
# What the Dockerfile's builder stage copies (and .dockerignore keeps): the wheel's inputs.
WHEEL_INPUTS = ("pyproject.toml", "README.md", "controller")


class ImageError(RuntimeError):
    """An image could not be built."""


def cache_dir() -> Path:
    env = os.environ.get("LORENZ_IMAGE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lorenz" / "images"


@dataclass(frozen=True)
class Image:
    """A built image: its reference inside containerd and its OCI archive."""

    ref: str
    archive: Path


def _hash_files(paths: Iterable[Path], digest: hashlib._Hash) -> None:
    for path in sorted(paths):
        if path.is_dir():
            files = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
            )
        else:
            files = [path]
        for file in files:
            digest.update(
                str(file.relative_to(REPO) if file.is_relative_to(REPO) else file).encode()
            )
            digest.update(b"\0")
            digest.update(file.read_bytes())
            digest.update(b"\0")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _log(line: str) -> None:
    with (cache_dir() / "build.log").open("a") as out:
        out.write(line.rstrip("\n") + "\n")


def _run(argv: list[str], *, timeout: float = 1800.0) -> str:
    _log(f"== {time.strftime('%FT%TZ', time.gmtime())} {' '.join(argv)}")
    with (cache_dir() / "build.log").open("ab") as out:
        done = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=out, timeout=timeout, check=False
        )
        out.write(done.stdout)
    if done.returncode != 0:
        tail = "\n".join((cache_dir() / "build.log").read_text(errors="replace").splitlines()[-30:])
        raise ImageError(
            f"{argv[0]} {argv[1] if len(argv) > 1 else ''} exited with "
            f"{done.returncode}; log {cache_dir() / 'build.log'}:\n{tail}"
        )
    return done.stdout.decode(errors="replace")


def _buildah(*args: str, timeout: float = 1800.0) -> str:
    storage = cache_dir()
    return _run(
        [
            "buildah",
            f"--root={storage / 'storage'}",
            f"--runroot={storage / 'runroot'}",
            "--storage-driver=vfs",
            *args,
        ],
        timeout=timeout,
    )


def _record_time(ref: str, seconds: float) -> None:
    with (cache_dir() / "build-times.txt").open("a") as out:
        out.write(f"{time.strftime('%FT%TZ', time.gmtime())} {ref} {seconds:.0f}s\n")


def _push(ref: str, archive: Path) -> None:
    tmp = archive.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    _buildah("push", ref, f"oci-archive:{tmp}:{ref}")
    tmp.replace(archive)


def _have(tool: str) -> None:
    if shutil.which(tool) is None:
        raise ImageError(
            f"{tool} not found: run scripts/install-node-deps (apt-get install buildah "
            "mmdebstrap) or ./scripts/bootstrap"
        )


# -- pause ------------------------------------------------------------------------------------


def _tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def pause_image(binaries: Binaries | None = None) -> Image:
    """The sandbox image (`PAUSE_IMAGE`): one layer with /pause, written as an OCI archive."""
    binaries = binaries or Binaries.locate()
    pause = binaries.path("pause").read_bytes()
    layer = _tar_bytes({"pause": (pause, 0o755)})
    layer_gz = gzip.compress(layer, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [_sha(layer)]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _sha(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _sha(layer_gz),
                    "size": len(layer_gz),
                }
            ],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _sha(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": PAUSE_IMAGE,
                        "org.opencontainers.image.ref.name": PAUSE_IMAGE.rsplit(":", 1)[1],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    blobs = {
        f"blobs/sha256/{_sha(blob).split(':')[1]}": (blob, 0o644)
        for blob in (layer_gz, config, manifest)
    }
    archive_bytes = _tar_bytes(
        {
            "oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644),
            "index.json": (index, 0o644),
            **blobs,
        }
    )
    cache_dir().mkdir(parents=True, exist_ok=True)
    archive = cache_dir() / f"lorenz-pause-{hashlib.sha256(archive_bytes).hexdigest()[:16]}.oci.tar"
    if not archive.exists():
        tmp = archive.with_suffix(".tmp")
        tmp.write_bytes(archive_bytes)
        tmp.replace(archive)
    return Image(ref=PAUSE_IMAGE, archive=archive)


# -- base, project, agent --------------------------------------------------------------------


def _extra_cas() -> list[Path]:
    with contextlib.suppress(OSError):
        return sorted(p for p in HOST_EXTRA_CAS.iterdir() if p.suffix == ".crt" and p.is_file())
    return []


def base_key() -> str:
    digest = hashlib.sha256()
    digest.update(f"{DEBIAN_SUITE} {DEBIAN_MIRROR} {' '.join(BASE_PACKAGES)} v1".encode())
    _hash_files(_extra_cas(), digest)
    return digest.hexdigest()[:16]


def base_image() -> Image:
    """Debian bookworm + python3/pip as `localhost/lorenz-base:<hash>` (mmdebstrap, buildah)."""
    key = base_key()
    ref = f"localhost/lorenz-base:{key}"
    archive = cache_dir() / f"lorenz-base-{key}.oci.tar"
    with _locked():
        if archive.exists() and _in_storage(ref):
            return Image(ref=ref, archive=archive)
        _have("mmdebstrap")
        _have("buildah")
        began = time.monotonic()
        rootfs = cache_dir() / "base-rootfs.tar"
        hooks = [
            '--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
            '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
        ]
        cas = _extra_cas()
        if cas:
            hooks.append(
                "--customize-hook=cp "
                + " ".join(str(p) for p in cas)
                + ' "$1"/usr/local/share/ca-certificates/'
            )
            hooks.append('--customize-hook=chroot "$1" update-ca-certificates')
        _run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--mode=root",
                f"--include={','.join(BASE_PACKAGES)}",
                *hooks,
                DEBIAN_SUITE,
                str(rootfs),
                DEBIAN_MIRROR,
            ]
        )
        container = f"lorenz-base-{os.getpid()}"
        _buildah("from", f"--name={container}", "scratch")
        try:
            _buildah("add", container, str(rootfs), "/")
            _buildah(
                "config",
                "--env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env=LANG=C.UTF-8",
                "--cmd=python3",
                f"--label=org.opencontainers.image.description=Debian {DEBIAN_SUITE} + python3",
                container,
            )
            _buildah("commit", container, ref)
        finally:
            with contextlib.suppress(ImageError):
                _buildah("rm", container)
        rootfs.unlink(missing_ok=True)
        _push(ref, archive)
        _record_time(ref, time.monotonic() - began)
        _prune()
    return Image(ref=ref, archive=archive)


def _in_storage(ref: str) -> bool:
    if shutil.which("buildah") is None:
        return False
    done = subprocess.run(
        [
            "buildah",
            f"--root={cache_dir() / 'storage'}",
            f"--runroot={cache_dir() / 'runroot'}",
            "--storage-driver=vfs",
            "inspect",
            "--type=image",
            ref,
        ],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def project_key(base: Image) -> str:
    digest = hashlib.sha256(base.ref.encode())
    _hash_files([REPO / "Dockerfile", REPO / ".dockerignore"], digest)
    _hash_files([REPO / name for name in WHEEL_INPUTS], digest)
    return digest.hexdigest()[:16]


def project_image() -> Image:
    """The project's Dockerfile built from `base_image()`: `localhost/lorenz:<hash>`."""
    base = base_image()
    key = project_key(base)
    ref = f"localhost/lorenz:{key}"
    archive = cache_dir() / f"lorenz-{key}.oci.tar"
    with _locked():
        if archive.exists() and _in_storage(ref):
            return Image(ref=ref, archive=archive)
        _have("buildah")
        began = time.monotonic()
        _buildah(
            "bud",
            "--isolation=chroot",
            "--pull=false",
            "--layers=false",
            f"--build-arg=PYTHON_IMAGE={base.ref}",
            f"--file={REPO / 'Dockerfile'}",
            f"--tag={ref}",
            str(REPO),
        )
        _push(ref, archive)
        _record_time(ref, time.monotonic() - began)
        _prune()
    return Image(ref=ref, archive=archive)


def agent_image(agent_script: str) -> Image:
    """The project image plus `agent_script` at /opt/lorenz-test/agent.py."""
    project = project_image()
    key = hashlib.sha256(f"{project.ref}\0{agent_script}".encode()).hexdigest()[:16]
    ref = f"localhost/lorenz-agent:{key}"
    archive = cache_dir() / f"lorenz-agent-{key}.oci.tar"
    with _locked():
        if archive.exists() and _in_storage(ref):
            return Image(ref=ref, archive=archive)
        began = time.monotonic()
        context = cache_dir() / f"agent-context-{os.getpid()}"
        shutil.rmtree(context, ignore_errors=True)
        context.mkdir()
        try:
            (context / "agent.py").write_text(agent_script)
            (context / "Containerfile").write_text(
                f"FROM {project.ref}\nCOPY agent.py /opt/lorenz-test/agent.py\n"
            )
            _buildah(
                "bud",
                "--isolation=chroot",
                "--pull=false",
                f"--file={context / 'Containerfile'}",
                f"--tag={ref}",
                str(context),
            )
        finally:
            shutil.rmtree(context, ignore_errors=True)
        _push(ref, archive)
        _record_time(ref, time.monotonic() - began)
        _prune()
    return Image(ref=ref, archive=archive)


# How many builds of each image stay cached (archive + buildah storage, ~0.3 + 0.7 GB each
# for the project image): a few, so checkouts of different code on one machine do not rebuild
# each other's image on every run, without the cache growing with every change.
KEEP_BUILDS = 2
_ARCHIVE = re.compile(r"^(lorenz|lorenz-agent|lorenz-base)-([0-9a-f]{16})\.oci\.tar$")


def _prune() -> None:
    """Delete all but the KEEP_BUILDS newest builds of each image (children before bases).
    Called with the cache lock held, after a build."""
    by_name: dict[str, list[tuple[float, Path, str]]] = {}
    for archive in cache_dir().glob("lorenz-*.oci.tar"):
        match = _ARCHIVE.match(archive.name)
        if match is None:
            continue
        name, key = match.groups()
        with contextlib.suppress(OSError):
            by_name.setdefault(name, []).append((archive.stat().st_mtime, archive, key))
    for name in ("lorenz-agent", "lorenz", "lorenz-base"):
        builds = sorted(by_name.get(name, []), reverse=True)
        for _, archive, key in builds[KEEP_BUILDS:]:
            if shutil.which("buildah") is not None:
                with contextlib.suppress(ImageError):
                    _buildah("rmi", "--force", f"localhost/{name}:{key}")
            archive.unlink(missing_ok=True)
