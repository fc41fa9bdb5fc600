"""How a pool's driver upgrade is planned in each mode: gpuops drives (autoUpgrade off)
or gates the operator's own upgrade (autoUpgrade on): who is held back, which steps each
node goes through, what the plan tells the approvers, and what a rollback gives back."""

from __future__ import annotations

import datetime as dt

import pytest

from workflows.pools.config import PoolConfig
from workflows.upgrade.plan import RollbackOf, UpgradeAsk, plan_upgrade
from workflows.upgrade.scope import UpgradeRefused

NEW = "580.105.08"
NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
POLICY = PoolConfig.model_validate({"kind": "training", "windows": "always", "max_unavailable": 1,
                                    "upgrade_soak": "5m"})
SKIP = "nvidia.com/gpu-driver-upgrade.skip"


def _one_policy(make, *, auto_upgrade: bool, pool_nodes=("s1", "s2", "s3"), skip=(), held=(),
                policy_version="580.95.05", upgraded=()):
    nodes = [make.node(n, pool="serving-a",
                       labels={SKIP: "true"} if n in skip or n in held else None,
                       annotations={"gpuops.io/driver-upgrade-held-by": "run-old"} if n in held else None)
             for n in pool_nodes]
    nodes += [make.node("t1", pool="training-a")]
    pods = [p for n in nodes for p in (make.driver_pod(n.name, **({"version": NEW} if n.name in upgraded else {})),
                                       make.device_plugin_pod(n.name), make.validator_pod(n.name))]
    policy = make.cluster_policy(driver={"enabled": True, "version": policy_version,
                                         "upgradePolicy": {"autoUpgrade": auto_upgrade}})
    return make.fleet(nodes, pods, policies=[policy])


def _plan(fleet, **kw):
    return plan_upgrade(UpgradeAsk(pool="serving-a", version=kw.pop("version", NEW)), fleet=fleet, policy=POLICY,
                        now=NOW, requested_by="U0ALICE", cluster_policy_scope="all-pools", **kw)


def _kinds(wave) -> list[tuple[str, str]]:
    return [(s.kind, s.node) for s in wave.steps]


def test_with_auto_upgrade_on_every_node_is_held_back_before_the_version_changes_and_let_go_in_its_wave(make):
    planned = _plan(_one_policy(make, auto_upgrade=True))

    assert planned.scope.mode == "gates-operator"
    canary, *rest = planned.plan.waves
    hold = canary.steps[0]
    # The other pool the ClusterPolicy drives is held back too, and stays held afterwards.
    assert (hold.kind, dict(hold.params)) == ("operator-hold", {"nodes": ("s1", "s2", "s3", "t1")})
    assert _kinds(canary)[1:] == [("driver-version", "s1"), ("cordon", "s1"), ("operator-upgrade", "s1"),
                                  ("validate", "s1"), ("uncordon", "s1"), ("hold", "s1")]
    assert [_kinds(w) for w in rest] == [[("cordon", n), ("operator-upgrade", n), ("validate", n), ("uncordon", n)]
                                         for n in ("s2", "s3")]
    upgrade = next(s for s in canary.steps if s.kind == "operator-upgrade")
    assert upgrade.params["version"] == NEW
    notes = planned.plan.summary.notes
    assert any("gpuops gates the operator" in n and "upgrade-failed halts the run" in n for n in notes)
    assert any("also drives training-a" in n and "stay held after this run" in n for n in notes)
    assert not any(s.kind in ("evict", "driver") for w in planned.plan.waves for s in w.steps)


def test_with_auto_upgrade_off_gpuops_drives_and_holds_nothing(make):
    planned = _plan(_one_policy(make, auto_upgrade=False))

    assert planned.scope.mode == "gpuops-drives"
    kinds = [s.kind for w in planned.plan.waves for s in w.steps]
    assert "operator-hold" not in kinds and "operator-upgrade" not in kinds
    assert kinds[:5] == ["driver-version", "cordon", "evict", "driver", "validate"]
    assert any("their driver pods take" in n and "next restart" in n for n in planned.plan.summary.notes)


def test_the_cluster_policy_scope_pool_refuses_what_all_pools_accepts(make):
    fleet = _one_policy(make, auto_upgrade=True)
    with pytest.raises(UpgradeRefused) as refused:
        plan_upgrade(UpgradeAsk(pool="serving-a", version=NEW), fleet=fleet, policy=POLICY, now=NOW,
                     requested_by="U0ALICE")
    assert refused.value.code == "shared-cluster-policy"
    assert "upgrades.cluster_policy_scope: all-pools" in refused.value.reason


def test_a_node_a_person_labelled_skip_is_left_out_and_one_an_earlier_run_held_is_taken_up(make):
    planned = _plan(_one_policy(make, auto_upgrade=True, skip=("s2",), held=("s3",)))

    assert planned.plan.nodes == ("s1", "s3")
    assert planned.plan.waves[0].steps[0].params["nodes"] == ("s1", "s3", "t1")
    assert any("left out: s2" in n for n in planned.plan.summary.notes)


def test_a_gated_rollback_gives_the_nodes_the_run_held_and_never_moved_back_at_the_end(make):
    fleet = _one_policy(make, auto_upgrade=True, held=("s2", "s3"), policy_version=NEW, upgraded=("s1",))
    # No scope configured, nothing named: the pools the run's change reached were accepted with it.
    planned = plan_upgrade(UpgradeAsk(pool="serving-a", version="580.95.05"), fleet=fleet, policy=POLICY, now=NOW,
                           requested_by="U0ALICE",
                           rollback=RollbackOf(run="run-old", nodes=("s1",), version="580.95.05", release=("s2", "s3")))

    (only,) = planned.plan.waves
    assert only.nodes == ("s1",)
    last = only.steps[-1]
    assert (last.kind, dict(last.params)) == ("operator-hold", {"nodes": ("s2", "s3"), "release": True})
    assert any("s2" in n and "s3" in n and "given back to the operator" in n for n in planned.plan.summary.notes)
    assert any("also drives training-a (as run run-old changed it for them)" in n for n in planned.plan.summary.notes)


def test_a_request_that_names_every_other_pool_of_the_cluster_policy_is_planned_and_says_they_were_named(make):
    from commands.upgrade import read_upgrade_words

    fleet = _one_policy(make, auto_upgrade=False)
    pools = {"serving-a": POLICY}
    with pytest.raises(UpgradeRefused) as refused:
        plan_upgrade(UpgradeAsk(pool="serving-a", version=NEW), fleet=fleet, policy=POLICY, now=NOW,
                     requested_by="U0ALICE")
    assert "--also training-a" in refused.value.reason
    for words in (f"serving-a to {NEW} --also training-a CVE", f"serving-a to {NEW} --also=training-a CVE"):
        ask = read_upgrade_words(words.split(), pools=pools, now=NOW)
        assert (ask.also, ask.reason) == (("training-a",), "CVE")
        planned = plan_upgrade(ask, fleet=fleet, policy=POLICY, now=NOW, requested_by="U0ALICE")
        assert any("also drives training-a (named in the request)" in n for n in planned.plan.summary.notes)
    with pytest.raises(UpgradeRefused) as unknown:
        plan_upgrade(UpgradeAsk(pool="serving-a", version=NEW, also=("trainig-a",)), fleet=fleet, policy=POLICY,
                     now=NOW, requested_by="U0ALICE")
    assert unknown.value.code == "unknown-pool" and "did you mean training-a" in unknown.value.reason
