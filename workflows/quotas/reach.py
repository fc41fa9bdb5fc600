"""Where a pod may land: the scheduler's filters that depend on the node alone, its
nodeSelector, the terms of its required node affinity and its tolerations against the
node's NoSchedule and NoExecute taints. Resources (does the pool advertise what the pod
asks for) are the report's business.

A node's state taints (`node.kubernetes.io/unschedulable` on a cordoned node,
`not-ready`, `unreachable`, the pressure taints) are left out: they come and go with the
node's health or a drain, while the question here is which pools a namespace's pods may
use at all."""

from __future__ import annotations

from collections.abc import Mapping

from workflows.fleet.restrictions import tolerates
from workflows.kube.objects import NodeObject, NodeRequirement, NodeSelectorTerm, Placement, Taint

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
STATE_TAINT_PREFIX = "node.kubernetes.io/"


def blocking_taints(node: NodeObject) -> tuple[Taint, ...]:
    """The taints that keep pods off `node` unless tolerated (state taints left out)."""
    return tuple(t for t in node.taints if t.effect in BLOCKING_EFFECTS and not t.key.startswith(STATE_TAINT_PREFIX))


def untolerated(placement: Placement, node: NodeObject) -> tuple[Taint, ...]:
    return tuple(t for t in blocking_taints(node) if not any(tolerates(o, t) for o in placement.tolerations))


def _integer(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def requirement_holds(requirement: NodeRequirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(requirement.key)
    operator = requirement.operator
    if operator == "In":
        return value is not None and value in requirement.values
    if operator == "NotIn":
        return value is None or value not in requirement.values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        have = _integer(value)
        bound = _integer(requirement.values[0]) if len(requirement.values) == 1 else None
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an operator the API would not accept


def term_holds(term: NodeSelectorTerm, node: NodeObject) -> bool:
    """All of a term's requirements hold; an empty term matches no node. matchFields
    name only `metadata.name`."""
    if not term.match_expressions and not term.match_fields:
        return False
    fields = {"metadata.name": str(node.name)}
    return (all(requirement_holds(r, node.labels) for r in term.match_expressions)
            and all(requirement_holds(r, fields) for r in term.match_fields))


def selects(placement: Placement, node: NodeObject) -> bool:
    """The nodeSelector and the required node affinity (any one term) hold on `node`."""
    if any(node.labels.get(key) != value for key, value in placement.node_selector.items()):
        return False
    return not placement.required_terms or any(term_holds(t, node) for t in placement.required_terms)


def fits(placement: Placement, node: NodeObject) -> bool:
    """A pod with `placement` may be put on `node` (resources aside)."""
    return selects(placement, node) and not untolerated(placement, node)
