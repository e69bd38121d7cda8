"""``lorenz teardown``: stop an operator release and leave nothing held, before its RBAC goes.

The Helm chart runs it as a ``pre-delete`` hook Job (see :mod:`lorenz.kube.operator.teardown`
for the steps); run it by hand before deleting an operator installed without Helm, or after a
``helm uninstall --no-hooks``. It reads the operator's own settings (``--namespaces``,
``--lease-namespace``, ``--lease-name-prefix``, ``--kubeconfig``; or their
``LORENZ_OPERATOR_*`` variables, as the chart sets them) plus its own two flags.

Exit codes: 0 when every step succeeded, 1 when a step failed or the operator's Pods did not
stop in time (the log names it), 2 for invalid settings or missing credentials.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from lorenz.cli import operator as operator_cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deployment",
        dest="teardown_deployment",
        default=None,
        metavar="NAME",
        help="the operator's Deployment in --lease-namespace: scaled to 0 first, and its Pods "
        "waited for (unset: the operator is already stopped)",
    )
    parser.add_argument(
        "--timeout",
        dest="teardown_timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long the operator's Pods get to stop (default: 120)",
    )
    operator_cli.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from lorenz.kube.clients import KubeApi
    from lorenz.kube.errors import InvalidOperatorSettings, KubeConfigMissing
    from lorenz.kube.operator.process import configure_logging
    from lorenz.kube.operator.teardown import teardown
    from lorenz.kube.settings import OperatorSettings, load_settings

    flags = {field: getattr(args, field, None) for field in OperatorSettings.model_fields}
    try:
        settings = load_settings(flags=flags)
    except InvalidOperatorSettings as exc:
        print(f"lorenz teardown: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)

    async def main() -> int:
        api = KubeApi.from_kubeconfig(
            kubeconfig=settings.kubeconfig, request_timeout_s=settings.request_timeout_seconds
        )
        try:
            report = await teardown(
                api=api, settings=settings, deployment=args.teardown_deployment,
                timeout_s=args.teardown_timeout,
            )
        finally:
            await api.close()
        for failure in report.failures:
            print(f"lorenz teardown: {failure}", file=sys.stderr)
        return 0 if report.ok else 1

    try:
        return asyncio.run(main())
    except KubeConfigMissing as exc:
        print(f"lorenz teardown: {exc}", file=sys.stderr)
        return 2
