"""The terminal view of a foreground run (layer 7): lanes, poll countdown, totals, events.

``render_snapshot`` draws one snapshot; ``TerminalView`` keeps it live on a terminal while the
runtime runs; ``attachment_factory`` is what the single-host composition root registers.
"""

from lorenz.tui.rendering import render_snapshot
from lorenz.tui.view import TerminalView, attachment_factory

__all__ = ["TerminalView", "attachment_factory", "render_snapshot"]
