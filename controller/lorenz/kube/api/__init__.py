"""The ``lorenz.dev/v1alpha1`` API as data: what the operator's objects are called and look like.

Names of everything the operator creates (:mod:`~lorenz.kube.api.resources`), the camelCase
mapping of the spec (:mod:`~lorenz.kube.api.casing`), the status and Claim models
(:mod:`~lorenz.kube.api.statuses`), their conversion to structural schemas
(:mod:`~lorenz.kube.api.schemas`) and the CRDs built from them (:mod:`~lorenz.kube.api.crds`).
Like controller-runtime's API types it does no I/O and imports nothing else of the operator, so
``lorenz crds``, the chart's generator and the tests use it without a cluster; everything else
in :mod:`lorenz.kube` builds on it.
"""
