"""The fleet summary: node assessments folded into pools, cluster facts and findings.

`summarize(...)` folds the node inventories (`fleet.assessment.assess_node`) into pools
and findings in one pass; `build_fleet(snapshot)` chains context, assessment and summary
for callers that hold a whole snapshot. No clock: time is the `now` argument."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from workflows.fleet import findings as findings_mod
from workflows.fleet.assessment import UNPOOLED, NodeInventory, assess_node, is_gpu_node
from workflows.fleet.operator_settings import (
    ClusterInfo,
    ConfiguredRuntime,
    DriverManager,
    FleetContext,
    fleet_context,
    configured_runtime,
    pool_auto_upgrade,
)
from workflows.fleet.pods import group_pods_by_node
from workflows.fleet.pool import PoolInventory
from workflows.fleet.settings import InventorySettings
from workflows.fleet.version_drift import version_drift_findings
from workflows.fleet.canaries import CanaryVerdict
from workflows.fleet.findings import Finding
from workflows.fleet.platform import runtime_of
from workflows.kube.objects import ClusterSnapshot, NodeName, PoolName


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    cluster: ClusterInfo
    pools: tuple[PoolInventory, ...]  # by name, "unpooled" last
    nodes: Mapping[NodeName, NodeInventory]  # GPU nodes only, by name
    findings: tuple[Finding, ...]  # critical, warning, info; then by subject
    # Each GPU node's last check-pod verdict from gpuops' records (empty without them).
    canaries: Mapping[NodeName, CanaryVerdict] = field(default_factory=lambda: MappingProxyType({}))

    def pool(self, name: str) -> PoolInventory | None:
        return next((p for p in self.pools if p.name == name), None)

    def findings_about(self, subject: str) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.subject == subject)

    def cordoned_nodes(self) -> list[NodeInventory]:
        """Every cordoned GPU node, pool by pool (from the pools' sums, not a walk of
        every node)."""
        return [self.nodes[name] for pool in self.pools for name in pool.cordoned]


class FleetSource(Protocol):
    """What hands out the fleet as it is at a time (the watch cache)."""

    def fleet(self, now: dt.datetime) -> Fleet: ...


class NodesInOrder(Mapping[NodeName, NodeInventory]):
    """A fleet view's GPU nodes by name, in name order; read-only. Held in pieces of a
    few dozen names that `FleetIndex` shares between the views it hands out: a changed
    node copies its piece before the index changes it, so a view never changes, and a
    new view after one change costs a piece, not a copy of every node (which, at 5,000
    nodes in each of three clusters held by one process, was the step of a render after
    a change that touched every node)."""

    __slots__ = ("_where", "_pieces")

    def __init__(self, where: Mapping[NodeName, int], pieces: tuple[Mapping[NodeName, NodeInventory], ...]) -> None:
        self._where = where  # each name's piece; never changed once made
        self._pieces = pieces

    def __getitem__(self, name: NodeName) -> NodeInventory:
        return self._pieces[self._where[name]][name]

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __iter__(self) -> Iterator[NodeName]:
        for piece in self._pieces:
            yield from piece

    def __len__(self) -> int:
        return len(self._where)

    def __repr__(self) -> str:
        return f"NodesInOrder({dict(self)!r})"


class _Members:
    """A set of node names that also gives them in name order, sorted again only after
    its membership changed: a changed node is taken away and counted again, which leaves
    the set, and the names in order, as they were (sorting a pool's names on every change
    cost 0.4 ms at 1,250 nodes)."""

    __slots__ = ("_names", "_in_order", "_toggled")

    def __init__(self) -> None:
        self._names: set[NodeName] = set()
        self._in_order: tuple[NodeName, ...] = ()
        self._toggled: set[NodeName] = set()  # names in or out since the last sort, net

    def _toggle(self, name: NodeName) -> None:
        (self._toggled.remove if name in self._toggled else self._toggled.add)(name)

    def add(self, name: NodeName) -> None:
        if name not in self._names:
            self._names.add(name)
            self._toggle(name)

    def discard(self, name: NodeName) -> None:
        if name in self._names:
            self._names.remove(name)
            self._toggle(name)

    def in_order(self) -> tuple[NodeName, ...]:
        if self._toggled:
            self._in_order = tuple(sorted(self._names))
            self._toggled.clear()
        return self._in_order

    def __len__(self) -> int:
        return len(self._names)


@dataclass(slots=True)
class _PoolTally:
    """One pool's sums over its GPU nodes, kept up to date node by node: each node's
    contribution is added when it comes and taken away when it changes or goes."""

    nodes: _Members = field(default_factory=_Members)
    ready: int = 0
    physical: int = 0
    expected: int = 0
    advertised: int = 0
    allocatable: int = 0
    requested: int = 0
    versions: Counter[str] = field(default_factory=Counter)
    owners: Counter[tuple[str, str]] = field(default_factory=Counter)  # (version, owner)
    nvidia_drivers: Counter[str] = field(default_factory=Counter)
    behind: dict[str, _Members] = field(default_factory=dict)
    operator_driven: int = 0  # nodes with nvidia.com/gpu.deploy.driver=true
    runtimes: dict[str, _Members] = field(default_factory=dict)
    precompiled_kernels: dict[str, _Members] = field(default_factory=dict)
    slices: int = 0
    cordoned: _Members = field(default_factory=_Members)

    def count(self, inventory: NodeInventory, sign: int) -> None:
        """Add (`sign` 1) or take away (-1) one node's contribution."""
        name = inventory.name
        (self.nodes.add if sign > 0 else self.nodes.discard)(name)
        self.ready += sign * (inventory.ready is True)
        self.physical += sign * (inventory.physical_gpus or 0)
        self.expected += sign * (inventory.expected_advertised or 0)
        self.advertised += sign * inventory.advertised_gpus
        self.allocatable += sign * inventory.allocatable_gpus
        self.requested += sign * inventory.requested_gpus
        version = inventory.effective_driver_version
        if version:
            self.versions[version] += sign
            self.owners[(version, inventory.driver.owner)] += sign
        if inventory.driver.nvidia_driver:
            self.nvidia_drivers[inventory.driver.nvidia_driver] += sign
        if inventory.driver_pod.template_version:
            _member(self.behind, inventory.driver_pod.template_version, name, sign)
        self.operator_driven += sign * (inventory.deploy_driver == "true")
        self.slices += sign * inventory.mig_slices_advertised
        if inventory.cordoned:
            (self.cordoned.add if sign > 0 else self.cordoned.discard)(name)
        info = inventory.node_info
        if info.container_runtime_version:
            _member(self.runtimes, info.container_runtime_version, name, sign)
        if inventory.precompiled and info.kernel_version:
            _member(self.precompiled_kernels, info.kernel_version, name, sign)

    def driver_crs(self) -> set[str]:
        return {name for name, count in self.nvidia_drivers.items() if count > 0}


