"""Runs in Pods of their own (``worker.kind: pod``): one room for everything a run Pod needs.

The modules, from the bottom: :mod:`~lorenz.kube.pods.manifests` (names, labels, the Pod, its
Secret and its workspace claim as manifests, and what a Pod's status says: pure, no I/O),
:mod:`~lorenz.kube.pods.execs` (the API's exec channel), :mod:`~lorenz.kube.pods.watch` (one
shared watch of a namespace's run Pods), :mod:`~lorenz.kube.pods.transport` (launch, probe,
connect, delete: :class:`~lorenz.kube.pods.transport.PodTransport`),
:mod:`~lorenz.kube.pods.runner` (the runner of one run, and the runners of a Workflow) and
:mod:`~lorenz.kube.pods.cleanup` (what a Workflow leaves behind: orphan Pods, workspace claims).
They sit above the claim store (a run's spawn intent goes on its Claim) and know nothing of the
controller, the leadership or the operator process. Nothing is re-exported here.

Each run is one Pod in the Workflow's namespace whose main container runs ``lorenz worker``
for the run's spec, the same worker as everywhere else (journal, control protocol, hooks, the
agent). What the operator adds is where it runs and how it is reached:

* **Placement.** The Pod is named after the run's deterministic handle (lowercased,
  DNS-safe), labelled with the Workflow, the issue and the handle, owned by the Workflow (its
  deletion takes the Pods along), and built from ``worker.pod_template``: the image, resources,
  node selector, tolerations, affinity, ``envFrom`` the Secrets the user names. It runs as a
  non-root user with a read-only root filesystem, no capabilities and the runtime's seccomp
  profile (the ``restricted`` Pod Security Standard), ``automountServiceAccountToken: false``
  and no service links. The worker's state, ``HOME`` and ``/tmp`` are ``emptyDir`` volumes of
  that Pod only; so is the workspace, unless ``worker.workspace.volume_claim_template`` makes
  it a PersistentVolumeClaim of the issue's own
  (:func:`~lorenz.kube.pods.manifests.workspace_claim_manifest`: named after the Workflow and the
  issue, kept across the issue's attempts, deleted when the issue is terminal or the Workflow is
  deleted). Extra volumes (``pod_template.volumes``) are Secrets, ConfigMaps, claims or
  ``emptyDir`` only, never the node's disk or a token.
* **Identity.** The Pod runs as the ServiceAccount ``worker.service_account_name`` names, else
  ``lorenz-agent``, which the operator creates in the namespace when it is missing
  (:class:`~lorenz.kube.pods.transport.AgentAccounts`: no RBAC binding, no token mounted);
  never as the operator's own.
* **The spec** travels in a per-run Secret (``<pod>-spec``) mounted only in that Pod (0440,
  group-readable by the Pod's ``fsGroup``), created right after the Pod and owned by it (by
  uid), so it goes with the Pod however the Pod goes; a launch that dies between the two
  leaves no Secret behind. It holds no tracker credential: host-side tools run in the operator.
* **Start.** The transport waits — up to ``worker.start_timeout_ms`` — until the Pod runs and
  its worker answers a probe. It reads no Pod to find out: every launch of the namespace waits
  on one shared list+watch of the run Pods (:mod:`lorenz.kube.pods.watch`), and the exec probe
  runs only once the watch says the worker's container runs. A Pod that cannot be scheduled,
  whose image cannot be pulled or whose container cannot be created is deleted when the time
  is up, and a create a ResourceQuota refuses fails at once (``pod_refused``): both raise
  :class:`~lorenz.agents.PlacementFailed` with the last reason Kubernetes gave, and the runtime
  gives the slot's reservation back (a placement wait, no attempt counted). Only once the
  worker serves is the reservation bound (``on_placed``: the Pod's name becomes the slot's
  host). A create refused for any other reason (an invalid affinity), or a worker whose
  container runs but does not serve in time, is a failure of the run.
* **The channel** is the API's exec subresource (:mod:`lorenz.kube.pods.execs`): ``lorenz worker
  --bridge`` inside the Pod splices the exec stream onto the worker's unix socket, so the socket
  keeps its 0600 mode and ``SO_PEERCRED`` check, the Pod opens no port and holds no token, and
  the operator needs only ``pods/exec``. Probes and journal catch-ups are short execs.
* **The end.** When the run is settled the Pod and its Secret are deleted; a controller that
  is leaving its workers for the next one (leadership lost, handed over, shut down) leaves the
  Pod running, never deletes it.
* **Adoption.** A run records its spawn intent on its Claim like a local worker (the handle,
  which names the Pod, is built from the leader generation of the term that started it), so a
  newly elected leader finds each Pod through its Claim, re-attaches after the collected
  ``lastSeq`` through the exec channel and runs nothing again. A finished worker in a Pod
  lingers (:data:`~lorenz.kube.pods.manifests.POD_LINGER_MS`) for a controller to collect its final
  record, so a run that ended while no leader watched is settled from it instead of retried. What
  no Claim names — a Pod or spec Secret of a run no Claim holds any more — is the orphan sweep's
  (:func:`~lorenz.kube.pods.cleanup.sweep_run_pods`): deleted at the start of every term.
"""
