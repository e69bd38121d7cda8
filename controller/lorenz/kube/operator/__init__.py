"""The operator process: what runs as ``lorenz operator``, around the Workflow controllers.

:mod:`~lorenz.kube.operator.process` (kopf's watches, the supervisor that makes a Workflow's
controller while its shard is offered here, start-up and shutdown),
:mod:`~lorenz.kube.operator.serving` (``/metrics`` and the snapshot API for every Workflow the
process leads) and :mod:`~lorenz.kube.operator.api_auth` (who may read that API). The top of
:mod:`lorenz.kube`, as controller-runtime's manager: only the CLI imports it, and it is the only
room that loads kopf.
"""
