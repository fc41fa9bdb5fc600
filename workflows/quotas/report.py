"""The quota report: per namespace (every namespace with a GPU quota or GPU pods), its
quota on each GPU resource, what it uses, the pools it can land on and what they
advertise; per pool, what it advertises and holds; and the flags.

How it counts, as Kubernetes does where it can:
- A quota entry is enforced only as `requests.<resource>`: the quota admission counts an
  extended resource's usage under that name alone, so `nvidia.com/gpu` or
  `limits.nvidia.com/gpu` in `spec.hard` is accepted by the API and never enforced (flagged).
- A namespace's quota on a resource is the smallest of its unscoped quotas; with only
  scoped ones (PriorityClass, Terminating, ...) it is their sum, an upper bound on what
  the pods they cover may take.
- Used: the GPU requests of its pods that are not Succeeded or Failed (the quota's own
  `status.used` is shown beside it).
- A pod can land on a pool when some GPU node of it passes the pod's nodeSelector,
  required node affinity and tolerations (`workflows.quotas.reach`) and advertises every
  GPU resource the pod asks for; a scheduled pod's own node's pool counts too. A
  namespace with a quota and no GPU pods is compared against every pool a pod without
  constraints could land on, and says so.
- A pool's capacity is its GPU nodes' allocatable, per resource; free is that minus the
  requests of the pods bound there that have not finished.
No clock: the report is a function of the views it is given."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from workflows.fleet.assessment import UNPOOLED, is_gpu_node
from workflows.fleet.findings import Severity
from workflows.fleet.settings import InventorySettings
from workflows.kinds import PoolKind
from workflows.kube.objects import (
    ANYWHERE,
    NodeName,
    NodeObject,
    Placement,
    PodObject,
    PoolName,
    ResourceQuotaObject,
    is_gpu_resource,
)
from workflows.quotas import messages as say
from workflows.quotas.reach import fits

REQUESTS_PREFIX = "requests."
LIMITS_PREFIX = "limits."
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})

FlagKind = Literal["exceeds", "overcommit", "unquoted-serving", "not-enforced"]
_FLAG_ORDER: dict[FlagKind, int] = {"unquoted-serving": 0, "overcommit": 1, "exceeds": 2, "not-enforced": 3}


def _count(text: str | None) -> int | None:
    """GPU quantities are whole numbers ("8"); anything else is unreadable (None)."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _resource_of(key: str) -> tuple[str, bool]:
    """A quota key -> (the GPU resource it names, whether Kubernetes enforces it)."""
    if key.startswith(REQUESTS_PREFIX):
        return key.removeprefix(REQUESTS_PREFIX), True
    return key.removeprefix(LIMITS_PREFIX), False


@dataclass(frozen=True, slots=True)
class QuotaEntry:
    """One GPU line of one ResourceQuota."""

    quota: str  # the ResourceQuota's name
    key: str  # as written in spec.hard
    resource: str
    hard: int | None  # None: not a whole number
    enforced: bool
    scopes: tuple[str, ...] = ()
    used: int | None = None  # the quota's status.used for this key, when present


@dataclass(frozen=True, slots=True)
class PodReach:
    """One GPU pod of a namespace and where it can land."""

    name: str
    phase: str
    node: NodeName | None
    requests: Mapping[str, int]
    placement: Placement
    pools: tuple[PoolName, ...]


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    name: PoolName
    kind: PoolKind | None
    nodes: int
    allocatable: Mapping[str, int]  # per GPU resource
    requested: Mapping[str, int]  # by pods bound here that have not finished

    def free(self, resource: str) -> int:
        return max(0, self.allocatable.get(resource, 0) - self.requested.get(resource, 0))


@dataclass(frozen=True, slots=True)
class Flag:
    kind: FlagKind
    text: str
    namespaces: tuple[str, ...]
    pools: tuple[PoolName, ...] = ()
    severity: Severity = "warning"


@dataclass(frozen=True, slots=True)
class NamespaceQuota:
    namespace: str
    entries: tuple[QuotaEntry, ...]
    # The enforced quota per resource (see the module's docstring); absent: no quota.
    quota: Mapping[str, int]
    used: Mapping[str, int]
    pods: tuple[PodReach, ...]
    pools: tuple[PoolName, ...]
    # True: no GPU pods, so `pools` are those a pod without constraints could land on.
    assumed_reach: bool
    capacity: Mapping[str, int]  # what `pools` advertise, per resource
    flags: tuple[Flag, ...] = ()

    def quota_status_used(self, resource: str) -> int | None:
        """What the quota's own status says is used (the smallest enforced entry's)."""
        found = [e.used for e in self.entries if e.enforced and e.resource == resource and e.used is not None]
        return min(found) if found else None


