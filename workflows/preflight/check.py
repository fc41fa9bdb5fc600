"""Pre-flight: the canary pod asks for a resource the node will advertise.

A plan's `gpu-check` steps run a pod bound to the node, asking for one of the check's
`resource`. A node that does not advertise it leaves the pod Pending until the check's
timeout, and the run halts with the node cordoned: every upgrade of a MIG pool under the
mixed strategy (its nodes advertise `nvidia.com/mig-<profile>`, not `nvidia.com/gpu`) and
of a shared pool whose device plugin renames its resource (`nvidia.com/gpu.shared`) would
fail its first canary. So a plan whose check asks for a resource some checked node will
not advertise after the change is refused before anyone approves it.

What a node advertises after the change: the `expect` of its `mig` step when the plan
changes its layout, else what it advertises now (or GFD says it should). A node that
advertises no GPU resource at all says nothing either way and is not judged (its own
findings speak for it).

The refusal says which of the pool's resources would do. When the configuration never
named `gpu_check.resource` (the default, `nvidia.com/gpu`, applied), it asks for one;
when it named one, it says that one is wrong. Pure: the plan, the fleet and the check in
force are arguments."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName, is_gpu_resource
from workflows.plans import Wave
from workflows.pools.config import GpuCheck
from workflows.preflight import check_messages as say

_CHECK_STEP = "gpu-check"
_MIG_STEP = "mig"
# The refusal's codes: the configured resource is wrong; none was configured (the default).
CODE_RESOURCE = "gpu-check-resource"
CODE_RESOURCE_UNSET = "gpu-check-resource-unset"


@dataclass(frozen=True, slots=True)
class CanaryRefusal:
    """A canary pod that cannot run: the sentence a person reads and the refusal's code."""

    reason: str
    code: str


def resource_named(check: GpuCheck | None) -> bool:
    """Whether the configuration wrote `resource` for this check (not its default)."""
    return check is not None and "resource" in check.model_fields_set


def advertised_after(waves: Sequence[Wave], fleet: Fleet, node: NodeName) -> frozenset[str]:
    """The GPU resources `node` advertises once `waves` have changed it (empty: unknown)."""
    for wave in waves:
        for step in wave.steps_for(node):
            if step.kind == _MIG_STEP and isinstance(step.params.get("expect"), Mapping):
                return frozenset(r for r, n in step.params["expect"].items() if is_gpu_resource(r) and n)
    inventory = fleet.nodes.get(node)
    if inventory is None:
        return frozenset()
    return frozenset(r.resource for r in inventory.resources if r.capacity or r.expected)


def canary_refusal(pool: str, waves: Sequence[Wave], *, fleet: Fleet, check: GpuCheck | None,
                   configured_at: str) -> CanaryRefusal | None:
    """Why the canary pods of `pool`'s planned `waves` cannot run, or None when every checked
    node will advertise what its pod asks for. `check` is the check in force (None: the default one) and
    `configured_at` the configuration key it came from (`pools.<pool>.gpu_check`,
    `upgrades.gpu_check`), for the sentence."""
    asks: dict[NodeName, str] = {}
    for wave in waves:
        for step in wave.steps:
            if step.kind == _CHECK_STEP and isinstance(step.params.get("resource"), str):
                asks[step.node] = step.params["resource"]
    after = {node: advertised_after(waves, fleet, node) for node in asks}
    missing = sorted(node for node, resource in asks.items() if after[node] and resource not in after[node])
    if not missing:
        return None
    resource = asks[missing[0]]
    judged = [found for found in after.values() if found]
    on_nodes = Counter(r for found in judged for r in found)
    # The pool's resources every checked node will advertise come first: any one of them works.
    offered = sorted(on_nodes, key=lambda r: (-on_nodes[r], r))
    everywhere = [r for r in offered if on_nodes[r] == len(judged)]
    if resource_named(check):
        return CanaryRefusal(say.canary_resource_not_advertised(
            pool, resource, missing, offered=[(r, on_nodes[r]) for r in offered], fits=everywhere,
            nodes=len(judged), configured_at=configured_at), code=CODE_RESOURCE)
    return CanaryRefusal(say.canary_resource_unset(
        pool, resource, missing, offered=[(r, on_nodes[r]) for r in offered], fits=everywhere,
        nodes=len(judged)), code=CODE_RESOURCE_UNSET)
