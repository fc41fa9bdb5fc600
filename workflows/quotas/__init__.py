"""GPU ResourceQuotas against the pools they can draw on: per namespace, the quota on
each GPU resource (`requests.nvidia.com/gpu`, MIG slices, shared GPUs), what its pods use,
the pools its pods can land on (node selectors, required node affinity, tolerations
against taints) and what those pools advertise; and the flags an SRE acts on: quotas
that exceed what the pools advertise, pools whose namespaces' quotas add to more than
they have, namespaces with no quota that can take a serving pool's last GPUs, quota
entries Kubernetes does not enforce. Pure evaluation over plain views (`reach`,
`report`), the sentences (`messages`) and the service that reads quotas through the
gateway and nodes and pods from the watch cache (`service`), which also answers a plan's
pre-flight with the quotas a change would no longer fit (`preflight.facts.QuotaLimits`).
Imports `preflight.facts`, `fleet`, `kube` and the bottom modules."""