def _member(groups: dict[str, _Members], key: str, name: NodeName, sign: int) -> None:
    if sign > 0:
        groups.setdefault(key, _Members()).add(name)
        return
    members = groups.get(key)
    if members is not None:
        members.discard(name)
        if not members:
            del groups[key]


def _driver_managers(tallies: Mapping[PoolName, _PoolTally], *,
                     context: FleetContext) -> dict[PoolName, tuple[DriverManager, ...]]:
    """Per pool, the objects whose driver version reaches its nodes."""
    cluster = context.cluster
    if cluster.uses_nvidia_driver_crds:
        driven: dict[str, set[PoolName]] = defaultdict(set)
        for pool, tally in tallies.items():
            for name in tally.driver_crs():
                driven[name].add(pool)
        managers = {name: DriverManager(kind="NVIDIADriver", name=name, version=ref.version,
                                        auto_upgrade=ref.auto_upgrade, pools=tuple(sorted(pools)),
                                        version_owner=ref.version_owner)
                    for name, pools in driven.items() if (ref := context.nvidia_driver_named(name))}
        return {pool: tuple(managers[n] for n in sorted(tally.driver_crs()) if n in managers)
                for pool, tally in tallies.items()}
    if cluster.cluster_policy is None:
        return {}
    pools = tuple(sorted(pool for pool, tally in tallies.items() if tally.operator_driven))
    policy = DriverManager(kind="ClusterPolicy", name=cluster.cluster_policy,
                           version=cluster.cluster_policy_driver_version,
                           auto_upgrade=context.cluster_policy_auto_upgrade, pools=pools,
                           version_owner=cluster.cluster_policy_version_owner)
    return {pool: (policy,) for pool in pools}


