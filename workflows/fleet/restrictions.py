"""Restrictions a person put on a GPU node: a cordon gpuops did not make, taints no
controller owns, and labels and annotations a person's tool set. Kubernetes keeps no age
for any of them, so gpuops ages them from its own first-seen records
(`workflows.fleet.first_seen`, aspects `cordon`, `taints` and `hand-set`); a restriction
older than `inventory.forgotten_after` with no run on the node and no note
(`workflows.fleet.notes`) is the `restriction-forgotten` finding
(`workflows.fleet.findings.forgotten_restrictions`).

Which taints are a person's: every taint but those Kubernetes, cloud controllers and
autoscalers set (by key prefix, `CONTROLLER_TAINT_PREFIXES`), and but those every node
of the pool carries (a pool-wide taint is the pool's design, e.g. a dedicated-GPU taint,
not a node's restriction).

Which labels and annotations are a person's: those the node's `managedFields` give to a
person's tool (kubectl, k9s, Lens; `workflows.fleet.node_detail.hand_set_fields`), but the
pool label and those every node of the pool carries alike (`hand_set_marks`). Where that
is computed: where the node is read, not in the watch cache. The cache decodes nodes
without their `managedFields` (`workflows.kube.wire` skips them: at 5,000 nodes they would
be most of a node's bytes, for a question asked of one node at a time), so cordons and
taints are aged fleet-wide from the cache, and labels and annotations when `/gpu node`
GETs the node (as it does for its "set by hand" section): their first-seen record starts at
the first such look, and their part of the finding shows in `/gpu node`, not in `/gpu
findings` or the handover.

Also here: GPU pods a pool's `workloads` placement does not take that reach its nodes by
tolerating the taints meant to keep them off (`tolerated_around`, the
`placement-tolerated` finding).

Pure: values in, values out; no clock, no database.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from workflows.fleet.assessment import NodeInventory
from workflows.kube.objects import NodeName, NodeObject, PodObject, Taint, Toleration

# Taints a controller puts on and takes off by itself (the node lifecycle controller, the
# cloud node controller, cluster autoscaler, Karpenter): never a person's forgotten one.
CONTROLLER_TAINT_PREFIXES = (
    "node.kubernetes.io/",
    "node.cloudprovider.kubernetes.io/",
    "node-role.kubernetes.io/",
    "karpenter.sh/",
    "ToBeDeletedByClusterAutoscaler",
    "DeletionCandidateOfClusterAutoscaler",
)

CORDONED = "cordoned"


def taint_text(taint: Taint) -> str:
    """"key=value:Effect", or "key:Effect" without a value, as kubectl writes it."""
    return f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}"


def person_taints(node: NodeObject) -> tuple[str, ...]:
    """The node's taints no controller owns, as text, sorted."""
    return tuple(sorted({taint_text(t) for t in node.taints if not t.key.startswith(CONTROLLER_TAINT_PREFIXES)}))


def taint_state(node: NodeObject) -> str | None:
    """The node's person-set taints as one first-seen state (None: none), so their age is
    the age of this set: a taint added or removed starts the count again."""
    taints = person_taints(node)
    return ",".join(taints) if taints else None


def cordon_state(inv: NodeInventory) -> str | None:
    """`CORDONED` when a person cordoned the node (not gpuops, or before a gpuops run,
    which leaves that cordon in place when it ends); None otherwise."""
    if not inv.cordoned or (inv.cordoned_by is not None and not inv.cordoned_before_run):
        return None
    return CORDONED


@dataclass(frozen=True, slots=True, kw_only=True)
class Restricted:
    """One node's restrictions set by a person, with when gpuops first saw each."""

    inv: NodeInventory
    cordoned_since: dt.datetime | None = None  # None: not cordoned by a person
    taints: tuple[str, ...] = ()  # beyond the pool's own
    taints_since: dt.datetime | None = None
    # Nodes gpuops has no node object for (a fleet source without the watch cache):
    # their taints are not known.
    taints_known: bool = True
    # Labels and annotations a person's tool set, as text (`hand_set_marks`); known only
    # where the node was read with its managed fields (`/gpu node`).
    marks: tuple[str, ...] = ()
    marks_since: dt.datetime | None = None


class HandMark(Protocol):
    """A label, annotation or taint a person's tool owns on the node
    (`workflows.fleet.node_detail.HandSet`)."""

    @property
    def what(self) -> str: ...  # "label" | "annotation" | "taint" (taints: the `taints` aspect's)

    @property
    def key(self) -> str: ...

    @property
    def value(self) -> str: ...


