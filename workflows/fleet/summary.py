"""The fleet summary: node assessments folded into pools, cluster facts and findings.

`summarize(...)` folds the node inventories (`fleet.assessment.assess_node`) into pools
and findings in one pass; `build_fleet(snapshot)` chains context, assessment and summary
for callers that hold a whole snapshot. No clock: time is the `now` argument."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from workflows.fleet import findings as findings_mod
from workflows.fleet.assessment import (
    UNPOOLED,
    ClusterInfo,
    DriverManager,
    FleetContext,
    InventorySettings,
    NodeInventory,
    PoolInventory,
    assess_node,
    fleet_context,
    configured_runtime,
    group_pods_by_node,
    is_gpu_node,
    pool_auto_upgrade,
)
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


@dataclass(slots=True)
class _PoolTally:
    nodes: list[NodeName] = field(default_factory=list)
    ready: int = 0
    physical: int = 0
    expected: int = 0
    advertised: int = 0
    allocatable: int = 0
    requested: int = 0
    versions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    owners: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    nvidia_drivers: set[str] = field(default_factory=set)
    behind: dict[str, list[NodeName]] = field(default_factory=lambda: defaultdict(list))
    operator_driven: int = 0  # nodes with nvidia.com/gpu.deploy.driver=true
    runtimes: dict[str, list[NodeName]] = field(default_factory=lambda: defaultdict(list))
    precompiled_kernels: dict[str, list[NodeName]] = field(default_factory=lambda: defaultdict(list))


def _driver_managers(tallies: Mapping[PoolName, _PoolTally], *,
                     context: FleetContext) -> dict[PoolName, tuple[DriverManager, ...]]:
    """Per pool, the objects whose driver version reaches its nodes."""
    cluster = context.cluster
    if cluster.uses_nvidia_driver_crds:
        driven: dict[str, set[PoolName]] = defaultdict(set)
        for pool, tally in tallies.items():
            for name in tally.nvidia_drivers:
                driven[name].add(pool)
        managers = {name: DriverManager(kind="NVIDIADriver", name=name, version=ref.version,
                                        auto_upgrade=ref.auto_upgrade, pools=tuple(sorted(pools)))
                    for name, pools in driven.items() if (ref := context.nvidia_driver_named(name))}
        return {pool: tuple(managers[n] for n in sorted(tally.nvidia_drivers) if n in managers)
                for pool, tally in tallies.items()}
    if cluster.cluster_policy is None:
        return {}
    pools = tuple(sorted(pool for pool, tally in tallies.items() if tally.operator_driven))
    policy = DriverManager(kind="ClusterPolicy", name=cluster.cluster_policy,
                           version=cluster.cluster_policy_driver_version,
                           auto_upgrade=context.cluster_policy_auto_upgrade, pools=pools)
    return {pool: (policy,) for pool in pools}


def summarize(
    nodes: Mapping[NodeName, NodeInventory],
    *,
    context: FleetContext,
    settings: InventorySettings,
    now: dt.datetime,
    node_findings: Mapping[NodeName, tuple[Finding, ...]] | None = None,
    canaries: Mapping[NodeName, CanaryVerdict] | None = None,
) -> Fleet:
    """Pools, cluster info and findings from node inventories, in one pass.

    `node_findings` lets a cache pass findings it memoized per node; nodes missing from
    it are checked here. `canaries` is each node's last check-pod verdict from gpuops'
    records (`workflows.fleet.canaries`); without it, no canary findings.
    """
    tallies: dict[PoolName, _PoolTally] = defaultdict(_PoolTally)
    found: list[Finding] = []
    gpu_nodes: dict[NodeName, NodeInventory] = {}
    kubelets: dict[str, list[NodeName]] = defaultdict(list)
    for name in sorted(nodes):
        inventory = nodes[name]
        if not inventory.gpu_node:
            continue
        gpu_nodes[name] = inventory
        tally = tallies[inventory.pool]
        tally.nodes.append(name)
        tally.ready += inventory.ready is True
        tally.physical += inventory.physical_gpus or 0
        tally.expected += inventory.expected_advertised or 0
        tally.advertised += inventory.advertised_gpus
        tally.allocatable += inventory.allocatable_gpus
        tally.requested += inventory.requested_gpus
        version = inventory.effective_driver_version
        if version:
            tally.versions[version] += 1
            tally.owners[version].add(inventory.driver.owner)
        if inventory.driver.nvidia_driver:
            tally.nvidia_drivers.add(inventory.driver.nvidia_driver)
        if inventory.driver_pod.template_version:
            tally.behind[inventory.driver_pod.template_version].append(name)
        tally.operator_driven += inventory.deploy_driver == "true"
        info = inventory.node_info
        if info.container_runtime_version:
            tally.runtimes[info.container_runtime_version].append(name)
        if inventory.precompiled and info.kernel_version:
            tally.precompiled_kernels[info.kernel_version].append(name)
        if info.kubelet_version:
            kubelets[info.kubelet_version].append(name)
        verdict = canaries.get(name) if canaries is not None else None
        if verdict is not None:
            found.extend(findings_mod.canary_findings(inventory, verdict, now=now))
        memo = node_findings.get(name) if node_findings is not None else None
        found.extend(
            memo
            if memo is not None
            else findings_mod.node_findings(inventory, settings=settings, now=now)
        )

    managers = _driver_managers(tallies, context=context)
    pools = tuple(
        PoolInventory(
            name=pool,
            kind=None if pool == UNPOOLED else settings.kind_of(pool),
            nodes=tuple(tally.nodes),
            nodes_ready=tally.ready,
            gpus_physical=tally.physical,
            gpus_expected=tally.expected,
            gpus_advertised=tally.advertised,
            gpus_allocatable=tally.allocatable,
            gpus_requested=tally.requested,
            driver_versions=MappingProxyType(dict(sorted(tally.versions.items()))),
            auto_upgrade=pool_auto_upgrade(tally.nvidia_drivers, context=context),
            driver_version_owners=MappingProxyType({v: tuple(sorted(o)) for v, o in sorted(tally.owners.items())}),
            driver_pods_behind=MappingProxyType({v: tuple(n) for v, n in sorted(tally.behind.items())}),
            driver_managers=managers.get(pool, ()),
            runtimes=MappingProxyType({r: tuple(n) for r, n in sorted(tally.runtimes.items())}),
            precompiled_kernels=MappingProxyType({k: tuple(n) for k, n in sorted(tally.precompiled_kernels.items())}),
        )
        for pool, tally in sorted(tallies.items(), key=lambda item: (item[0] == UNPOOLED, item[0]))
    )
    toolkit = configured_runtime(
        context.cluster.toolkit,
        {kind for tally in tallies.values() for version in tally.runtimes if (kind := runtime_of(version))})
    for pool_inventory in pools:
        found.extend(findings_mod.pool_findings(pool_inventory, settings=settings, toolkit=toolkit))
    found.extend(findings_mod.cluster_findings(context.cluster))
    found.extend(findings_mod.support_findings(context.cluster, kubelets=kubelets, settings=settings))
    return Fleet(
        cluster=context.cluster,
        pools=pools,
        nodes=MappingProxyType(gpu_nodes),
        findings=findings_mod.sort_findings(found),
        canaries=MappingProxyType({n: v for n, v in (canaries or {}).items() if n in gpu_nodes}),
    )


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


