"""Who leads which Workflow: sharded ``coordination.k8s.io`` Leases, as controller-runtime's
leaderelection package, sharded.

From the bottom: one Lease campaigned for with client-go's rules
(:mod:`~lorenz.kube.leaderelection.leases`), the renewals on a thread of their own
(:mod:`~lorenz.kube.leaderelection.renewing`), the shard set balanced between the live replicas
(:mod:`~lorenz.kube.leaderelection.sharding`) and one Workflow's view of its shard's terms
(:mod:`~lorenz.kube.leaderelection.leading`). It needs only the REST client and the API's names:
it knows nothing of Claims, Pods or the runtime, which is what lets the controller treat a term
as a fence and nothing more.
"""
