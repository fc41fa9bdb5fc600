"""Pre-flight: what else a change touches beyond the nodes it names.

- **Pools that share the driver object.** A plan that sets the version on a driver object
  (its `driver-version` step: the ClusterPolicy, or an NVIDIADriver whose nodeSelector
  covers several pools) changes the driver of every pool that object drives.
- **Workloads left without their resource.** A MIG change makes a node advertise other
  resources (its `mig` step's `expect`): pods on the pool's nodes, or waiting for one
  (Pending), that ask for a resource the pool will no longer advertise lose their place
  here; the note says which pools still advertise it, or that none does.
- **Quotas that will no longer fit.** A namespace's GPU quota that the pools it can land
  on advertise enough for today but not after the change (`QuotaLimit`s, the quota
  report's values, `facts.QuotaLimit`, read through `facts.QuotaLimits`); quotas that
  could not be read are said to be so, not taken for none.
- **The pool's own canary.** A pool whose `gpu_check` asks for a resource the change takes
  away: its next upgrade is refused until the configuration names another.

Pure: the plan and its `PlanFacts` are the arguments."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName, is_gpu_resource
from workflows.plans import Plan, PreflightNote
from workflows.preflight import check_messages as say
from workflows.preflight.facts import PlanFacts

_CHECK = "touches"
_SET_VERSION = "driver-version"
_FINISHED = frozenset({"Succeeded", "Failed"})


def _counts(fleet: Fleet, plan: Plan, node: NodeName, *, after: bool) -> dict[str, int]:
    """What `node` advertises (allocatable, per GPU resource), now or after `plan`."""
    if after:
        for wave in plan.waves:
            for step in wave.steps_for(node):
                if step.kind == "mig" and isinstance(step.params.get("expect"), Mapping):
                    return {r: int(n) for r, n in step.params["expect"].items() if is_gpu_resource(r) and n}
    found = fleet.nodes.get(node)
    return {} if found is None else {r.resource: r.allocatable for r in found.resources if r.allocatable}


def _pool_counts(fleet: Fleet, plan: Plan, pools: Iterable[str], *, after: bool) -> dict[str, int]:
    total: dict[str, int] = {}
    for name in pools:
        pool = fleet.pool(name)
        for node in pool.nodes if pool is not None else ():
            for resource, count in _counts(fleet, plan, node, after=after).items():
                total[resource] = total.get(resource, 0) + count
    return total


def pools_sharing_driver(plan: Plan, fleet: Fleet) -> tuple[PreflightNote, ...]:
    """The other pools of the driver object the plan sets a version on."""
    objects = {f"{s.params.get('object')} {s.params.get('name')}" for w in plan.waves for s in w.steps
               if s.kind == _SET_VERSION and s.params.get("on_failure") is not True}
    managers = {m.ref: m for p in fleet.pools for m in p.driver_managers}
    notes = []
    for key in sorted(objects):
        manager = managers.get(key)
        others = [p for p in manager.pools if p != plan.pool] if manager is not None else []
        if manager is None or not others:
            continue
        sizes = [(p, found.nodes_total if (found := fleet.pool(p)) is not None else 0) for p in others]
        notes.append(PreflightNote(check=_CHECK, code="shared-driver", severity="warning",
                                   sentence=say.shared_driver(manager.ref, sizes)))
    return tuple(notes)


def workloads_left_without(plan: Plan, facts: PlanFacts) -> tuple[PreflightNote, ...]:
    """Pods of the pool (or waiting for a node) asking for a resource it will no longer advertise."""
    fleet = facts.fleet
    pool = fleet.pool(plan.pool)
    if pool is None:
        return ()
    members = set(pool.nodes)
    before = _pool_counts(fleet, plan, [plan.pool], after=False)
    after = _pool_counts(fleet, plan, [plan.pool], after=True)
    gone = sorted(r for r in before if not after.get(r))
    notes = []
    for resource in gone:
        pods = sorted(f"{p.namespace}/{p.name}" for p in facts.gpu_pods
                      if resource in p.gpu_requests and not p.deleting and p.phase not in _FINISHED
                      and (p.node_name is None or p.node_name in members))
        if not pods:
            continue
        elsewhere = sorted(p.name for p in fleet.pools if p.name != plan.pool
                           and _pool_counts(fleet, plan, [p.name], after=True).get(resource))
        notes.append(PreflightNote(check=_CHECK, code="workloads-lose-resource",
                                   severity="warning" if elsewhere else "critical", details=tuple(pods),
                                   sentence=say.workloads_lose_resource(plan.pool, resource, pods,
                                                                        elsewhere=elsewhere)))
    if facts.policy.gpu_check is not None and facts.policy.gpu_check.enabled:
        wanted = facts.policy.gpu_check.resource
        if wanted in before and not after.get(wanted) and after:
            notes.append(PreflightNote(check=_CHECK, code="canary-resource-goes", severity="warning",
                                       sentence=say.canary_resource_goes_away(plan.pool, wanted, sorted(after))))
    return tuple(notes)


def _changes_resources(plan: Plan) -> bool:
    """The plan makes nodes advertise other resources (a `mig` step with what it expects)."""
    return any(s.kind == "mig" and isinstance(s.params.get("expect"), Mapping) for w in plan.waves for s in w.steps)


def quotas_no_longer_fit(plan: Plan, facts: PlanFacts) -> tuple[PreflightNote, ...]:
    """Quotas the pools they land on advertise enough for now, but not after the change;
    when the quotas could not be read, a change of what nodes advertise says so."""
    if facts.quotas_unread is not None and _changes_resources(plan):
        return (PreflightNote(check=_CHECK, code="quotas-unread", severity="info",
                              sentence=say.quotas_unread(facts.quotas_unread)),)
    notes = []
    for limit in sorted(facts.quotas, key=lambda q: (q.namespace, q.resource)):
        if plan.pool not in limit.pools:
            continue
        before = _pool_counts(facts.fleet, plan, limit.pools, after=False).get(limit.resource, 0)
        after = _pool_counts(facts.fleet, plan, limit.pools, after=True).get(limit.resource, 0)
        if limit.hard <= before and limit.hard > after:
            notes.append(PreflightNote(check=_CHECK, code="quota-no-longer-fits", severity="warning",
                                       sentence=say.quota_no_longer_fits(limit.namespace, limit.resource,
                                                                         hard=limit.hard, before=before, after=after,
                                                                         pools=limit.pools)))
    return tuple(notes)


def touch_notes(plan: Plan, facts: PlanFacts) -> tuple[PreflightNote, ...]:
    """The pre-flight check: what else `plan` touches (see the module docstring)."""
    return (*pools_sharing_driver(plan, facts.fleet), *workloads_left_without(plan, facts),
            *quotas_no_longer_fit(plan, facts))
