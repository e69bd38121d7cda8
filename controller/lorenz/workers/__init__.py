"""Worker pools: where runs execute when a pool governs capacity (two-phase dispatch).

The runtime's :class:`~lorenz.runtime.WorkerPool` protocol is what a pool implements; the
single-host shape runs every agent locally and installs no pool.
"""
