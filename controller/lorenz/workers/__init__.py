"""Workers: each run executes in a ``lorenz worker`` process of its own, outliving controllers.

* :mod:`~lorenz.workers.spec` — the run spec and its deterministic handle;
* :mod:`~lorenz.workers.launch` — starting a worker detached (its own session and group);
* :mod:`~lorenz.workers.worker` — the worker: hooks, the agent session, the journal, the socket;
* :mod:`~lorenz.workers.journal` — numbered records, append-only JSON lines;
* :mod:`~lorenz.workers.protocol` — the control protocol (NDJSON over a unix socket);
* :mod:`~lorenz.workers.states` — the state directory and what a probe proves;
* :mod:`~lorenz.workers.client`, :mod:`~lorenz.workers.handles` — the controller's side;
* :mod:`~lorenz.workers.ssh` — SSH placement (stream-local socket forwarding).

``docs/runs.md`` describes the lifecycle, formats and the adoption table.
"""