def _pool_inventory(pool: PoolName, tally: _PoolTally, *, managers: tuple[DriverManager, ...],
                    context: FleetContext, settings: InventorySettings) -> PoolInventory:
    owners: dict[str, list[str]] = defaultdict(list)
    for (version, owner), count in tally.owners.items():
        if count > 0:
            owners[version].append(owner)
    return PoolInventory(
        name=pool,
        kind=None if pool == UNPOOLED else settings.kind_of(pool),
        nodes=tally.nodes.in_order(),
        nodes_ready=tally.ready,
        gpus_physical=tally.physical,
        gpus_expected=tally.expected,
        gpus_advertised=tally.advertised,
        gpus_allocatable=tally.allocatable,
        gpus_requested=tally.requested,
        driver_versions=MappingProxyType({v: n for v, n in sorted(tally.versions.items()) if n > 0}),
        auto_upgrade=pool_auto_upgrade(tally.driver_crs(), context=context),
        driver_version_owners=MappingProxyType({v: tuple(sorted(o)) for v, o in sorted(owners.items())}),
        driver_pods_behind=MappingProxyType({v: n.in_order() for v, n in sorted(tally.behind.items())}),
        driver_managers=managers,
        runtimes=MappingProxyType({r: n.in_order() for r, n in sorted(tally.runtimes.items())}),
        precompiled_kernels=MappingProxyType({k: n.in_order() for k, n in sorted(tally.precompiled_kernels.items())}),
        mig_slices_advertised=tally.slices,
        cordoned=tally.cordoned.in_order(),
    )


