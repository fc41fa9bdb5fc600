"""PodDisruptionBudgets a run would meet: for every budget that selects pods the run moves,
how many disruptions it allows now and the most pods of it one wave moves. A budget that
allows fewer than a wave needs holds the run up: each eviction is retried for the pool's
`drain_timeout`, then the run does what `pdb_timeout_action` says (halt, skip the node, or
delete the pods where the pool allows it).

`budget_impacts` is the one count (a drain's preview lists every impact; the other kinds
read it through `budget_notes`, the pre-flight check of a planned plan)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from workflows.kube.objects import DisruptionBudget, NodeName, PodObject
from workflows.plans import Plan, PreflightNote
from workflows.pools.capacity import gpu_pods_moved
from workflows.preflight import messages as say
from workflows.preflight.facts import PlanFacts

BUDGETS_CHECK = "budgets"


class BudgetReader(Protocol):
    """Where a plan reads PodDisruptionBudgets (`kube.gateway.KubeGateway`)."""

    def list_disruption_budgets(self, namespace: str) -> Sequence[DisruptionBudget]: ...


def budgets_of(reader: BudgetReader | None, pods: Sequence[PodObject]) -> list[DisruptionBudget]:
    """The budgets of the namespaces `pods` run in (none without a reader)."""
    if reader is None:
        return []
    return [pdb for namespace in sorted({p.namespace for p in pods})
            for pdb in reader.list_disruption_budgets(namespace)]


@dataclass(frozen=True, slots=True)
class PdbImpact:
    """A PDB that selects pods a run moves."""

    namespace: str
    name: str
    disruptions_allowed: int
    pods: tuple[str, ...]
    most_in_one_wave: int

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def may_block(self) -> bool:
        """Moving one wave's pods needs more disruptions than the PDB allows now."""
        return self.most_in_one_wave > self.disruptions_allowed


def budget_impacts(waves: Sequence[Sequence[NodeName]], pods_by_node: Mapping[NodeName, Sequence[PodObject]],
                   budgets: Sequence[DisruptionBudget]) -> tuple[PdbImpact, ...]:
    """Every budget selecting pods that `waves` move (`pods_by_node`: the pods each node's
    change moves), by namespace and name."""
    impacts = []
    for pdb in sorted(budgets, key=lambda p: (p.namespace, p.name)):
        per_wave = [[pod for node in nodes for pod in pods_by_node.get(node, ()) if pdb.selects(pod)]
                    for nodes in waves]
        selected = [f"{pod.namespace}/{pod.name}" for wave in per_wave for pod in wave]
        if selected:
            impacts.append(PdbImpact(namespace=pdb.namespace, name=pdb.name,
                                     disruptions_allowed=pdb.disruptions_allowed, pods=tuple(selected),
                                     most_in_one_wave=max(len(w) for w in per_wave)))
    return tuple(impacts)


def gpu_pods_by_node(plan: Plan, gpu_pods: Sequence[PodObject]) -> dict[NodeName, tuple[PodObject, ...]]:
    """The GPU pods a change of each of the plan's nodes moves off it (waited for or evicted)."""
    by_ref = {f"{p.namespace}/{p.name}": p for p in gpu_pods}
    moved: dict[NodeName, tuple[PodObject, ...]] = {}
    for node in plan.nodes:
        found = gpu_pods_moved(gpu_pods, node)
        moved[node] = tuple(by_ref[ref] for ref in (*found.waited, *found.evicted))
    return moved


def budget_notes(plan: Plan, facts: PlanFacts) -> tuple[PreflightNote, ...]:
    """The pre-flight check: every budget a wave of `plan` needs more disruptions of than it
    allows now, with its pods and what the run will do."""
    moved = gpu_pods_by_node(plan, facts.gpu_pods)
    impacts = budget_impacts([wave.nodes for wave in plan.waves], moved, facts.budgets)
    notes = []
    for impact in impacts:
        if not impact.may_block:
            continue
        on = tuple(node for node, pods in moved.items()
                   if any(f"{p.namespace}/{p.name}" in impact.pods for p in pods))
        notes.append(PreflightNote(
            check=BUDGETS_CHECK, code="budget-blocks", severity="warning", nodes=on, details=impact.pods,
            sentence=say.budget_blocks(impact.ref, allowed=impact.disruptions_allowed,
                                       needed=impact.most_in_one_wave, pods=impact.pods,
                                       timeout=facts.policy.drain_timeout,
                                       action=facts.policy.pdb_timeout_action, by_operator=facts.by_operator)))
    return tuple(notes)
