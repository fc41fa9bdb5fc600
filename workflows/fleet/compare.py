"""The nodes of one pool compared: for each property (a label, the taints, the driver
version, kernel, container runtime, MIG layout, and the image version of every operand the
operator runs on them: driver, container toolkit, device plugin, dcgm-exporter, GFD, MIG
manager, validator and any other pod of its namespace, by operand), the value most of the
pool's nodes have and the nodes that differ, so drift is one look (`/gpu compare <pool>`
and a section of `/gpu status <pool>`). A node that does not run an operand the others run
differs with "(none)".

Where it reads from: the watch cache. The cache keeps every GPU node's object (labels,
taints, `status.nodeInfo`) and the operator's pods on it, which is all this needs: no
managed fields are compared (who set a label is `/gpu node`'s question, answered by a
GET of that one node), so the cache keeps nothing more for it and a compare costs no API
call. A fleet source without node objects (`NodeObjects`) gets the inventory's
properties only, and says so.

Labels that are a node's own are left out: the per-node keys in `PER_NODE_LABELS` and,
in a pool of three or more, any label whose value no two nodes share. Labels that are a
state, not a setting (the driver upgrade state, the MIG change state), are left out too.

Pure: values in, values out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from workflows.fleet.assessment import NodeInventory
from workflows.fleet.restrictions import CONTROLLER_TAINT_PREFIXES, taint_text
from workflows.kube.labels import LABEL_MIG_CONFIG_STATE, LABEL_UPGRADE_STATE
from workflows.kube.objects import NodeName, NodeObject

# Labels every node has its own value of (names, ids, times), never drift.
PER_NODE_LABELS = frozenset({
    "kubernetes.io/hostname",
    "nvidia.com/gfd.timestamp",
    "node.kubernetes.io/instance-id",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "alpha.eksctl.io/instance-id",
    "eks.amazonaws.com/nodegroup-image",
    "cloud.google.com/gke-boot-disk",
})
# Labels that say where a change is, not how the node is set up.
STATE_LABELS = frozenset({LABEL_UPGRADE_STATE, LABEL_MIG_CONFIG_STATE})

NONE = "(none)"


@runtime_checkable
class NodeObjects(Protocol):
    """A fleet source that also hands out the node objects it keeps (the watch cache)."""

    def node(self, name: str) -> NodeObject | None: ...


@dataclass(frozen=True, slots=True)
class Drift:
    """One property on which some nodes differ from the pool's majority."""

    name: str  # the property: "label <key>", "taints", "kernel", ...
    majority: str | None  # None: no value is held by more nodes than any other
    # value -> the nodes that have it, for every value but the majority's
    others: tuple[tuple[str, tuple[NodeName, ...]], ...]

    @property
    def nodes(self) -> tuple[NodeName, ...]:
        return tuple(n for _, nodes in self.others for n in nodes)


@dataclass(frozen=True, slots=True)
class PoolComparison:
    pool: str
    nodes: int
    drifts: tuple[Drift, ...]
    with_node_objects: bool

    @property
    def differing(self) -> tuple[NodeName, ...]:
        return tuple(sorted({n for d in self.drifts for n in d.nodes}))


def _taints(node: NodeObject) -> str:
    return ", ".join(sorted(taint_text(t) for t in node.taints
                            if not t.key.startswith(CONTROLLER_TAINT_PREFIXES))) or NONE


_INVENTORY: tuple[tuple[str, Callable[[NodeInventory], str | None]], ...] = (
    ("driver version", lambda i: i.effective_driver_version),
    ("kernel", lambda i: i.node_info.kernel_version),
    ("container runtime", lambda i: i.node_info.container_runtime_version),
    ("MIG layout", lambda i: i.mig.config),
)
# What the inventory knows of the operands when it lists none by name (a fleet source
# that keeps no operand pods).
_KNOWN_OPERANDS: tuple[tuple[str, Callable[[NodeInventory], str | None]], ...] = (
    ("driver pod image", lambda i: i.driver_pod.image_tag),
    ("device plugin image", lambda i: i.device_plugin_pod.image_tag),
    ("validator image", lambda i: i.validator_pod.image_tag),
)


def operand_versions(inv: NodeInventory) -> dict[str, str]:
    """Operand (its `app` label) -> the image tag its best pod on the node runs (live,
    newest first, as `every_operand` orders them)."""
    found: dict[str, str] = {}
    for each in inv.operands:
        found.setdefault(each.operand, each.state.image_tag or NONE)
    return found


def _operand_drifts(invs: Sequence[NodeInventory]) -> list[Drift]:
    versions = {i.name: operand_versions(i) for i in invs}
    operands = sorted({operand for found in versions.values() for operand in found})
    if operands:
        values = {f"{operand} image": {i.name: versions[i.name].get(operand, NONE) for i in invs}
                  for operand in operands}
    else:
        values = {name: {i.name: read(i) or NONE for i in invs} for name, read in _KNOWN_OPERANDS}
    found = (drift_of(name, by_node) for name, by_node in values.items())
    return [each for each in found if each is not None]


def drift_of(name: str, values: Mapping[NodeName, str]) -> Drift | None:
    counts = Counter(values.values())
    if len(counts) < 2:
        return None
    ranked = counts.most_common()
    majority = ranked[0][0] if ranked[0][1] > ranked[1][1] else None
    by_value: dict[str, list[NodeName]] = {}
    for node, value in sorted(values.items()):
        if value != majority:
            by_value.setdefault(value, []).append(node)
    return Drift(name=name, majority=majority,
                 others=tuple((value, tuple(nodes)) for value, nodes in sorted(by_value.items())))


def _own_labels(objects: Sequence[NodeObject]) -> frozenset[str]:
    """Keys whose value no two of the pool's nodes share (with three nodes or more)."""
    if len(objects) < 3:
        return frozenset()
    keys = {k for o in objects for k in o.labels}
    own = set()
    for key in keys:
        values = [o.labels[key] for o in objects if key in o.labels]
        if len(values) == len(objects) and len(set(values)) == len(values):
            own.add(key)
    return frozenset(own)


def compare_pool(pool: str, invs: Sequence[NodeInventory],
                 objects: Mapping[NodeName, NodeObject] | None) -> PoolComparison:
    """The pool's nodes (`invs`) compared property by property; `objects` the node
    objects by name (None: not known, labels and taints are not compared)."""
    drifts: list[Drift] = []
    with_objects = objects is not None
    if objects is not None:
        present = [objects[i.name] for i in invs if i.name in objects]
        skip = PER_NODE_LABELS | STATE_LABELS | _own_labels(present)
        for key in sorted({k for o in present for k in o.labels} - skip):
            found = drift_of(f"label {key}", {o.name: o.labels.get(key, NONE) for o in present})
            if found is not None:
                drifts.append(found)
        taints = drift_of("taints", {o.name: _taints(o) for o in present})
        if taints is not None:
            drifts.append(taints)
    for name, read in _INVENTORY:
        found = drift_of(name, {i.name: read(i) or NONE for i in invs})
        if found is not None:
            drifts.append(found)
    drifts.extend(_operand_drifts(invs))
    return PoolComparison(pool=pool, nodes=len(invs), drifts=tuple(drifts), with_node_objects=with_objects)


def node_objects(source: object, names: Sequence[NodeName]) -> dict[NodeName, NodeObject] | None:
    """The node objects of `names` from `source` when it keeps them (None when not)."""
    if not isinstance(source, NodeObjects):
        return None
    found = {}
    for name in names:
        obj = source.node(name)
        if obj is not None:
            found[name] = obj
    return found