class FleetIndex:
    """The fleet summary kept up to date one node at a time, so that after one change the
    summary costs what that change touched, not the fleet's size.

    `update(name, inventory)` adds, replaces or (with None) removes one node's
    contribution: its pool's sums change by the difference, and its findings are checked
    again (memoized while they do not depend on the time: a node Ready and not upgrading
    or changing MIG layout says the same at any time). `fleet(now, context=...)` rebuilds
    only the pools that changed (all of them when the cluster-level context or the
    container runtimes the toolkit is read against change), and sorts the findings again
    only when one changed or one depends on the time. The result is what `summarize`
    of the same inventories gives (a test holds them equal); a `Fleet` handed out never
    changes afterwards. Not thread-safe: its owner (the watch cache) holds its lock."""

    def __init__(self, settings: InventorySettings, *, piece_size: int = 64) -> None:
        self._settings = settings
        self._nodes: dict[NodeName, NodeInventory] = {}  # GPU nodes, by name
        # The same in name order, as the pieces of a `NodesInOrder` (None: to be cut again,
        # after a node came or went). `_own` are the pieces no view handed out holds yet.
        self._piece_size = piece_size
        self._names: tuple[NodeName, ...] = ()
        self._where: dict[NodeName, int] | None = None
        self._pieces: list[dict[NodeName, NodeInventory]] = []
        self._own: set[int] = set()
        self._tallies: dict[PoolName, _PoolTally] = {}
        self._node_findings: dict[NodeName, tuple[Finding, ...]] = {}
        self._unchecked: set[NodeName] = set()  # nodes whose findings are to be checked again
        self._timed: set[NodeName] = set()  # nodes whose findings depend on the time
        self._runtime_kinds: Counter[str] = Counter()  # GPU nodes' container runtimes, by kind
        self._kubelets: dict[str, _Members] = {}
        # Driver version -> the nodes where it fails (its pod crash-looping or failing, the
        # operator's upgrade-failed); with the failed check pods, what `_failed_seen` was.
        self._failing: dict[str, _Members] = {}
        self._failed_seen: Mapping[str, tuple[NodeName, ...]] = {}
        self._dirty_pools: set[PoolName] = set()
        self._findings_changed = True
        self._support_changed = True
        self._context: FleetContext | None = None
        self._toolkit: ConfiguredRuntime | None = None
        self._pools: dict[PoolName, PoolInventory] = {}
        self._pool_findings: dict[PoolName, tuple[Finding, ...]] = {}
        self._cluster_findings: tuple[Finding, ...] = ()
        self._support_findings: tuple[Finding, ...] = ()
        self._sorted: tuple[Finding, ...] = ()

    def update(self, name: NodeName, inventory: NodeInventory | None) -> None:
        old = self._nodes.get(name)
        if inventory is not None and not inventory.gpu_node:
            inventory = None
        if old is inventory:
            return
        if old is not None:
            self._count(old, -1)
        if inventory is None:
            self._nodes.pop(name, None)
            self._node_findings.pop(name, None)
            self._timed.discard(name)
            self._unchecked.discard(name)
            self._where = None
            self._findings_changed = True
        else:
            if old is None:
                self._where = None
            elif self._where is not None:
                self._replace(name, inventory)
            self._nodes[name] = inventory
            self._count(inventory, 1)
            self._unchecked.add(name)
        if (old.node_info.kubelet_version if old else None) != (
                inventory.node_info.kubelet_version if inventory else None):
            self._support_changed = True

    def _replace(self, name: NodeName, inventory: NodeInventory) -> None:
        """A node's new value, in its place; its piece copied first if a view holds it."""
        assert self._where is not None
        at = self._where[name]
        if at not in self._own:
            self._pieces[at] = dict(self._pieces[at])
            self._own.add(at)
        self._pieces[at][name] = inventory

    def _cut(self) -> None:
        names = self._names = tuple(sorted(self._nodes))
        size = self._piece_size
        self._where = {name: i // size for i, name in enumerate(names)}
        self._pieces = [{name: self._nodes[name] for name in names[i:i + size]} for i in range(0, len(names), size)]
        self._own = set(range(len(self._pieces)))

    def _count(self, inventory: NodeInventory, sign: int) -> None:
        tally = self._tallies.get(inventory.pool)
        if tally is None:
            tally = self._tallies[inventory.pool] = _PoolTally()
        tally.count(inventory, sign)
        self._dirty_pools.add(inventory.pool)
        info = inventory.node_info
        if info.container_runtime_version and (kind := runtime_of(info.container_runtime_version)):
            self._runtime_kinds[kind] += sign
        if info.kubelet_version:
            _member(self._kubelets, info.kubelet_version, inventory.name, sign)
        pod = inventory.driver_pod
        if pod.present and pod.version and (pod.crash_looping or pod.condition == "failing"
                                            or inventory.upgrade.failed):
            _member(self._failing, pod.version, inventory.name, sign)

    def _check(self, name: NodeName, now: dt.datetime) -> None:
        """The node's findings, checked again; kept for later builds unless they depend on
        the time."""
        inventory = self._nodes[name]
        (self._timed.add if findings_mod.node_findings_depend_on_time(inventory) else self._timed.discard)(name)
        found = findings_mod.node_findings(inventory, settings=self._settings, now=now)
        if self._node_findings.get(name) != found:
            self._node_findings[name] = found
            self._findings_changed = True

    def fleet(self, now: dt.datetime, *, context: FleetContext,
              canaries: Mapping[NodeName, CanaryVerdict] | None = None) -> Fleet:
        settings = self._settings
        if context is not self._context:
            self._context = context
            self._dirty_pools.update(self._tallies)
            self._cluster_findings = findings_mod.cluster_findings(context.cluster)
            self._support_changed = self._findings_changed = True
        for name in self._unchecked | self._timed:
            self._check(name, now)
        self._unchecked.clear()
        for pool in [p for p, tally in self._tallies.items() if not tally.nodes]:
            del self._tallies[pool]
            self._pools.pop(pool, None)
            self._pool_findings.pop(pool, None)
            self._findings_changed = True
        toolkit = configured_runtime(context.cluster.toolkit, {k for k, n in self._runtime_kinds.items() if n > 0})
        if toolkit != self._toolkit:
            self._toolkit = toolkit
            self._dirty_pools.update(self._tallies)
        verdicts = {n: v for n, v in (canaries or {}).items() if n in self._nodes}
        failed = self._failed_versions(verdicts)
        if failed != self._failed_seen:
            # A version that failed somewhere makes pods behind a template naming it critical.
            self._failed_seen = failed
            self._dirty_pools.update(p for p, tally in self._tallies.items() if tally.behind)
        managers = _driver_managers(self._tallies, context=context)
        for pool, tally in self._tallies.items():
            cached = self._pools.get(pool)
            if pool in self._dirty_pools or cached is None or cached.driver_managers != managers.get(pool, ()):
                self._pools[pool] = inventory = _pool_inventory(pool, tally, managers=managers.get(pool, ()),
                                                                context=context, settings=settings)
                found = (findings_mod.pool_findings(inventory, settings=settings, toolkit=toolkit, failed=failed)
                         + version_drift_findings(inventory))
                if found != self._pool_findings.get(pool):
                    self._pool_findings[pool] = found
                    self._findings_changed = True
        self._dirty_pools.clear()
        if self._support_changed:
            self._support_changed = False
            # NB: versions in the order of their first node by name, as a pass over the nodes finds them.
            kubelets = {version: nodes.in_order()
                        for version, nodes in sorted(self._kubelets.items(), key=lambda item: item[1].in_order()[0])}
            support = findings_mod.support_findings(context.cluster, kubelets=kubelets, settings=settings)
            if support != self._support_findings:
                self._support_findings = support
                self._findings_changed = True
        if self._where is None:
            self._cut()
        if self._findings_changed or verdicts:
            self._findings_changed = False
            every = [f for name in self._names for f in self._node_findings.get(name, ())]
            every.extend(f for name in self._names if (v := verdicts.get(name)) is not None
                         for f in findings_mod.canary_findings(self._nodes[name], v, now=now))
            every.extend(f for pool in self._pools for f in self._pool_findings.get(pool, ()))
            every.extend(self._cluster_findings)
            every.extend(self._support_findings)
            self._sorted = findings_mod.sort_findings(every)
            if verdicts:
                self._findings_changed = True  # canary findings age: sort again next time
        return Fleet(
            cluster=context.cluster,
            pools=tuple(self._pools[pool] for pool in sorted(self._pools, key=lambda p: (p == UNPOOLED, p))),
            nodes=self._view(),
            findings=self._sorted,
            canaries=MappingProxyType(verdicts),
        )

    def _failed_versions(self, verdicts: Mapping[NodeName, CanaryVerdict]) -> dict[str, tuple[NodeName, ...]]:
        """Driver version -> the nodes where it failed: the driver pod crash-looping or
        failing, the operator's upgrade-failed, or gpuops' last check pod there failing
        on a node that runs it."""
        found = {version: set(members.in_order()) for version, members in self._failing.items()}
        for name, verdict in verdicts.items():
            version = self._nodes[name].driver_pod.version
            if not verdict.passed and version:
                found.setdefault(version, set()).add(name)
        return {version: tuple(sorted(nodes)) for version, nodes in sorted(found.items())}

    def _view(self) -> NodesInOrder:
        """The nodes for a view handed out: every piece is shared from now on."""
        assert self._where is not None
        self._own.clear()
        return NodesInOrder(self._where, tuple(self._pieces))


def summarize(
    nodes: Mapping[NodeName, NodeInventory],
    *,
    context: FleetContext,
    settings: InventorySettings,
    now: dt.datetime,
    canaries: Mapping[NodeName, CanaryVerdict] | None = None,
) -> Fleet:
    """Pools, cluster info and findings from node inventories, in one pass (a
    `FleetIndex` filled at once). `canaries` is each node's last check-pod verdict from
    gpuops' records (`workflows.fleet.canaries`); without it, no canary findings."""
    index = FleetIndex(settings)
    for name, inventory in nodes.items():
        index.update(name, inventory)
    return index.fleet(now, context=context, canaries=canaries)


def build_fleet(
    snapshot: ClusterSnapshot, *, settings: InventorySettings, now: dt.datetime
) -> Fleet:
    context = fleet_context(snapshot, settings=settings)
    pods_by_node = group_pods_by_node(snapshot.pods)
    nodes = {
        name: assess_node(
            node,
            pods_on_node=pods_by_node.get(name, ()),
            context=context,
            settings=settings,
            now=now,
        )
        for name, node in snapshot.nodes.items()
        if is_gpu_node(node)
    }
    return summarize(nodes, context=context, settings=settings, now=now)


