"""Pre-flight: what else a change touches: the other pools of the driver object an upgrade
sets, the workloads a MIG change leaves without their resource (and where they still
find it), the quotas that no longer fit, and the pool's own canary resource; and the
run's time against its window, as the seam carries both into the plan."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

from workflows.mig.layouts import MigLayouts
from workflows.mig.plan import MigAsk, plan_mig
from workflows.plans import plan_from_json, plan_hash, plan_to_json
from workflows.pools.config import PoolConfig
from workflows.preflight.report import PlanFacts, checked
from workflows.preflight.facts import QuotaLimit
from workflows.preflight.touches import touch_notes
from workflows.upgrade.plan import UpgradeAsk, plan_upgrade

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "gpu-operator" / "mig-parted"
NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
A100 = "NVIDIA-A100-SXM4-80GB"
SMALL = "nvidia.com/mig-1g.10gb"


@pytest.fixture(scope="module")
def layouts() -> MigLayouts:
    config = yaml.safe_load((REFERENCE / "default-mig-parted-config.yaml").read_text())["data"]["config.yaml"]
    return MigLayouts.parse(config, source="ConfigMap gpu-operator/default-mig-parted-config")


def _policy(**more) -> PoolConfig:
    return PoolConfig.model_validate({"kind": "serving", "windows": "always", "max_unavailable": 2, **more})


def _mig_node(make, name: str, *, pool: str = "inf", profiles: dict[str, int] | None = None):
    profiles = {"1g.10gb": 56} if profiles is None else profiles
    labels: dict[str, str | None] = {"nvidia.com/gpu.product": A100, "nvidia.com/mig.strategy": "mixed",
                                     "nvidia.com/mig.config": "all-1g.10gb"}
    labels.update({f"nvidia.com/mig-{p}.count": str(n) for p, n in profiles.items()})
    capacity: dict[str, str | None] = {f"nvidia.com/mig-{p}": str(n) for p, n in profiles.items()}
    capacity["nvidia.com/gpu"] = None
    return make.node(name, pool=pool, labels=labels, capacity=capacity)


def _mig_change(make, layouts, nodes, pods=(), *, policy=None):
    fleet = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)] + list(pods))
    planned = plan_mig(MigAsk(targets=("inf",), layout="all-3g.40gb"), fleet=fleet,
                       policy_of={"inf": policy or _policy()}, layouts=layouts, strategy="mixed", now=NOW,
                       requested_by="U0ALICE", gpu_pods=pods)
    return planned.plan, fleet


def test_an_upgrade_of_a_driver_object_that_drives_other_pools_names_them_with_their_nodes(make):
    nodes = [make.node(n, pool="serving-a") for n in ("s1", "s2")] + [make.node("t1", pool="training-a")]
    pods = [p for n in nodes for p in make.operands(n.name)]
    fleet = make.fleet(nodes, pods, policies=[make.cluster_policy(
        driver={"enabled": True, "version": "580.95.05", "upgradePolicy": {"autoUpgrade": False}})])
    plan = plan_upgrade(UpgradeAsk(pool="serving-a", version="580.105.08"), fleet=fleet, policy=_policy(), now=NOW,
                        requested_by="U0ALICE", cluster_policy_scope="all-pools").plan

    (note,) = touch_notes(plan, PlanFacts(fleet=fleet, policy=_policy()))

    assert (note.code, note.severity) == ("shared-driver", "warning")
    assert note.sentence.startswith("ClusterPolicy ") and note.sentence.endswith(
        "also sets the driver of training-a (1 node): their nodes take the new version too")


def test_a_mig_change_names_the_pods_left_without_their_resource_and_whether_another_pool_has_it(make, layouts):
    nodes = [_mig_node(make, "n1"), _mig_node(make, "n2")]
    running = make.workload("n1", gpus=1, resource=SMALL, name="small-0")
    pending = make.workload(None, gpus=2, resource=SMALL, name="batch-0", phase="Pending")
    elsewhere = make.workload("o1", gpus=1, resource=SMALL, name="other-0")
    plan, fleet = _mig_change(make, layouts, nodes, [running, pending])

    (note,) = touch_notes(plan, PlanFacts(fleet=fleet, policy=_policy(), gpu_pods=[running, pending]))
    assert (note.code, note.severity, note.details) == ("workloads-lose-resource", "critical",
                                                        ("ml/batch-0", "ml/small-0"))
    assert note.sentence == (f"2 pods ask for {SMALL}, which inf will no longer advertise: ml/batch-0 and ml/small-0; "
                             "no GPU node of the cluster advertises it afterwards: they will not schedule")

    # Another pool still advertising it: they may land there, if their placement lets them.
    other = _mig_node(make, "o1", pool="other")
    plan, fleet = _mig_change(make, layouts, [*nodes, other], [running, elsewhere])
    (note,) = touch_notes(plan, PlanFacts(fleet=fleet, policy=_policy(), gpu_pods=[running, elsewhere]))
    assert note.severity == "warning" and note.details == ("ml/small-0",)
    assert note.sentence.endswith("ml/small-0; only other still advertise it")


def test_a_quota_that_fits_today_and_not_after_the_change_is_named_and_one_that_never_fit_is_not(make, layouts):
    plan, fleet = _mig_change(make, layouts, [_mig_node(make, "n1"), _mig_node(make, "n2")])
    quotas = [QuotaLimit(namespace="serving", resource=SMALL, hard=100, pools=("inf",)),
              QuotaLimit(namespace="batch", resource=SMALL, hard=500, pools=("inf",)),
              QuotaLimit(namespace="elsewhere", resource=SMALL, hard=1, pools=("other",))]

    (note,) = touch_notes(plan, PlanFacts(fleet=fleet, policy=_policy(), quotas=quotas))

    assert note.code == "quota-no-longer-fits"
    assert note.sentence == (f"namespace serving's quota of 100 {SMALL} no longer fits: inf advertise 0 after this "
                             "change (112 now)")


def test_a_mig_change_that_takes_away_the_pools_canary_resource_says_its_next_upgrade_is_refused(make, layouts):
    policy = _policy(gpu_check={"resource": SMALL})
    plan, fleet = _mig_change(make, layouts, [_mig_node(make, "n1")], policy=policy)

    (note,) = touch_notes(plan, PlanFacts(fleet=fleet, policy=policy))

    assert note.code == "canary-resource-goes"
    assert note.sentence == (f"inf's canary pod asks for {SMALL}, which the pool will no longer advertise after this "
                             "change: its next driver upgrade or move is refused until "
                             "`pools.inf.gpu_check.resource` names one it advertises (nvidia.com/mig-3g.40gb)")


def test_the_seam_carries_the_runs_time_and_what_it_touches_into_the_plan_and_its_hash(make, layouts):
    policy = _policy(gpu_check={"resource": SMALL})
    plan, fleet = _mig_change(make, layouts, [_mig_node(make, "n1"), _mig_node(make, "n2")], policy=policy)

    # plan_mig runs the seam's checks: the run's time and what it touches are in its summary.
    found = [(n.check, n.code) for n in plan.summary.preflight]
    assert ("duration", "no-window-end") in found and ("touches", "canary-resource-goes") in found
    duration = next(n for n in plan.summary.preflight if n.check == "duration")
    assert duration.sentence.startswith("The run takes at most 2h20m at the configured timeouts (2 waves, the "
                                        "slowest node n1 1h10m")
    assert plan_hash(plan_from_json(plan_to_json(plan))) == plan_hash(plan)
    bare = checked(plan_from_json(plan_to_json(plan)), PlanFacts(fleet=fleet, policy=policy), checks=())
    assert bare == plan
    # Nothing else touched: the pool's canary asks for nothing the change takes away.
    plain, _ = _mig_change(make, layouts, [_mig_node(make, "n1"), _mig_node(make, "n2")])
    assert "touches" not in {n.check for n in plain.summary.preflight}
