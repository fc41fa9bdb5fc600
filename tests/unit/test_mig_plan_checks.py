"""What a MIG change plan tells the people who approve and run it, and each refusal's exact
sentence and code (workflows/mig/plan.py, `plan_mig`).

Pinned here:
- the whole summary (who asked, the window, evictions, the largest wave, every note in its
  order) and each node's steps with their params: the canary first, the pool's `wait_for`
  jobs waited for and the other GPU pods evicted;
- a start at the next window, and a start outside the windows refused naming the pool;
- the refusals, sentence and code: nodes of two pools, a node that cannot do MIG, a node
  mid-change, nothing to change, a layout of several profiles under the single strategy,
  a GPU count the node's layout does not explain;
- under the single strategy with MIG on (GFD counts MIG devices) the GPUs a node has are
  the count its current layout makes that many devices of, from 1 up to 16 GPUs;
- the capacity floor: exactly at it the change goes;
- the workloads left without their resource, each with what owns it (a ReplicaSet named as
  its Deployment), not finished or deleting pods, not pods asking for what stays;
- nodes with open findings: left out (and said so), planned when named, a canary with
  findings refused naming its pool;
- a canary that already runs the layout, a resource another pool keeps, a rollback's note;
- what the pre-flight checks read: the pool's pace (by the pool's name), the engine's
  parallel nodes, the PodDisruptionBudgets and the GPU pods they select."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from tests.unit import test_mig_plan
from tests.unit.test_mig_plan import A100, NOW, _mig_node, _plan
from workflows.kube.objects import DisruptionBudget, OwnerRef
from workflows.mig.layouts import MigRefused
from workflows.mig.plan import MigAsk, MigRollbackOf, plan_mig
from workflows.pools.capacity import PodsMoved
from workflows.pools.config import PoolConfig
from workflows.preflight.facts import Pace, PastStep

# The operator's default mig-parted config, as tests/unit/test_mig_plan.py reads it (a fixture).
layouts = test_mig_plan.layouts

SMALL = "nvidia.com/mig-1g.10gb"
WHOLE = "nvidia.com/mig-7g.80gb"
MEDIUM = "nvidia.com/mig-3g.40gb"


def _policy(**more) -> PoolConfig:
    return PoolConfig.model_validate({"kind": "serving", "windows": "always", "max_unavailable": 2, **more})


def _ask(make, layouts, nodes, layout: str, *, policy: PoolConfig | None = None, pods=(), strategy="mixed",
         **ask):
    fleet = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)] + list(pods))
    return plan_mig(MigAsk(targets=ask.pop("targets", ("inf",)), layout=layout, reason="r", **ask), fleet=fleet,
                    policy_of={"inf": policy or _policy()}, layouts=layouts, strategy=strategy, now=NOW,
                    requested_by="U0ALICE", gpu_pods=pods)


def _refusal(make, layouts, nodes, layout: str, **kw) -> tuple[str, str]:
    with pytest.raises(MigRefused) as refused:
        _ask(make, layouts, nodes, layout, **kw)
    return refused.value.code, refused.value.reason


def _owned(pod, kind: str | None, name: str = ""):
    return dataclasses.replace(pod, owners=(OwnerRef(kind=kind, name=name, controller=True),) if kind else ())


def _single_node(make, name: str, *, product: str, devices: int, layout: str | None = "all-1g.10gb"):
    """A node under the single strategy with MIG on: GFD names the product with its MIG
    profile and counts MIG devices, and the device plugin advertises them as nvidia.com/gpu."""
    labels: dict[str, str | None] = {"nvidia.com/gpu.product": product, "nvidia.com/mig.strategy": "single",
                                     "nvidia.com/mig.config": layout, "nvidia.com/gpu.count": str(devices)}
    return make.node(name, pool="inf", labels=labels, capacity={"nvidia.com/gpu": str(devices)})


# ---- the plan an approver reads


def test_the_plan_names_who_asked_the_start_every_note_in_order_and_each_nodes_steps_canary_first(
        make, layouts):
    nodes = [_mig_node(make, f"n{i}", "all-7g.80gb") for i in range(1, 4)]
    waited = make.workload("n1", gpus=1, resource=WHOLE, name="train-0", labels={"gpuops.io/must-finish": "true"})
    evicted = make.workload("n1", gpus=1, resource=WHOLE, name="serve-0")
    policy = _policy(canary="n3", wait_for={"selector": "gpuops.io/must-finish=true", "timeout": "2h"})
    start = NOW + dt.timedelta(hours=1)

    planned = _ask(make, layouts, nodes, "all-1g.10gb", policy=policy, pods=[waited, evicted], start=start)

    plan = planned.plan
    assert (plan.kind, plan.pool, plan.created_for) == ("mig", "inf", "U0ALICE")
    assert (planned.window_start, planned.window_end) == (start, None)
    summary = plan.summary
    assert (summary.target_mig_config, summary.window_start, summary.window_end, summary.evictions_expected,
            summary.max_gpus_unavailable) == ("all-1g.10gb", start, None, 1, 16)
    assert summary.notes == (
        f"pool inf: 24x {WHOLE} -> 168x {SMALL}",
        f"n1, n2 and n3: 8x {WHOLE} -> 56x {SMALL} each",
        "n3 changes first, alone: a layout the MIG manager fails halts the run before more nodes go",
        "jobs waited for before the node goes (wait_for): n1: ml/train-0",
        "GPU pods evicted (PodDisruptionBudgets respected): n1: ml/serve-0",
        f"no GPU node will advertise {WHOLE} afterwards; asking for them now: ml/serve-0 (Job owner); "
        "ml/train-0 (Job owner) (they will not schedule)")
    assert planned.moved == {"n1": PodsMoved(waited=("ml/train-0",), evicted=("ml/serve-0",)),
                             "n2": PodsMoved(waited=(), evicted=()), "n3": PodsMoved(waited=(), evicted=())}
    assert [w.nodes for w in plan.waves] == [("n3",), ("n1", "n2")]
    assert [(s.kind, s.node, dict(s.params)) for s in plan.waves[0].steps] == [
        ("cordon", "n3", {"was_cordoned": False}),
        ("wait-for-jobs", "n3", {"selector": "gpuops.io/must-finish=true", "timeout_s": 7200}),
        ("evict", "n3", {"scope": "gpu", "pdb_timeout_s": 1800, "pdb_timeout_action": "halt", "evict_retries": 3}),
        ("mig", "n3", {"config": "all-1g.10gb", "expect": {SMALL: 56}, "timeout_s": 1800}),
        ("validate", "n3", {"timeout_s": 600}),
        ("uncordon", "n3", {"leave_cordoned": False})]


def test_a_change_asked_for_the_next_window_starts_at_it_and_must_start_before_it_ends(make, layouts):
    # Friday 10:00, inside today's window: the next window is Saturday's.
    daily = _policy(windows=[{"days": "daily", "start": "08:00", "end": "12:00", "timezone": "UTC"}])
    nodes = [_mig_node(make, "n1", "all-7g.80gb")]

    planned = _ask(make, layouts, nodes, "all-1g.10gb", policy=daily, next_window=True)

    saturday = dt.datetime(2026, 12, 5, 8, 0, tzinfo=dt.timezone.utc)
    assert (planned.window_start, planned.window_end) == (saturday, saturday + dt.timedelta(hours=4))
    assert (planned.plan.summary.window_start, planned.plan.summary.window_end) == (
        saturday, saturday + dt.timedelta(hours=4))


def test_a_start_outside_the_pools_windows_is_refused_naming_the_pool_and_a_mig_change(make, layouts):
    weekend = _policy(windows=[{"days": ["sat", "sun"], "start": "02:00", "end": "06:00", "timezone": "UTC"}])
    nodes = [_mig_node(make, "n1", "all-7g.80gb")]

    code, reason = _refusal(make, layouts, nodes, "all-1g.10gb", policy=weekend, start=NOW + dt.timedelta(hours=1))

    assert code == "outside-window"
    assert reason == ("Fri 2026-12-04 11:00 UTC is outside pool inf's maintenance windows; the next one starts "
                      "Sat 2026-12-05 02:00 UTC: a MIG change starts inside one (or say `next-window`)")


# ---- refusals


def test_nodes_of_two_pools_are_refused_as_a_mig_change_moves_nodes_of_one_pool(make, layouts):
    nodes = [_mig_node(make, "n1", "all-7g.80gb"), _mig_node(make, "t1", "all-7g.80gb", pool="train")]

    assert _refusal(make, layouts, nodes, "all-1g.10gb", targets=("n1", "t1")) == (
        "several-pools", "the nodes named are in inf and train: a MIG change moves nodes of one pool "
                         "(ask once per pool)")


def test_a_node_whose_gpus_cannot_do_mig_is_refused_naming_it_and_its_gpu_model(make, layouts):
    node = make.node("n1", pool="inf", labels={"nvidia.com/mig.capable": "false"})

    assert _refusal(make, layouts, [node], "all-1g.10gb") == (
        "not-mig-capable", "n1's GPUs (NVIDIA-H100-80GB-HBM3) cannot do MIG (nvidia.com/mig.capable is not true): "
                           "leave it out")


def test_a_node_mid_change_is_refused_naming_the_layout_it_is_taking_and_its_state(make, layouts):
    node = make.node("n1", pool="inf", labels={"nvidia.com/gpu.product": A100, "nvidia.com/mig.config": "all-3g.40gb",
                                               "nvidia.com/mig.config.state": "pending"})

    assert _refusal(make, layouts, [node], "all-7g.80gb") == (
        "mig-in-progress", "n1 is in the middle of a MIG change (all-3g.40gb: pending); wait for the MIG manager to "
                           "finish (or see why it is stuck with `/gpu node n1`)")


def test_a_pool_whose_nodes_all_run_the_layout_is_refused_naming_them_and_the_layout(make, layouts):
    nodes = [_mig_node(make, "n1", "all-1g.10gb"), _mig_node(make, "n2", "all-1g.10gb")]

    assert _refusal(make, layouts, nodes, "all-1g.10gb") == (
        "nothing-to-change", "nothing to change: n1 and n2 already run `all-1g.10gb`")


def test_the_single_strategy_refuses_a_layout_of_several_profiles_naming_the_layout(make, layouts):
    node = make.node("n1", pool="inf", labels={"nvidia.com/gpu.product": A100})

    assert _refusal(make, layouts, [node], "all-balanced", strategy="single") == (
        "single-strategy", "MIG layout `all-balanced` makes 1g.10gb, 2g.20gb and 3g.40gb, but the ClusterPolicy's "
                           "mig.strategy is single, which needs one profile on every GPU: pick a layout with one "
                           "profile, or move to the mixed strategy")


# ---- the single strategy: GFD counts MIG devices


@pytest.mark.parametrize(("devices", "gpus"), [(7, 1), (56, 8), (112, 16)])
def test_under_the_single_strategy_a_nodes_gpus_are_what_its_layout_makes_that_many_devices_of(
        make, layouts, devices, gpus):
    node = _single_node(make, "n1", product=f"{A100}-MIG-1g.10gb", devices=devices)

    planned = _ask(make, layouts, [node], "all-7g.80gb", strategy="single")

    assert [(c.node, dict(c.before), dict(c.after)) for c in planned.changes] == [
        ("n1", {"nvidia.com/gpu": devices}, {"nvidia.com/gpu": gpus})]
    assert "the pool's MIG strategy is single: the resource stays nvidia.com/gpu, but its count and size change " \
           "(each is now a MIG device, not a whole GPU)" in planned.plan.summary.notes


@pytest.mark.parametrize(("devices", "layout"), [(119, "all-1g.10gb"), (50, "all-1g.10gb"), (0, "all-disabled"),
                                                 (8, "all-1g.5gb"), (8, None)],
                         ids=["more-than-16-gpus", "not-a-count-it-makes", "nothing-advertised",
                              "a-layout-for-another-gpu", "no-layout"])
def test_under_the_single_strategy_a_device_count_the_nodes_layout_does_not_explain_is_refused(
        make, layouts, devices, layout):
    node = _single_node(make, "n1", product=f"{A100}-MIG-1g.10gb", devices=devices, layout=layout)

    assert _refusal(make, layouts, [node], "all-7g.80gb", strategy="single") == (
        "gpu-count-unknown", "gpuops cannot tell how many GPUs n1 has: with the single strategy GFD counts MIG "
                             f"devices, and its layout {layout or '(none)'} does not explain the count it advertises")


# ---- the capacity floor


def test_a_change_that_leaves_the_pool_exactly_at_its_floor_goes(make, layouts):
    # n2 is cordoned by a person (no Ready GPUs): n1's 8 stay, the floor is 8.
    kept = _mig_node(make, "n1", "all-7g.80gb")
    cordoned = dataclasses.replace(_mig_node(make, "n2", "all-7g.80gb"), unschedulable=True)

    planned = _ask(make, layouts, [kept, cordoned], "all-1g.10gb", policy=_policy(min_ready_gpus=8),
                   targets=("n2",))

    assert [w.nodes for w in planned.plan.waves] == [("n2",)]
    assert planned.plan.summary.max_gpus_unavailable == 0
    steps = planned.plan.waves[0].steps
    assert (dict(steps[0].params), dict(steps[-1].params)) == ({"was_cordoned": True}, {"leave_cordoned": True})


# ---- workloads left without their resource


def test_workloads_left_without_their_resource_are_named_with_their_owner_and_finished_ones_are_not(
        make, layouts):
    nodes = [_mig_node(make, "n1", "all-1g.10gb")]

    def pending(name: str, resource: str = SMALL, **kw):
        return make.workload(None, gpus=1, resource=resource, name=name, phase=kw.pop("phase", "Pending"), **kw)

    pods = [_owned(pending("web-api-7d9f8-x1"), "ReplicaSet", "web-api-7d9f8"),
            _owned(pending("solo-x2"), "ReplicaSet", "solo"),
            _owned(pending("nightly-batch-x3"), "Job", "nightly-batch"),
            _owned(pending("bare"), None),
            pending("done-0", phase="Succeeded"), pending("failed-0", phase="Failed"),
            pending("going-0", deleting=True), pending("stays-0", resource=MEDIUM)]

    planned = _ask(make, layouts, nodes, "all-3g.40gb", pods=pods)

    assert [(w.pod, w.owner, w.resources) for w in planned.stranded] == [
        ("ml/bare", None, (SMALL,)),
        ("ml/nightly-batch-x3", "Job nightly-batch", (SMALL,)),
        ("ml/solo-x2", "ReplicaSet solo", (SMALL,)),
        ("ml/web-api-7d9f8-x1", "Deployment web-api", (SMALL,))]
    assert planned.plan.summary.notes[-1] == (
        f"no GPU node will advertise {SMALL} afterwards; asking for them now: ml/bare; ml/nightly-batch-x3 "
        "(Job nightly-batch); ml/solo-x2 (ReplicaSet solo); ml/web-api-7d9f8-x1 (Deployment web-api) "
        "(they will not schedule)")


def test_a_resource_a_node_of_another_pool_keeps_advertising_is_not_said_to_vanish(make, layouts):
    nodes = [_mig_node(make, "n1", "all-1g.10gb"), _mig_node(make, "o1", "all-1g.10gb", pool="other")]
    fleet = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)])

    planned = plan_mig(MigAsk(targets=("inf",), layout="all-3g.40gb"), fleet=fleet, policy_of={"inf": _policy()},
                       layouts=layouts, strategy="mixed", now=NOW, requested_by="U0ALICE")

    assert (planned.vanishing, planned.stranded) == ((), ())
    assert not any(n.startswith("no GPU node will advertise") for n in planned.plan.summary.notes)


# ---- nodes with open findings, the canary


def _findings_fleet(make):
    # n2 is NotReady: an open critical finding a MIG change does not fix.
    return [_mig_node(make, "n1", "all-7g.80gb"), make.node("n2", pool="inf", ready=False, labels={
        "nvidia.com/gpu.product": A100, "nvidia.com/mig.config": "all-7g.80gb"}), _mig_node(make, "n3", "all-7g.80gb")]


def test_a_node_with_an_open_finding_is_left_out_and_said_so_before_the_checks_notes(make, layouts):
    planned = _ask(make, layouts, _findings_fleet(make), "all-1g.10gb")

    assert [c.node for c in planned.changes] == ["n1", "n3"]
    first = planned.plan.summary.preflight[0]
    assert (first.check, first.code, first.nodes) == ("nodes", "left-out", ("n2",))
    assert first.sentence.startswith("n2 is left out of the MIG change: it has an open finding")


@pytest.mark.parametrize("ask", [{"include": ("n2",)}, {"targets": ("n1", "n2")}])
def test_a_node_with_an_open_finding_is_changed_when_the_request_names_it(make, layouts, ask):
    planned = _ask(make, layouts, _findings_fleet(make), "all-1g.10gb", **ask)

    assert "n2" in [c.node for c in planned.changes]
    assert [(n.code, n.nodes) for n in planned.plan.summary.preflight if n.check == "nodes"] == [
        ("included", ("n2",))]


def test_a_canary_with_an_open_finding_is_refused_naming_it_and_its_pool(make, layouts):
    code, reason = _refusal(make, layouts, _findings_fleet(make), "all-1g.10gb", policy=_policy(canary="n2"))

    assert code == "canary-has-findings"
    assert reason.startswith("n2, the canary of pool inf, has an open finding")


def test_a_canary_that_already_runs_the_layout_is_left_out_and_another_node_goes_first(make, layouts):
    nodes = [_mig_node(make, "n1", "all-1g.10gb"), _mig_node(make, "n2", "all-7g.80gb")]

    planned = _ask(make, layouts, nodes, "all-1g.10gb", policy=_policy(canary="n1"))

    assert [w.nodes for w in planned.plan.waves] == [("n2",)]
    assert "n1 already runs `all-1g.10gb`: left out" in planned.plan.summary.notes


def test_a_rollback_says_which_layout_each_node_goes_back_to_and_that_it_takes_over_the_cordon(make, layouts):
    nodes = [_mig_node(make, "n1", "all-3g.40gb", devices={"3g.40gb": 16}), _mig_node(make, "n2", "all-1g.10gb")]

    planned = _plan(make, layouts, nodes, "", rollback=MigRollbackOf(
        run="run-9", layouts=(("n2", "all-7g.80gb"), ("n1", "all-1g.10gb"))))

    assert planned.plan.summary.notes[-1] == (
        "a rollback of run run-9: n2 to all-7g.80gb, n1 to all-1g.10gb, each taking over the cordon the run left")


# ---- what the pre-flight checks read


def test_the_preflight_reads_the_pools_pace_by_its_name_and_the_budgets_of_the_pods_it_evicts(make, layouts):
    nodes = [_mig_node(make, f"n{i}", "all-7g.80gb") for i in range(1, 4)]
    pod = make.workload("n1", gpus=1, resource=WHOLE, name="api-0", namespace="serve", labels={"app": "api"})
    fleet = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)] + [pod])
    budget = DisruptionBudget(namespace="serve", name="api-pdb", selector={"app": "api"}, disruptions_allowed=0)
    past = tuple(PastStep(node=n.name, kind="mig", took=dt.timedelta(minutes=20)) for n in nodes)
    paces = {"inf": Pace(steps=past, parallel=1)}
    asked: list[str] = []

    def pace_of(pool: str) -> Pace:
        asked.append(pool)
        return paces.get(pool, Pace())

    planned = plan_mig(MigAsk(targets=("inf",), layout="all-1g.10gb"), fleet=fleet, policy_of={"inf": _policy()},
                       layouts=layouts, strategy="mixed", now=NOW, requested_by="U0ALICE", gpu_pods=[pod],
                       budgets=[budget], past_runs=pace_of)

    assert asked == ["inf"]
    found = {n.code: n for n in planned.plan.summary.preflight}
    assert (found["budget-blocks"].nodes, found["budget-blocks"].details) == (("n1",), ("serve/api-0",))
    # Its pace: 20 minutes of mig a node, the other steps at their timeouts; one node at a time.
    assert found["no-window-end"].sentence == (
        "The run takes about 3h at the pace of inf's last runs (evict and validate at their configured timeouts: "
        "none finished in those runs) (2 waves, the slowest node n2 1h); the pool's windows are always open: "
        "no end to fit")
