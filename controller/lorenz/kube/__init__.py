"""Layer 8: the Kubernetes operator (``lorenz operator``) and its CRDs (``lorenz crds``).

Modules, imported one by one (nothing is re-exported here, so ``lorenz crds`` never loads
kopf or the Kubernetes client): ``crds``/``schemas``/``casing``/``statuses`` (the API, generated
from the models), ``specs`` (a Workflow object → a loaded workflow), ``clients`` (the counted
REST layer), ``leases`` (:class:`~lorenz.kube.leases.KubernetesLeaseProvider`), ``claims``
(:class:`~lorenz.kube.claims.ClaimResourceStore`), ``controllers`` (one per Workflow),
``operator`` (kopf and the process), ``serving`` (metrics and snapshot API), ``posting``
(Kubernetes Events), ``settings`` (:class:`~lorenz.kube.settings.OperatorSettings`), ``rbac``
(the verbs). See docs/operator.md.
"""
