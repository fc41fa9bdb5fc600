"""What an upgrade of one pool's driver would touch, and whether it may: the checks a
driver upgrade request of a pool will make before anyone sees a plan.

An upgrade changes the version on exactly one object, the one that sets the pool's driver
(`fleet.operator_settings.DriverManager`): an NVIDIADriver CR whose nodeSelector covers the pool
(and nothing else), or the ClusterPolicy, which drives every pool it deploys the driver
to. A ClusterPolicy change reaches the other pools too (on their pods' next restart with
OnDelete, or at once through the operator when autoUpgrade is on), so it is refused unless
the configuration allows `all-pools` scope or the request names every such pool. Nodes
whose driver the operator does not own (a host driver, two driver sources) are refused:
gpuops does not change host drivers, and a conflicted node fails any upgrade.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from workflows.fleet.assessment import NodeInventory
from workflows.fleet.operator_settings import DriverManager
from workflows.fleet.pool import PoolInventory
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName, PoolName
from workflows.pools import planning
from workflows.pools.capacity import MaxUnavailable, RollingOrder
from workflows.upgrade import messages as say

# NVIDIA driver versions: 580.95.05, 570.172.08, 535.247.01; older branches have two parts (470.82).
_VERSION = re.compile(r"^(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?$", re.ASCII)

UpgradeMode = Literal["gpuops-drives", "gates-operator"]
ClusterPolicyScope = Literal["pool", "all-pools"]


class UpgradeRefused(Exception):
    """The upgrade may not be planned; `reason` says why and what to do instead."""

    def __init__(self, reason: str, *, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class DriverVersion:
    """A driver version as NVIDIA writes it; ordered by its numbers, not as text."""

    numbers: tuple[int, ...]
    text: str

    @classmethod
    def parse(cls, text: str) -> DriverVersion:
        match = _VERSION.match(text.strip())
        if match is None:
            raise UpgradeRefused(say.malformed_version(text), code="malformed-version")
        return cls(numbers=tuple(int(part) for part in match.groups() if part is not None), text=text.strip())

    def __lt__(self, other: DriverVersion) -> bool:
        return self.numbers < other.numbers


@dataclass(frozen=True, slots=True, kw_only=True)
class UpgradeScope:
    pool: PoolName
    manager: DriverManager
    # gpuops drives (autoUpgrade off) or gates the operator's own upgrade (autoUpgrade on).
    mode: UpgradeMode
    target: DriverVersion
    # The pool's versions now (version -> nodes), as GFD or the driver pod reports them.
    current: tuple[tuple[str, int], ...]
    downgrade: bool
    # Other pools whose driver moves with this one (the ClusterPolicy's, when allowed).
    also_moves: tuple[PoolName, ...]
    # The pool's nodes whose driver the operator runs: the ones the upgrade changes.
    nodes: tuple[NodeName, ...]


def upgrade_scope(
    fleet: Fleet,
    pool_name: str,
    *,
    version: str,
    downgrade: bool = False,
    allowed_versions: Sequence[str] = (),
    cluster_policy_scope: ClusterPolicyScope = "pool",
    named_pools: Sequence[str] = (),
    broken_by_run: Sequence[str] = (),
) -> UpgradeScope:
    """The scope of upgrading `pool_name` to `version`, or UpgradeRefused saying why not.
    `named_pools` are other pools the request names to move together (a ClusterPolicy's).
    `broken_by_run` are nodes a rollback undoes: their new driver crash-looping beside the
    old version GFD still reports reads as two driver sources, which is the run's doing."""
    pool = fleet.pool(pool_name)
    if pool is None:
        raise UpgradeRefused(say.pool_not_in_fleet(pool_name, [p.name for p in fleet.pools]), code="unknown-pool")
    target = DriverVersion.parse(version)
    unknown = [p for p in named_pools if fleet.pool(p) is None]
    if unknown:
        raise UpgradeRefused(say.pool_not_in_fleet(unknown[0], [p.name for p in fleet.pools]), code="unknown-pool")
    if allowed_versions and target.text not in allowed_versions:
        raise UpgradeRefused(say.version_not_allowed(target.text, allowed_versions), code="version-not-allowed")
    members = [fleet.nodes[name] for name in pool.nodes]
    foreign = [n for n in members if n.driver.owner == "host"
               or (n.driver.owner == "conflict" and n.name not in broken_by_run)]
    if foreign:
        raise UpgradeRefused(say.not_operator_owned(pool.name, [(n.name, n.driver.owner) for n in foreign]),
                             code="not-operator-owned")
    manager = _one_manager(pool)
    others = tuple(p for p in manager.pools if p != pool.name)
    if others and manager.kind == "NVIDIADriver":
        raise UpgradeRefused(say.driver_cr_shared(manager.name, pool.name, others), code="shared-nvidiadriver")
    missing = [p for p in others if p not in named_pools]
    if missing and cluster_policy_scope != "all-pools":
        raise UpgradeRefused(say.cluster_policy_shared(manager.name, pool.name, missing, target.text,
                                                       auto_upgrade=manager.auto_upgrade.state == "on"),
                             code="shared-cluster-policy")
    current = tuple(pool.driver_versions.items())
    driven = [n for n in members if n.deploy_driver == "true"]
    running = {_version_of(n) for n in driven} - {None}
    # NB: a rollback after a failed canary finds the object set back already, and GFD may
    # still report the old version beside a crash-looping new driver: its nodes still move.
    if running == {target.text} and manager.version == target.text and not broken_by_run:
        raise UpgradeRefused(say.nothing_to_do(pool.name, target.text), code="same-version")
    older = sorted({v for v in running | {manager.version} if v and _lower(target, v)})
    if older and not downgrade:
        raise UpgradeRefused(say.downgrade_needs_consent(target.text, older), code="downgrade")
    return UpgradeScope(
        pool=pool.name, manager=manager,
        mode="gates-operator" if manager.auto_upgrade.state == "on" else "gpuops-drives",
        target=target, current=current, downgrade=bool(older), also_moves=others,
        nodes=tuple(n.name for n in driven),
    )


def _one_manager(pool: PoolInventory) -> DriverManager:
    if not pool.driver_managers:
        raise UpgradeRefused(say.no_manager(pool.name), code="no-driver-manager")
    if len(pool.driver_managers) > 1:
        raise UpgradeRefused(say.several_managers(pool.name, [m.ref for m in pool.driver_managers]),
                             code="several-driver-managers")
    return pool.driver_managers[0]


def _version_of(node: NodeInventory) -> str | None:
    return node.effective_driver_version


def _lower(target: DriverVersion, version: str) -> bool:
    try:
        return target < DriverVersion.parse(version)
    except UpgradeRefused:
        return False  # a version gpuops cannot read is not evidence of a downgrade


# ------------------------------------------------------------------ canary and waves


UpgradeOrder = RollingOrder


def upgrade_order(nodes: Sequence[NodeInventory], *, pool: Sequence[NodeInventory], budget: MaxUnavailable,
                  canary: str | None = None, min_ready_gpus: int = 0) -> UpgradeOrder:
    """`pools.planning.rolling_order` for the nodes an upgrade changes; UpgradeRefused when
    there are none or no order keeps the pool within its rules."""
    if not nodes:
        raise UpgradeRefused(say.no_nodes_to_upgrade(), code="no-nodes")
    return planning.rolling_order(nodes, pool=pool, budget=budget, canary=canary, min_ready_gpus=min_ready_gpus,
                                  what="upgrade", refused=UpgradeRefused)
