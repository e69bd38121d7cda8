"""Fixtures of the end-to-end tests: the fake trackers, served in the test's own event loop."""

from __future__ import annotations

# The fake-tracker fixtures come from the `tests.fakes` plugin (see tests/conftest.py).
