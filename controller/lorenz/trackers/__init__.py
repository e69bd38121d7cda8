"""Issue trackers: one protocol (:class:`TrackerClient`), one module per tracker."""

from lorenz.trackers.base import TrackerClient, TrackerError

__all__ = ["TrackerClient", "TrackerError"]
