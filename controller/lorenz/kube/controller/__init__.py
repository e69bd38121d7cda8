"""One Workflow's controller: its runtime's lifecycle while this replica leads it, and its output.

:mod:`~lorenz.kube.controller.workflow` holds
:class:`~lorenz.kube.controller.workflow.WorkflowController`, which is the lifecycle only (a term
begins, the runtime is launched, and stops in one of four ways). Beside it, each concern it hands
off:

* :mod:`~lorenz.kube.controller.publisher` — the status, patched settled and rate-limited;
  :mod:`~lorenz.kube.controller.status` — what the status says, as a pure function;
* :mod:`~lorenz.kube.controller.posting` — Kubernetes Events from runtime events;
* :mod:`~lorenz.kube.controller.specs` and :mod:`~lorenz.kube.controller.candidates` — a
  Workflow's spec loaded into a workflow, and the candidate the runtime reloads from;
* :mod:`~lorenz.kube.controller.holds` — the continuation limit and its holds;
* :mod:`~lorenz.kube.controller.placement` — ``Degraded`` after runs that could not be placed;
* :mod:`~lorenz.kube.controller.answers` — answers to waiting agents, from Claims;
* :mod:`~lorenz.kube.controller.enforcement` — whether the run Pods' NetworkPolicy is enforced
  (a probe Pod), as the ``NetworkPolicyEnforced`` condition;
* :mod:`~lorenz.kube.controller.cleanup` — the finalizer, a deleted Workflow's cleanup and the
  sweeps of a new term;
* :mod:`~lorenz.kube.controller.flags` — the small events they wake each other with.

It composes the runtime (:mod:`lorenz.assembly`), the claim store, the Pods and the leadership,
and is driven by the operator process above it, which nothing here imports.
"""
