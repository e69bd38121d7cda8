"""Lorenz turns issue-tracker work into coding-agent runs.

The package is layered (see ``docs/architecture.md``): pure data and settings at the bottom,
the scheduling core above them, adapters for the outside world above that, and the composition
roots (the CLI, the daemon, the Kubernetes operator) at the top. Imports only point down; an
import-linter contract in CI enforces it.
"""

__version__ = "0.1.0"
