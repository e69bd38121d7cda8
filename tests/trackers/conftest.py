"""The tracker tests run against the local fakes of Linear and GitHub."""

# The fake-tracker fixtures come from the `tests.fakes` plugin (see tests/conftest.py).
