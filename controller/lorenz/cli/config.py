"""``lorenz config``: the configuration Lorenz would actually use, and where each flag came from.

After defaults, ``$VAR`` and path resolution, flags and features, the effective settings can
differ a lot from what the file says; this prints them (secrets as ``***``) with, for every flag
and feature, its value and its source (``cli``, ``front-matter``, ``env``, ``default``). Text
output is YAML for people; ``--json`` is for scripts. Errors go to stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from lorenz.cli import EXIT_OK, EXIT_USAGE
from lorenz.cli.options import add_workflow_arguments, load_from_args, print_problems

if TYPE_CHECKING:
    from lorenz.workflow import LoadedWorkflow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workflow_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from lorenz.workflow import WorkflowError

    try:
        loaded = load_from_args(args)
    except WorkflowError as exc:
        print_problems([exc], stream=sys.stderr)
        return EXIT_USAGE
    for warning in loaded.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    report = effective_report(loaded)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_as_text(report), end="")
    return EXIT_OK


def effective_report(loaded: LoadedWorkflow) -> dict[str, Any]:
    """The JSON document ``lorenz config --json`` prints."""
    from lorenz.workflow import flag_report, redacted_settings

    return {
        "path": str(loaded.path),
        "settings": redacted_settings(loaded.settings),
        "flags": flag_report(loaded.flag_sources),
        "features": flag_report(loaded.feature_sources),
        "prompt": {
            "default": loaded.prompt.is_default,
            "template": loaded.prompt.text,
        },
        "warnings": list(loaded.warnings),
    }


def _as_text(report: dict[str, Any]) -> str:
    import yaml

    lines = [f"# effective configuration of {report['path']}"]
    lines.append(yaml.safe_dump(report["settings"], sort_keys=False, default_flow_style=False))
    lines.append("# flags (value  <- source)")
    for key, flag in report["flags"].items():
        lines.append(f"{key} = {_scalar(flag['value'])}  <- {_source(flag)}")
    lines.append("")
    lines.append("# features")
    for name, feature in report["features"].items():
        state = "on" if feature["value"] else "off"
        lines.append(f"{name} = {state}  <- {_source(feature)}")
    lines.append("")
    prompt = "default prompt" if report["prompt"]["default"] else "prompt from the WORKFLOW.md body"
    count = len(report["prompt"]["template"].splitlines())
    lines.append(f"# {prompt}, {count} line{'' if count == 1 else 's'}")
    return "\n".join(lines) + "\n"


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else str(value)


def _source(entry: dict[str, Any]) -> str:
    return f"{entry['source']} ({entry['via']})" if entry.get("via") else str(entry["source"])
