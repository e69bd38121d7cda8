"""``lorenz crds``: print, write or check the Kubernetes CustomResourceDefinitions.

The CRDs are generated from the settings and status models (:mod:`lorenz.kube.api.crds`); the
committed ``crds/*.yaml`` are this command's output. ``--check`` is what CI and the test suite
run to catch a model change that was not regenerated.

Exit codes: 0 ok, 1 ``--check`` found stale or missing files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--write",
        metavar="DIR",
        type=Path,
        default=None,
        help="write one <plural>.lorenz.dev.yaml per CRD into DIR (e.g. crds/)",
    )
    group.add_argument(
        "--check",
        metavar="DIR",
        type=Path,
        default=None,
        help="exit 1 if the CRD files in DIR are missing or differ from the models",
    )


def run(args: argparse.Namespace) -> int:
    from lorenz.kube.api import crds

    if args.write is not None:
        for path in crds.write(args.write):
            print(path)
        return 0
    if args.check is not None:
        stale = crds.stale_files(args.check)
        for name in stale:
            print(
                f"crds_stale: {args.check / name} differs from the models; "
                f"run `lorenz crds --write {args.check}`",
                file=sys.stderr,
            )
        return 1 if stale else 0
    sys.stdout.write(crds.render_all())
    return 0