@dataclass(frozen=True, slots=True)
class QuotaReport:
    namespaces: tuple[NamespaceQuota, ...]  # by name
    pools: tuple[PoolCapacity, ...]  # by name, unpooled last
    flags: tuple[Flag, ...]  # most pressing first
    quotas_found: int = 0  # ResourceQuotas with a GPU entry

    def namespace(self, name: str) -> NamespaceQuota | None:
        return next((n for n in self.namespaces if n.namespace == name), None)

    def pool(self, name: str) -> PoolCapacity | None:
        return next((p for p in self.pools if p.name == name), None)

    def landing_on(self, pool: str) -> tuple[NamespaceQuota, ...]:
        return tuple(n for n in self.namespaces if pool in n.pools)

    def flags_about_pool(self, pool: str) -> tuple[Flag, ...]:
        landing = {n.namespace for n in self.landing_on(pool)}
        return tuple(f for f in self.flags if pool in f.pools
                     or (f.kind in ("exceeds", "not-enforced") and landing.intersection(f.namespaces)))


def _pool_of(node: NodeObject, settings: InventorySettings) -> PoolName:
    return PoolName(node.labels.get(settings.pool_label_key) or UNPOOLED)


def _advertises(node: NodeObject, resources: Iterable[str]) -> bool:
    return all(r in node.allocatable or r in node.capacity for r in resources)


def _entries(quotas: Iterable[ResourceQuotaObject], namespace: str) -> tuple[QuotaEntry, ...]:
    found = []
    for quota in quotas:
        if quota.namespace != namespace:
            continue
        for key, value in sorted(quota.hard.items()):
            resource, enforced = _resource_of(key)
            found.append(QuotaEntry(quota=quota.name, key=key, resource=resource, hard=_count(value),
                                    enforced=enforced, scopes=quota.scopes, used=_count(quota.used.get(key))))
    return tuple(found)


def _enforced_quota(entries: Iterable[QuotaEntry]) -> dict[str, int]:
    unscoped: dict[str, int] = {}
    scoped: dict[str, int] = defaultdict(int)
    for entry in entries:
        if not entry.enforced or entry.hard is None:
            continue
        if entry.scopes:
            scoped[entry.resource] += entry.hard
        else:
            unscoped[entry.resource] = min(entry.hard, unscoped.get(entry.resource, entry.hard))
    return {**scoped, **unscoped}


def _sum(pools: Iterable[PoolCapacity], resource: str) -> int:
    return sum(p.allocatable.get(resource, 0) for p in pools)