def hand_set_marks(found: Iterable[HandMark], *, pool_label: str,
                   pool_nodes: Sequence[NodeObject]) -> tuple[str, ...]:
    """The labels ("label key=value") and annotations ("annotation key": their values can
    be long) a person's tool set on the node, sorted; but the pool label and those every
    one of at least two `pool_nodes` carries with the same value (the pool's design)."""
    def everywhere(mark: HandMark) -> bool:
        if len(pool_nodes) < 2:
            return False
        held = [n.labels if mark.what == "label" else n.annotations for n in pool_nodes]
        return all(h.get(mark.key) == mark.value for h in held)

    texts = set()
    for mark in found:
        if mark.what not in ("label", "annotation") or mark.key == pool_label or everywhere(mark):
            continue
        texts.add(f"label {mark.key}={mark.value}" if mark.what == "label" else f"annotation {mark.key}")
    return tuple(sorted(texts))


def marks_state(marks: Sequence[str]) -> str | None:
    """The marks as one first-seen state (None: none), so a mark added, removed or given
    another value starts the count again, as for taints."""
    return ",".join(marks) if marks else None


def pool_wide_taints(nodes: Iterable[Sequence[str]]) -> frozenset[str]:
    """The taints every one of at least two nodes carries."""
    sets = [frozenset(each) for each in nodes]
    if len(sets) < 2:
        return frozenset()
    return frozenset.intersection(*sets)


def restricted_nodes(invs: Iterable[NodeInventory], *, objects: Mapping[NodeName, NodeObject] | None,
                     pools: Mapping[str, Sequence[NodeName]],
                     since: Mapping[tuple[str, NodeName], dt.datetime]) -> tuple[Restricted, ...]:
    """The nodes with a person's cordon or taint. `objects` are the node objects (None:
    unknown, only cordons are read); `pools` every pool's nodes, to leave out pool-wide
    taints; `since` the first-seen time of (aspect, node) for the aspects `cordon` and
    `taints` (see `workflows.fleet.first_seen`)."""
    taints_of: dict[NodeName, tuple[str, ...]] = {}
    if objects is not None:
        taints_of = {name: person_taints(obj) for name, obj in objects.items()}
    wide = {pool: pool_wide_taints(taints_of.get(n, ()) for n in names) for pool, names in pools.items()}
    found = []
    for inv in invs:
        cordoned = cordon_state(inv) is not None
        taints = tuple(t for t in taints_of.get(inv.name, ()) if t not in wide.get(inv.pool, frozenset()))
        if not cordoned and not taints:
            continue
        found.append(Restricted(inv=inv, cordoned_since=since.get(("cordon", inv.name)) if cordoned else None,
                                taints=taints, taints_since=since.get(("taints", inv.name)) if taints else None,
                                taints_known=objects is not None))
    return tuple(found)


# --------------------------------------------------------------------------------------
# Pods that tolerate their way around a pool's placement


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes' ToleratesTaint: the effect matches (or the toleration names none), and
    the key and value match (Exists takes any value; an empty key with Exists, any key)."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    return toleration.operator in ("", "Equal") and toleration.key == taint.key and toleration.value == taint.value


def keeping_taints(node: NodeObject) -> tuple[Taint, ...]:
    """The node's taints that keep pods off (NoSchedule, NoExecute) and that no controller
    set (a cordon's taint is the cordon's, not the pool's design)."""
    return tuple(t for t in node.taints if t.effect in ("NoSchedule", "NoExecute")
                 and not t.key.startswith(CONTROLLER_TAINT_PREFIXES))


@dataclass(frozen=True, slots=True)
class ToleratedAround:
    """A GPU pod the pool's placement does not take, on a node whose taints would keep it
    off but for its tolerations."""

    pod: str  # namespace/name
    use: str  # "mig" | "full_gpu"
    taints: tuple[str, ...]  # the taints it tolerates, as text
    tolerates_every_taint: bool  # an `operator: Exists` toleration with no key


def tolerated_around(inv: NodeInventory, node: NodeObject, pods: Sequence[PodObject]) -> tuple[ToleratedAround, ...]:
    """The pods of `inv.misplaced` that reach `node` only by tolerating its taints."""
    taints = keeping_taints(node)
    if not inv.misplaced or not taints:
        return ()
    by_name = {f"{p.namespace}/{p.name}": p for p in pods}
    found = []
    for name, use in inv.misplaced:
        pod = by_name.get(name)
        if pod is None:
            continue
        tolerations = pod.placement.tolerations
        crossed = tuple(taint_text(t) for t in taints if any(tolerates(x, t) for x in tolerations))
        if crossed:
            found.append(ToleratedAround(pod=name, use=use, taints=crossed, tolerates_every_taint=any(
                x.key == "" and x.operator == "Exists" for x in tolerations)))
    return tuple(found)


@runtime_checkable
class PodsOnNodes(Protocol):
    """A fleet source that also hands out the pods it keeps on a node (the watch cache)."""

    def pods_on(self, node: str) -> list[PodObject]: ...
