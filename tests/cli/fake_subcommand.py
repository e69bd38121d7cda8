"""A stand-in subcommand module for CLI dispatch tests (records what it was given)."""

from __future__ import annotations

import argparse

from lorenz.model import LorenzError
from lorenz.workflow import MissingWorkflowFile, TemplateRenderError

CALLS: list[argparse.Namespace] = []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow", nargs="?")
    parser.add_argument("--flag", action="append", default=[])
    parser.add_argument("--behave", default="ok")


def run(args: argparse.Namespace) -> int:
    CALLS.append(args)
    if args.behave == "interrupt":
        raise KeyboardInterrupt
    if args.behave == "config-error":
        raise MissingWorkflowFile("cannot read x; pass a readable file")
    if args.behave == "template-error":
        raise TemplateRenderError("bad prompt", key_path="prompt")
    if args.behave == "runtime-error":
        raise LorenzError("the tracker went away; retry later", code="tracker_down")
    if args.behave == "crash":
        raise RuntimeError("bug")
    return 0
