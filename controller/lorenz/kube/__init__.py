"""Layer 8: the Kubernetes operator (``lorenz operator``) and its CRDs (``lorenz crds``).

One package per concern, as controller-runtime splits its tree; each imports only the ones
below it (an import-linter contract in pyproject.toml keeps that so), from the top:

* :mod:`~lorenz.kube.operator` — the process: kopf's watches and the supervisor that gives each
  Workflow a controller while its shard is offered here, the metrics and snapshot API, the
  API's token check. Only ``lorenz operator`` imports it.
* :mod:`~lorenz.kube.controller` — one Workflow's lifecycle (term, launch, stop), its status,
  Events, spec loading, continuation holds and cleanup.
* :mod:`~lorenz.kube.settings` — the settings of one operator process (flags, environment).
* :mod:`~lorenz.kube.pods` — runs in Pods of their own: manifests, the exec channel, the
  shared Pod watch, the transport and runner, the sweeps of what runs leave behind.
* :mod:`~lorenz.kube.claims` — the claim store over ``Claim`` resources and the shared lists
  of a namespace's Claims; and, beside it and independent of it,
  :mod:`~lorenz.kube.leaderelection` — Leases with client-go's semantics, their renewals,
  the shards and each Workflow's view of its shard's term.
* :mod:`~lorenz.kube.clients` — the counted REST layer everything above writes through.
* :mod:`~lorenz.kube.api` — the ``lorenz.dev/v1alpha1`` API as data: names, the camelCase
  mapping, the status models, the generated CRDs. Pure, so ``lorenz crds`` loads neither kopf
  nor a Kubernetes client.
* :mod:`~lorenz.kube.errors` and :mod:`~lorenz.kube.rbac` — the coded errors and the verbs the
  operator uses, imported by any of them.

Nothing is re-exported here or in the sub-packages: modules are imported one by one, so a
command loads only what it uses. See docs/operator.md.
"""