def evaluate(*, nodes: Mapping[NodeName, NodeObject], pods: Iterable[PodObject],
             quotas: Iterable[ResourceQuotaObject], settings: InventorySettings) -> QuotaReport:
    quotas = [q for q in quotas if q.hard]
    gpu_nodes = [n for n in nodes.values() if is_gpu_node(n)]
    pool_of = {n.name: _pool_of(n, settings) for n in gpu_nodes}
    live = [p for p in pods if p.gpu_requests and p.phase not in FINISHED_PHASES]

    allocatable: dict[PoolName, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    requested: dict[PoolName, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    members: dict[PoolName, list[NodeObject]] = defaultdict(list)
    for node in gpu_nodes:
        pool = pool_of[node.name]
        members[pool].append(node)
        for resource, value in node.allocatable.items():
            if is_gpu_resource(resource):
                allocatable[pool][resource] += _count(value) or 0
    for pod in live:
        if pod.node_name in pool_of:
            for resource, amount in pod.gpu_requests.items():
                requested[pool_of[pod.node_name]][resource] += amount
    pools = tuple(PoolCapacity(name=name, kind=None if name == UNPOOLED else settings.kind_of(name),
                               nodes=len(members[name]), allocatable=dict(allocatable[name]),
                               requested=dict(requested[name]))
                  for name in sorted(members, key=lambda p: (p == UNPOOLED, p)))
    by_name = {p.name: p for p in pools}

    reach_memo: dict[tuple[int, frozenset[str]], tuple[PoolName, ...]] = {}

    def reach(placement: Placement, resources: frozenset[str]) -> tuple[PoolName, ...]:
        # Pods of one workload share one placement value: each is matched against the nodes once.
        key = (id(placement), resources)
        if key not in reach_memo:
            reach_memo[key] = tuple(sorted({pool_of[n.name] for n in gpu_nodes
                                            if _advertises(n, resources) and fits(placement, n)}))
        return reach_memo[key]

    by_namespace: dict[str, list[PodObject]] = defaultdict(list)
    for pod in live:
        by_namespace[pod.namespace].append(pod)
    names = sorted(set(by_namespace) | {q.namespace for q in quotas})

    namespaces = []
    for name in names:
        entries = _entries(quotas, name)
        reaches = []
        for pod in sorted(by_namespace.get(name, ()), key=lambda p: p.name):
            landing = set(reach(pod.placement, frozenset(pod.gpu_requests)))
            if pod.node_name in pool_of:
                landing.add(pool_of[pod.node_name])
            reaches.append(PodReach(name=pod.name, phase=pod.phase, node=pod.node_name,
                                    requests=dict(pod.gpu_requests), placement=pod.placement,
                                    pools=tuple(sorted(landing))))
        assumed = not reaches
        landing_pools = sorted(set(reach(ANYWHERE, frozenset())) if assumed else {p for r in reaches for p in r.pools},
                               key=lambda p: (p == UNPOOLED, p))
        used: dict[str, int] = defaultdict(int)
        for pod in by_namespace.get(name, ()):
            for resource, amount in pod.gpu_requests.items():
                used[resource] += amount
        quota = _enforced_quota(entries)
        resources = sorted(set(quota) | set(used))
        namespaces.append(NamespaceQuota(
            namespace=name, entries=entries, quota=quota, used=dict(used), pods=tuple(reaches),
            pools=tuple(landing_pools), assumed_reach=assumed,
            capacity={r: _sum((by_name[p] for p in landing_pools), r) for r in resources}))

    flags = _flags(namespaces, by_name)
    namespaces = [_with_flags(n, flags) for n in namespaces]
    return QuotaReport(namespaces=tuple(namespaces), pools=pools, flags=flags, quotas_found=len(quotas))


def _with_flags(namespace: NamespaceQuota, flags: tuple[Flag, ...]) -> NamespaceQuota:
    return dataclasses.replace(namespace, flags=tuple(f for f in flags if namespace.namespace in f.namespaces))


def _flags(namespaces: list[NamespaceQuota], pools: Mapping[PoolName, PoolCapacity]) -> tuple[Flag, ...]:
    found: list[Flag] = []
    for ns in namespaces:
        for entry in ns.entries:
            if not entry.enforced:
                found.append(Flag("not-enforced", say.not_enforced(ns.namespace, entry.quota, entry.key,
                                                                   entry.resource), (ns.namespace,)))
        for resource, hard in sorted(ns.quota.items()):
            capacity = ns.capacity.get(resource, 0)
            if hard > capacity:
                found.append(Flag("exceeds", say.exceeds(ns.namespace, hard, resource, capacity, ns.pools,
                                                         assumed=ns.assumed_reach), (ns.namespace,)))
        unquoted = sorted(r for r in ns.used if r not in ns.quota)
        if unquoted:
            for pool in ns.pools:
                if pools[pool].kind != "serving":
                    continue
                free = sum(pools[pool].free(r) for r in unquoted)
                found.append(Flag("unquoted-serving",
                                  say.unquoted_serving(ns.namespace, pool, free, unquoted, has_quota=bool(ns.quota)),
                                  (ns.namespace,), (pool,)))
    found.extend(_overcommits(namespaces, pools))
    return tuple(sorted(found, key=lambda f: (_FLAG_ORDER[f.kind], f.pools, f.namespaces, f.text)))


def _overcommits(namespaces: list[NamespaceQuota], pools: Mapping[PoolName, PoolCapacity]) -> list[Flag]:
    """Per pool and resource, the namespaces with a quota that can land on it: when their
    quotas add to more than every pool they can use together advertises, the pool is
    promised more than it has. One flag per such group of namespaces."""
    seen: set[tuple[tuple[str, ...], str]] = set()
    found = []
    for pool in pools:
        resources = sorted({r for ns in namespaces if pool in ns.pools for r in ns.quota})
        for resource in resources:
            group = tuple(ns for ns in namespaces if pool in ns.pools and resource in ns.quota)
            key = (tuple(ns.namespace for ns in group), resource)
            if len(group) < 2 or key in seen:
                continue
            seen.add(key)
            union = sorted({p for ns in group for p in ns.pools}, key=lambda p: (p == UNPOOLED, p))
            total = sum(ns.quota[resource] for ns in group)
            capacity = _sum((pools[p] for p in union), resource)
            if total > capacity:
                found.append(Flag("overcommit", say.overcommit(
                    [(ns.namespace, ns.quota[resource]) for ns in group], resource, total, capacity, union),
                    key[0], tuple(union)))
    return found
