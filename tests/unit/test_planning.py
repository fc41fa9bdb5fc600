"""The shape every plan of a pool's nodes takes, shared by the kinds: a pool without
policy is refused in each kind's words, a start in the past or outside the pool's windows
is refused the same way whatever is asked, and waves run each node's steps in turn."""

from __future__ import annotations

import datetime as dt

import pytest

from workflows.mig.layouts import MigRefused
from workflows.mig.plan import MigAsk, plan_mig
from workflows.migrate.plan import MigrateAsk, MigrateRefused, plan_migrate
from workflows.plans import NodeStep
from workflows.pools import planning
from workflows.pools.capacity import RollingOrder
from workflows.pools.config import PoolConfig
from workflows.upgrade.plan import UpgradeAsk, plan_upgrade
from workflows.upgrade.scope import UpgradeRefused

NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
HOST = {"nvidia.com/gpu.deploy.driver": "pre-installed", "nvidia.com/cuda.driver-version.full": "570.172.08"}
WEEKEND = PoolConfig.model_validate({"kind": "training", "max_unavailable": 1, "windows": [
    {"days": ["sat", "sun"], "start": "02:00", "end": "06:00", "timezone": "UTC"}]})


def _fleet(make):
    nodes = [make.node(n, pool="p", labels=HOST) for n in ("n1", "n2")]
    return make.fleet(nodes, [make.device_plugin_pod(n.name) for n in nodes])


def test_each_kind_refuses_a_pool_without_policy_saying_what_it_does_only_in_configured_pools(make):
    fleet = _fleet(make)
    with pytest.raises(MigrateRefused) as move:
        plan_migrate(MigrateAsk(targets=("p",)), fleet=fleet, policy_of={}, now=NOW, requested_by="U0ALICE")
    with pytest.raises(MigRefused) as mig:
        plan_mig(MigAsk(targets=("p",), layout="all-1g.10gb"), fleet=fleet, policy_of={}, layouts=None,  # type: ignore[arg-type]
                 strategy="mixed", now=NOW, requested_by="U0ALICE")
    with pytest.raises(UpgradeRefused) as upgrade:
        plan_upgrade(UpgradeAsk(pool="p", version="580.105.08"), fleet=fleet, policy=None, now=NOW,
                     requested_by="U0ALICE")

    assert {move.value.code, mig.value.code, upgrade.value.code} == {"pool-not-configured"}
    assert move.value.reason == ("pool p has no policy in the configuration (pools.p): "
                                 "gpuops moves nodes only in configured pools")
    assert mig.value.reason == ("pool p has no policy in the configuration (pools.p): "
                                "gpuops changes MIG layouts only in configured pools")
    assert upgrade.value.reason == ("pool p has no policy in the configuration (pools.p): "
                                    "gpuops upgrades only configured pools")


def test_a_move_asked_for_outside_the_pools_windows_is_refused_with_the_next_window(make):
    # Friday 10:00: the pool's windows are weekend nights.
    with pytest.raises(MigrateRefused) as refused:
        plan_migrate(MigrateAsk(targets=("p",), start=NOW + dt.timedelta(hours=1)), fleet=_fleet(make),
                     policy_of={"p": WEEKEND}, now=NOW, requested_by="U0ALICE")
    assert refused.value.code == "outside-window"
    planned = plan_migrate(MigrateAsk(targets=("p",)), fleet=_fleet(make), policy_of={"p": WEEKEND}, now=NOW,
                           requested_by="U0ALICE")
    saturday = dt.datetime(2026, 12, 5, 2, 0, tzinfo=dt.timezone.utc)
    assert (planned.window_start, planned.window_end) == (saturday, saturday + dt.timedelta(hours=4))


def test_a_target_no_pool_or_node_has_is_refused_in_the_kinds_refusal_with_the_closest_name(make):
    with pytest.raises(MigrateRefused) as refused:
        plan_migrate(MigrateAsk(targets=("n12", "n1")), fleet=_fleet(make), policy_of={"p": WEEKEND}, now=NOW,
                     requested_by="U0ALICE")
    assert (refused.value.code, refused.value.reason) == ("unknown-target", "no pool or GPU node `n12`; did you mean n2 or n1?")


def test_the_canary_goes_alone_first_then_each_wave_runs_its_nodes_steps_in_turn():
    order = RollingOrder(canary="c", waves=(("a", "b"), ("d",)))  # type: ignore[arg-type]

    waves = planning.rolling_waves(order, lambda n: [NodeStep("cordon", n), NodeStep("uncordon", n)])

    assert [(w.index, w.nodes) for w in waves] == [(0, ("c",)), (1, ("a", "b")), (2, ("d",))]
    assert [(s.kind, s.node) for s in waves[1].steps] == [("cordon", "a"), ("uncordon", "a"),
                                                          ("cordon", "b"), ("uncordon", "b")]
    assert planning.largest_wave(waves, lambda n: 8) == 16
