"""``lorenz operator``: run the Kubernetes operator (kopf standalone, one Lease per Workflow).

The flags are generated from :class:`lorenz.kube.settings.OperatorSettings` — one per field,
``--lease-duration-seconds`` for ``lease_duration_seconds`` — and each also reads
``LORENZ_OPERATOR_<FIELD>`` from the environment (what the Helm chart sets). A flag wins over
the variable; lists are comma-separated.

Exit codes: 0 after a graceful stop (SIGTERM/SIGINT), 1 when the operator failed, 2 for invalid
settings or missing credentials (nothing started).
"""

from __future__ import annotations

import argparse
import asyncio
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from lorenz.kube.settings import OperatorSettings, env_name, flag_name

    parser.epilog = (
        "Every flag can also be set as LORENZ_OPERATOR_<FLAG> (e.g. "
        "LORENZ_OPERATOR_LEASE_DURATION_SECONDS=15); a flag wins."
    )
    for field, info in OperatorSettings.model_fields.items():
        description = " ".join((info.description or "").split())
        default = "" if info.default_factory is not None else f" (default: {info.default})"
        parser.add_argument(
            flag_name(field),
            dest=field,
            default=None,
            metavar=field.upper().split("_")[-1] if field.endswith("_seconds") else "VALUE",
            help=f"{description}{default} [env {env_name(field)}]".replace("%", "%%"),
        )


def run(args: argparse.Namespace) -> int:
    from lorenz.kube.errors import InvalidOperatorSettings, KubeConfigMissing
    from lorenz.kube.operator.process import configure_logging, run_operator
    from lorenz.kube.settings import OperatorSettings, load_settings

    flags = {field: getattr(args, field, None) for field in OperatorSettings.model_fields}
    try:
        settings = load_settings(flags=flags)
    except InvalidOperatorSettings as exc:
        print(f"lorenz operator: {exc}", file=sys.stderr)
        return 2
    log_redactor = configure_logging(settings)
    try:
        return asyncio.run(run_operator(settings, log_redactor=log_redactor))
    except KubeConfigMissing as exc:
        print(f"lorenz operator: {exc}", file=sys.stderr)
        return 2
