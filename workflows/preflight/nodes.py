"""Nodes with an open finding a change would not fix: a plan leaves them out of its waves
unless the request names them, and says so either way, with what happens if one is changed.

Which findings count: every open critical or warning finding about the node (GPUs missing,
two driver sources, a failed driver, NotReady, a failed canary before, GPU health...),
except those that say where pods run rather than whether the node works
(`NOT_ABOUT_THE_NODE`: validation and the canary do not read them), and those the kind is
expected to clear (its registry entry's `fixes`, workflows/kinds.py: a drain clears none, a
driver upgrade a failed or crash-looping driver, a MIG change a failed layout, a move to
the operator two driver sources). An info finding never leaves a node out.

A request names a node with `--include <node>` (one shared option in every kind's words),
or by naming the node itself among its targets (a person who asks to drain a broken node
means it). `screen_nodes` runs once per plan, before the rolling order is built, the same
for every kind."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from workflows.fleet.assessment import NodeInventory
from workflows.fleet.findings import SEVERITY_ORDER, Finding
from workflows.fleet.summary import Fleet
from workflows.kinds import kinds_in_force
from workflows.plans import PreflightNote, PreflightSeverity
from workflows.pools.planning import Refuser
from workflows.preflight import messages as say

NODES_CHECK = "nodes"

# Findings about where pods run or what a person left behind, not whether the node works:
# validation and the canary do not read them, so they never leave a node out.
NOT_ABOUT_THE_NODE = frozenset({"cordon-left-behind", "restriction-forgotten", "placement-tolerated",
                                "workload-misplaced"})


@dataclass(frozen=True, slots=True)
class NodeScreen:
    """The nodes a plan changes (in the order given) and what the screen says about the others."""

    kept: tuple[NodeInventory, ...]
    left_out: tuple[str, ...]
    notes: tuple[PreflightNote, ...]


def open_findings(fleet: Fleet, node: str) -> tuple[Finding, ...]:
    """The node's open critical and warning findings that say whether it works."""
    return tuple(f for f in fleet.findings_about(node)
                 if f.severity in ("critical", "warning") and f.code not in NOT_ABOUT_THE_NODE)


def named_in_request(include: Sequence[str], targets: Sequence[str] = (), *, fleet: Fleet) -> tuple[str, ...]:
    """The nodes a request names: `--include`'s and the node names among its targets."""
    return tuple(dict.fromkeys((*include, *(t for t in targets if t in fleet.nodes))))


def screen_nodes(candidates: Sequence[NodeInventory], *, fleet: Fleet, kind: str, pool: str,
                 include: Collection[str] = (), canary: str | None = None, refused: Refuser) -> NodeScreen:
    """`candidates` without the nodes whose open findings `kind` does not fix, unless
    `include` names them. Refuses (as the kind refuses) an `include` naming a node that is
    not a candidate, and a screen that leaves no node."""
    change = kinds_in_force()[kind]
    what = change.noun.partition(" ")[2] or change.name
    strangers = [n for n in include if n not in {c.name for c in candidates}]
    if strangers:
        raise refused(say.include_not_planned(strangers, what=what, pool=pool), code="include-not-planned")
    kept: list[NodeInventory] = []
    left: list[str] = []
    notes: list[PreflightNote] = []
    for node in candidates:
        found = open_findings(fleet, node.name)
        blocking = [f for f in found if f.code not in change.fixes]
        fixed = [f for f in found if f.code in change.fixes]
        if fixed:
            notes.append(PreflightNote(check=NODES_CHECK, code="fixed-by-change", severity="info", nodes=(node.name,),
                                       sentence=say.node_fixed_by_change(node.name, codes=_codes(fixed), what=what),
                                       details=_lines(fixed)))
        if not blocking:
            kept.append(node)
            continue
        severity: PreflightSeverity = "critical" if min(SEVERITY_ORDER[f.severity] for f in blocking) == 0 else "warning"
        if node.name in include:
            kept.append(node)
            notes.append(PreflightNote(check=NODES_CHECK, code="included", severity=severity, nodes=(node.name,),
                                       sentence=say.node_included(node.name, codes=_codes(blocking), what=what),
                                       details=_lines(blocking)))
        elif node.name == canary:
            # The pool's own canary goes first or the run does not go: no order without it.
            raise refused(say.canary_left_out(node.name, codes=_codes(blocking), what=what, pool=pool),
                          code="canary-has-findings")
        else:
            left.append(node.name)
            notes.append(PreflightNote(check=NODES_CHECK, code="left-out", severity=severity, nodes=(node.name,),
                                       sentence=say.node_kept_out(node.name, codes=_codes(blocking), what=what),
                                       details=_lines(blocking)))
    if candidates and not kept:
        raise refused(say.every_node_left_out(pool, what=what, nodes=left), code="every-node-has-findings")
    return NodeScreen(kept=tuple(kept), left_out=tuple(left), notes=tuple(notes))


def _codes(findings: Sequence[Finding]) -> list[str]:
    return list(dict.fromkeys(f.code for f in findings))


def _lines(findings: Sequence[Finding]) -> tuple[str, ...]:
    return tuple(say.finding_line(f.code, f.message) for f in findings)
