"""One pool at a glance (`PoolInventory`): its nodes' sums, driver versions and who owns
them, the objects that set its driver version, its runtimes and kernels. The fleet summary
(`fleet.summary`) keeps these up to date node by node; findings read them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from workflows.fleet.operator_settings import AutoUpgradeSetting, DriverManager
from workflows.kinds import PoolKind
from workflows.kube.objects import NodeName, PoolName


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolInventory:
    name: PoolName
    kind: PoolKind | None
    nodes: tuple[NodeName, ...]
    nodes_ready: int
    # Sums over the pool's nodes; physical counts only nodes where it is known.
    gpus_physical: int
    gpus_expected: int
    gpus_advertised: int
    gpus_allocatable: int
    gpus_requested: int
    # driver version -> number of nodes running it
    driver_versions: Mapping[str, int]
    auto_upgrade: AutoUpgradeSetting
    # driver version -> who owns the driver on the nodes running it ("host", "operator")
    driver_version_owners: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # version their DaemonSet now specifies -> nodes whose driver pod runs an older one
    driver_pods_behind: Mapping[str, tuple[NodeName, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # What sets the driver version of this pool's operator-driven nodes (none: host drivers only).
    driver_managers: tuple[DriverManager, ...] = ()
    # nodeInfo.containerRuntimeVersion ("containerd://1.7.20") -> the nodes reporting it.
    runtimes: Mapping[str, tuple[NodeName, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # kernel version -> the nodes on it whose operator driver uses precompiled modules.
    precompiled_kernels: Mapping[str, tuple[NodeName, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # How many of gpus_advertised are MIG slices (NodeInventory.mig_slices_advertised summed).
    mig_slices_advertised: int = 0
    # The pool's cordoned nodes, by name (kept with the sums: `/gpu status` reads them
    # without walking every node).
    cordoned: tuple[NodeName, ...] = ()

    def shares_driver_with(self) -> tuple[PoolName, ...]:
        """Other pools whose driver version changes with this one's."""
        return tuple(sorted({p for m in self.driver_managers for p in m.pools if p != self.name}))

    @property
    def nodes_total(self) -> int:
        return len(self.nodes)

    @property
    def mixed_driver_versions(self) -> bool:
        return len(self.driver_versions) > 1
