"""The operator's claim store: one ``Claim`` resource per claimed slot, and how they are listed.

:mod:`~lorenz.kube.claims.store` backs the orchestrator's claim port (and the workers' spawn
intents) with Claim objects, fenced by the leader generation of the term that writes them;
:mod:`~lorenz.kube.claims.lists` lists a namespace's Claims (and labelled run objects) once for
all the Workflows that ask together; :mod:`~lorenz.kube.claims.clock` times their pending
retries by the API server's clock. A room of its own because both the controller and the run
Pods write through it, and it must not know either: it sits below them and beside the
leadership, which it never imports (a term's fence is handed to it as plain values).
"""
