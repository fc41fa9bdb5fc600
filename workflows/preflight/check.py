"""Pre-flight: the canary pod asks for a resource the node will advertise.

A plan's `gpu-check` steps run a pod bound to the node, asking for `count` of the check's
`resource` (one unless configured). A node that does not advertise it, or advertises fewer
than the pod asks for, leaves the pod Pending until the check's
timeout, and the run halts with the node cordoned: every upgrade of a MIG pool under the
mixed strategy (its nodes advertise `nvidia.com/mig-<profile>`, not `nvidia.com/gpu`) and
of a shared pool whose device plugin renames its resource (`nvidia.com/gpu.shared`) would
fail its first canary. So a plan whose check asks for a resource some checked node will
not advertise after the change is refused before anyone approves it.

What a node advertises after the change: the `expect` of its `mig` step when the plan
changes its layout, else what it advertises now (or GFD says it should). A node that
advertises no GPU resource at all says nothing either way and is not judged (its own
findings speak for it).

The refusal says which of the pool's resources would do (for a count the node cannot give,
how many each named node will advertise). When the configuration never
named `gpu_check.resource` (the default, `nvidia.com/gpu`, applied), it asks for one;
when it named one, it says that one is wrong; when the check in force is turned off
(`enabled: false`) and the change runs the default test pod anyway (a move does), it says
to turn the check on with a resource the nodes advertise. Pure: the plan, the fleet and
the check in force are arguments."""

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
# The check asks for more of its resource than a node will advertise.
CODE_COUNT = "gpu-check-count"


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
    return frozenset(counts_after(waves, fleet, node))


def counts_after(waves: Sequence[Wave], fleet: Fleet, node: NodeName) -> dict[str, int]:
    """How many of each GPU resource `node` advertises once `waves` have changed it (empty:
    unknown): its `mig` step's `expect`, else the more of what GFD says it should advertise
    and what it advertises now."""
    for wave in waves:
        for step in wave.steps_for(node):
            if step.kind == _MIG_STEP and isinstance(step.params.get("expect"), Mapping):
                return {r: n for r, n in step.params["expect"].items()
                        if is_gpu_resource(r) and isinstance(n, int) and n > 0}
    inventory = fleet.nodes.get(node)
    if inventory is None:
        return {}
    return {r.resource: max(r.capacity, r.expected or 0) for r in inventory.resources if r.capacity or r.expected}


def canary_refusal(pool: str, waves: Sequence[Wave], *, fleet: Fleet, check: GpuCheck | None,
                   configured_at: str) -> CanaryRefusal | None:
    """Why the canary pods of `pool`'s planned `waves` cannot run, or None when every checked
    node will advertise what its pod asks for. `check` is the check in force (None: the default one);
    a check turned off (`enabled: false`) is passed as it is when the change runs the default
    test pod despite it. `configured_at` is the configuration key it came from
    (`pools.<pool>.gpu_check`, `upgrades.gpu_check`), for the sentence."""
    asks: dict[NodeName, str] = {}
    counts: dict[NodeName, int] = {}
    for wave in waves:
        for step in wave.steps:
            if step.kind == _CHECK_STEP and isinstance(step.params.get("resource"), str):
                asks[step.node] = step.params["resource"]
                count = step.params.get("count")
                if isinstance(count, int) and not isinstance(count, bool) and count > counts.get(step.node, 1):
                    counts[step.node] = count
    numbers = {node: counts_after(waves, fleet, node) for node in asks}
    after = {node: frozenset(found) for node, found in numbers.items()}
    missing = sorted(node for node, resource in asks.items() if after[node] and resource not in after[node])
    if not missing:
        return _count_refusal(pool, asks, counts, numbers, configured_at=configured_at)
    resource = asks[missing[0]]
    judged = [found for found in after.values() if found]
    on_nodes = Counter(r for found in judged for r in found)
    # The pool's resources every checked node will advertise come first: any one of them works.
    offered = sorted(on_nodes, key=lambda r: (-on_nodes[r], r))
    everywhere = [r for r in offered if on_nodes[r] == len(judged)]
    shown = [(r, on_nodes[r]) for r in offered]
    if check is not None and not check.enabled:
        # Turned off, yet the change runs the default test pod (a move always runs one):
        # naming a resource in a check that stays off would not change which pod runs.
        return CanaryRefusal(say.canary_default_while_off(
            pool, resource, missing, offered=shown, fits=everywhere, nodes=len(judged), configured_at=configured_at),
            code=CODE_RESOURCE_UNSET)
    if resource_named(check):
        return CanaryRefusal(say.canary_resource_not_advertised(
            pool, resource, missing, offered=shown, fits=everywhere, nodes=len(judged), configured_at=configured_at),
            code=CODE_RESOURCE)
    return CanaryRefusal(say.canary_resource_unset(pool, resource, missing, offered=shown, fits=everywhere,
                                                   nodes=len(judged)), code=CODE_RESOURCE_UNSET)


def _count_refusal(pool: str, asks: Mapping[NodeName, str], counts: Mapping[NodeName, int],
                   numbers: Mapping[NodeName, Mapping[str, int]], *, configured_at: str) -> CanaryRefusal | None:
    """A check pod asking for more of its resource than its node will advertise stays
    Pending as surely as one asking for a resource the node lacks."""
    short = {node: numbers[node][asks[node]] for node, count in counts.items()
             if asks[node] in numbers[node] and numbers[node][asks[node]] < count}
    if not short:
        return None
    first = min(short)
    return CanaryRefusal(say.canary_count_not_advertised(
        pool, asks[first], counts[first], {node: short[node] for node in sorted(short)},
        configured_at=configured_at), code=CODE_COUNT)
