"""Moving nodes between host drivers and the GPU Operator, planned, as an approver reads the
plan and the engine runs it:

- each direction's whole step list per node, with the pool's timeouts: a node is given
  back only after the operator's driver (or the host's) and the validator are ready
  (`validate_timeout`), a person has `host_driver_timeout` for the driver packages, the
  pool's `wait_for` jobs come first, and the pool's check runs, then its burn-in;
- which test pod runs: the pool's, else the fleet-wide one, else the default (a disabled
  check runs the default), and a test pod asking for a resource the nodes will not
  advertise is refused naming where it is configured;
- each refusal's whole sentence and code (no driver, nothing to move, several pools, no
  windows, the floor of Ready GPUs, an `--include` the move does not reach);
- nodes with open findings are left out unless the request names them; a rollback's never;
- a rollback restores each node's labels and taints, canary first in the order its run
  took them, and says so;
- the window (`--next-window`), the summary (evictions, GPUs out, pods waited for and
  evicted), the pre-flight notes read from the pool's budgets, GPU pods and past pace,
  who asked, and the pool, nodes and order the plan returns."""

from __future__ import annotations

import datetime as dt

import pytest
from test_migrate_plan import HOST, NOW, POLICY, _fleet, _plan

from workflows.kube.objects import DisruptionBudget
from workflows.migrate.plan import MigrateAsk, MigrateRefused, MigrateRollbackOf, plan_migrate
from workflows.pools.capacity import RollingOrder
from workflows.pools.config import GpuCheck, PoolConfig
from workflows.preflight.facts import Pace, PastStep

MIG = "nvidia.com/mig-1g.10gb"
MUST_FINISH = "gpuops.io/must-finish=true"
# A pool that sets everything a move's steps read.
RICH = PoolConfig.model_validate({
    "kind": "training", "windows": "always", "max_unavailable": 3, "validate_timeout": "15m",
    "host_driver_timeout": "3h", "host_driver_evidence": True, "wait_for": {"selector": MUST_FINISH, "timeout": "2h"},
    "gpu_check": {"image": "registry.example/check:1", "command": ["/bin/check", "--quick"], "timeout": "2m",
                  "burn_in": {"image": "registry.example/nccl:2", "command": ["all_reduce"], "timeout": "20m"}}})
CHECK = {"timeout_s": 120, "namespace": "gpuops", "image": "registry.example/check:1",
         "command": ["/bin/check", "--quick"], "resource": "nvidia.com/gpu"}
BURN_IN = {"timeout_s": 1200, "namespace": "gpuops", "image": "registry.example/nccl:2", "command": ["all_reduce"],
           "resource": "nvidia.com/gpu", "count": "all", "purpose": "burn-in"}
DEFAULT_CHECK = {"timeout_s": 300, "namespace": "gpuops", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                 "command": ["nvidia-smi"], "resource": "nvidia.com/gpu"}
BY_HAND = {"timeout_s": 10800, "evidence": True}
BEFORE = [{"kind": "snapshot", "params": {}}, {"kind": "cordon", "params": {"was_cordoned": False}},
          {"kind": "wait-for-jobs", "params": {"timeout_s": 7200, "selector": MUST_FINISH}},
          {"kind": "evict", "params": {"scope": "gpu", "pdb_timeout_s": 1800, "pdb_timeout_action": "halt",
                                       "evict_retries": 3}}]
AFTER = [{"kind": "gpu-check", "params": CHECK}, {"kind": "gpu-check", "params": BURN_IN},
         {"kind": "validate", "params": {"timeout_s": 900}}, {"kind": "uncordon", "params": {"leave_cordoned": False}}]
STEPS = {
    "operator": [*BEFORE, {"kind": "host-driver-removed", "params": BY_HAND},
                 {"kind": "node-labels", "params": {"labels": {"nvidia.com/gpu.deploy.driver": "true"}}},
                 {"kind": "wait-for", "params": {"timeout_s": 900,
                                                 "conditions": ["operator-driver-ready", "validator-ready"]}},
                 *AFTER],
    "host": [*BEFORE, {"kind": "node-labels", "params": {"labels": {"nvidia.com/gpu.deploy.driver": "pre-installed"}}},
             {"kind": "wait-for", "params": {"timeout_s": 900, "conditions": ["no-operator-driver"]}},
             {"kind": "host-driver-installed", "params": BY_HAND},
             {"kind": "wait-for", "params": {"timeout_s": 900, "conditions": ["driver-ready", "validator-ready"]}},
             *AFTER],
}
NOTES = {
    "operator": [
        "the one step a person does: once a node is cordoned and drained, remove the host's NVIDIA driver packages "
        "there and confirm (a button on the request, or `/gpu migrate confirm <run>`; who confirmed is audited); "
        "gpuops cannot log into nodes. This pool takes the node's evidence too (host_driver_evidence): once its "
        "driver stops working (validator waiting for a driver, no GPU advertised), the step is done, audited",
        "one node at a time: snapshot (labels, annotations, taints), cordon, drain GPU pods, wait for the host driver "
        "to go, let the operator deploy its driver, wait for its driver and validator, a test pod asking for one GPU, "
        "every GPU advertised, uncordon"],
    "host": [
        "the one step a person does: once the operator's driver is off a node, install the host's NVIDIA driver "
        "packages there and confirm (a button on the request, or `/gpu migrate confirm <run>`; who confirmed is "
        "audited); gpuops cannot log into nodes. This pool takes the node's evidence too (host_driver_evidence): "
        "once its driver starts working, the step is done, audited",
        "one node at a time: snapshot (labels, annotations, taints), cordon, drain GPU pods, turn the operator's "
        "driver off, wait for its pod to go, wait for the host driver to be installed, wait for it and the "
        "validator, a test pod asking for one GPU, every GPU advertised, uncordon"],
}


def _policy(**more) -> PoolConfig:
    return PoolConfig.model_validate({"kind": "training", "windows": "always", "max_unavailable": 3, **more})


def _steps(planned, node="h1"):
    return [{"kind": s.kind, "params": s.to_json()["params"]} for w in planned.plan.waves for s in w.steps
            if s.node == node]


def _refusal(call) -> tuple[str, str]:
    with pytest.raises(MigrateRefused) as refused:
        call()
    assert str(refused.value) == refused.value.reason  # what a log line of the refusal shows
    return refused.value.code, refused.value.reason


@pytest.mark.parametrize(("to", "operator"), [("operator", ("h3",)), ("host", ("h1", "h2"))])
def test_each_direction_gives_a_node_back_only_after_its_driver_validator_and_checks_with_the_pools_timeouts(
        make, to, operator):
    planned = plan_migrate(MigrateAsk(targets=("h1",), to=to), fleet=_fleet(make, operator=operator),
                           policy_of={"hosts": RICH}, now=NOW, requested_by="U0ALICE")

    assert _steps(planned) == STEPS[to]
    (node_note, *notes) = planned.plan.summary.notes
    assert node_note.startswith(f"h1: driver owner {'host' if to == 'operator' else 'operator'} (")
    assert notes == NOTES[to]


def test_the_test_pod_is_the_pools_then_the_fleets_then_the_default_and_a_disabled_one_runs_the_default(make):
    fleet_wide = GpuCheck(image="registry.example/fleet:3", command=("fleet-check",))
    fleets = {**DEFAULT_CHECK, "image": "registry.example/fleet:3", "command": ["fleet-check"]}

    def checks(policy, gpu_check=None):
        planned = plan_migrate(MigrateAsk(targets=("h1",)), fleet=_fleet(make), policy_of={"hosts": policy},
                               now=NOW, requested_by="U0ALICE", gpu_check=gpu_check)
        return [s["params"] for s in _steps(planned) if s["kind"] == "gpu-check"]

    assert checks(RICH, fleet_wide) == [CHECK, BURN_IN]
    assert checks(POLICY, fleet_wide) == [fleets]
    assert checks(POLICY) == [DEFAULT_CHECK]
    assert checks(_policy(gpu_check={"enabled": False, "command": ["never"]}), fleet_wide) == [DEFAULT_CHECK]


def _mig_host_fleet(make):
    """inf: two host-driver nodes of the mixed MIG strategy, advertising MIG devices only."""
    nodes = [make.node(n, pool="inf", labels={**HOST, "nvidia.com/mig.strategy": "mixed",
                                              "nvidia.com/mig.config": "all-1g.10gb", f"{MIG}.count": "56"},
                       capacity={"nvidia.com/gpu": None, MIG: "56"}) for n in ("m1", "m2")]
    return make.fleet(nodes, [make.device_plugin_pod(n.name) for n in nodes])


def test_a_test_pod_asking_for_a_resource_the_nodes_will_not_advertise_is_refused_naming_where_it_is_set(make):
    def move(fleet, pool, policy, gpu_check=None):
        return _refusal(lambda: plan_migrate(MigrateAsk(targets=(pool,)), fleet=fleet, policy_of={pool: policy},
                                             now=NOW, requested_by="U0ALICE", gpu_check=gpu_check))

    code, reason = move(_fleet(make), "hosts", _policy(gpu_check={"resource": MIG}))
    assert code == "gpu-check-resource"
    assert reason.startswith(f"The canary pod (pools.hosts.gpu_check) asks for one {MIG}, which h1, h2 and h3 will "
                             "not advertise after this change"), reason
    code, reason = move(_fleet(make), "hosts", POLICY, gpu_check=GpuCheck(resource=MIG))
    assert code == "gpu-check-resource"
    assert reason.startswith(f"The canary pod (upgrades.gpu_check) asks for one {MIG}, which h1, h2 and h3"), reason
    # A pool that turned its check off runs the default test pod: naming a resource in the
    # check that stays off would not help, so the sentence says to turn it on.
    off = _policy(gpu_check={"enabled": False, "resource": MIG})
    assert move(_mig_host_fleet(make), "inf", off) == ("gpu-check-resource-unset", (
        "The canary pod asks for one nvidia.com/gpu by default: `pools.inf.gpu_check` is turned off (`enabled: "
        "false`), and this change runs the default test pod then, which m1 and m2 will not advertise after this "
        "change: it would stay Pending until its timeout and halt the run with the node cordoned. inf's nodes "
        f"advertise {MIG}; turn `pools.inf.gpu_check` on (`enabled: true`) with `resource` set to {MIG}"))
    assert move(_mig_host_fleet(make), "inf", POLICY, gpu_check=GpuCheck(enabled=False))[1].startswith(
        "The canary pod asks for one nvidia.com/gpu by default: `upgrades.gpu_check` is turned off")


def test_a_node_that_cannot_move_or_a_pool_already_moved_is_refused_in_a_whole_sentence(make):
    assert _refusal(lambda: _plan(_fleet(make, none=("h2",)))) == ("not-movable", (
        "h2's driver cannot be moved to the operator's driver (driver owner: none; label "
        "nvidia.com/gpu.deploy.driver=true; no driver pod, no pre-installed label and no driver version from GFD): "
        "leave it out"))
    assert _refusal(lambda: _plan(_fleet(make, operator=("h1", "h2", "h3")))) == (
        "nothing-to-move", "nothing to move: h1, h2 and h3 already run the operator's driver")


def test_a_move_across_pools_without_windows_below_the_floor_or_including_a_node_it_leaves_is_refused(make):
    nodes = [make.node("h1", pool="hosts", labels=HOST), make.node("x1", pool="other", labels=HOST)]
    two_pools = make.fleet(nodes, [make.device_plugin_pod(n.name) for n in nodes])
    assert _refusal(lambda: _plan(two_pools, targets=("h1", "x1"))) == ("several-pools", (
        "the nodes named are in hosts and other: a move to the operator moves nodes of one pool (ask once per pool)"))

    def move(policy, **ask):
        return _refusal(lambda: plan_migrate(MigrateAsk(targets=("hosts",), **ask), fleet=_fleet(make, operator=("h3",)),
                                             policy_of={"hosts": policy}, now=NOW, requested_by="U0ALICE"))

    assert move(PoolConfig.model_validate({"kind": "training"})) == ("windows", (
        "pool hosts has no maintenance windows, so no move to the operator may run: configure pools.hosts.windows"))
    assert move(_policy(min_ready_gpus=20)) == ("min-ready-gpus", (
        "taking h1 out (8 Ready GPUs) would leave the pool 16 of its 24 Ready GPUs, below its min_ready_gpus of 20: "
        "lower the floor or add capacity first"))
    assert move(POLICY, include=("h3",)) == ("include-not-planned", (
        "`--include` names h3, which is not among the nodes this move between host drivers and the operator of pool "
        "hosts changes; name nodes of the pool the move between host drivers and the operator reaches, or leave it "
        "out."))


def _short_h2(make, *, operator=()):
    """h1-h3 with h2 advertising 7 of its 8 GPUs: an open finding a move does not fix."""
    nodes, pods = [], []
    for name in ("h1", "h2", "h3"):
        capacity = {"nvidia.com/gpu": "7"} if name == "h2" else None
        if name in operator:
            nodes.append(make.node(name, pool="hosts", capacity=capacity))
            pods += make.operands(name)
        else:
            nodes.append(make.node(name, pool="hosts", labels=HOST, capacity=capacity))
            pods.append(make.device_plugin_pod(name))
    return make.fleet(nodes, pods)


def test_a_node_with_an_open_finding_is_left_out_unless_the_request_names_it(make):
    def move(targets=("hosts",), include=()):
        planned = plan_migrate(MigrateAsk(targets=targets, include=include), fleet=_short_h2(make),
                               policy_of={"hosts": POLICY}, now=NOW, requested_by="U0ALICE")
        notes = [(n.code, n.nodes) for n in planned.plan.summary.preflight if n.check == "nodes"]
        return planned.nodes, notes

    assert move() == (("h1", "h3"), [("left-out", ("h2",))])
    assert move(targets=("h1", "h2")) == (("h1", "h2"), [("included", ("h2",))])
    assert move(include=("h2",)) == (("h1", "h2", "h3"), [("included", ("h2",))])


def test_a_rollback_restores_labels_and_taints_canary_first_in_its_runs_order_whatever_the_nodes_findings(make):
    taint = {"key": "gpu", "value": "", "effect": "NoSchedule"}
    snapshots = (("h2", {"labels": {"nvidia.com/gpu.deploy.driver": "pre-installed", "team": "ml"},
                         "taints": [taint]}),
                 ("h1", {"labels": {"nvidia.com/gpu.deploy.driver": "pre-installed"}}))
    planned = _plan(_short_h2(make, operator=("h1", "h2")), rollback=MigrateRollbackOf(
        run="run-7", snapshots=snapshots, keys=("nvidia.com/gpu.product",)))

    assert [w.nodes for w in planned.plan.waves] == [("h2",), ("h1",)]
    assert _steps(planned, "h2") == [
        {"kind": "cordon", "params": {"was_cordoned": False, "takes_over": "run-7"}},
        {"kind": "restore", "params": {"labels": {"nvidia.com/gpu.deploy.driver": "pre-installed", "team": "ml"},
                                       "keys": ["nvidia.com/gpu.deploy.driver", "nvidia.com/gpu.product"],
                                       "taints": [taint]}}]
    assert _steps(planned, "h1")[1]["params"] == {"labels": {"nvidia.com/gpu.deploy.driver": "pre-installed"},
                                                  "keys": ["nvidia.com/gpu.deploy.driver", "nvidia.com/gpu.product"],
                                                  "taints": []}
    assert planned.plan.summary.notes == (
        "a rollback of run run-7: h2 and h1 get back the labels and taints recorded before it changed them, in one "
        "step each, and stay cordoned: reinstall the host driver there, then `/gpu uncordon` them",)
    assert not [n for n in planned.plan.summary.preflight if n.check == "nodes"]


def test_a_rollback_of_a_node_named_like_a_pool_is_refused_rather_than_rolling_back_the_pool(make):
    nodes = [make.node("p", pool="hosts"), make.node("n1", pool="p"), make.node("n2", pool="p")]
    fleet = make.fleet(nodes, [pod for n in nodes for pod in make.operands(n.name)])

    assert _refusal(lambda: plan_migrate(
        MigrateAsk(targets=()), fleet=fleet, policy_of={"p": POLICY, "hosts": POLICY}, now=NOW,
        requested_by="U0ALICE", rollback=MigrateRollbackOf(run="run-7", snapshots=(("p", {}),), keys=()))) == (
        "canary-not-in-scope", "the pool's canary node p is not among the nodes this move to the operator changes "
                               "(n1 and n2)")


def test_the_next_window_starts_the_move_at_the_windows_next_opening_and_the_summary_says_when(make):
    daily = _policy(windows=[{"days": "daily", "start": "08:00", "end": "12:00", "timezone": "UTC"}])

    def move(next_window):
        planned = plan_migrate(MigrateAsk(targets=("hosts",), next_window=next_window), fleet=_fleet(make),
                               policy_of={"hosts": daily}, now=NOW, requested_by="U0ALICE")
        summary = planned.plan.summary
        return planned.window_start, planned.window_end, summary.window_start, summary.window_end

    tomorrow = dt.datetime(2026, 12, 5, 8, 0, tzinfo=dt.timezone.utc)
    assert move(True) == (tomorrow, tomorrow + dt.timedelta(hours=4), tomorrow, tomorrow + dt.timedelta(hours=4))
    noon = NOW.replace(hour=12)
    assert move(False) == (NOW, noon, None, noon)  # starts once approved, before noon


def test_the_plan_names_the_pods_it_waits_for_and_evicts_its_budgets_pace_and_who_asked(make):
    nodes = [make.node(n, pool="hosts", labels=HOST) for n in ("h1", "h2", "h3")]
    train = make.workload("h1", gpus=8, name="train-1", labels={"gpuops.io/must-finish": "true"})
    serve = make.workload("h2", gpus=4, name="serve-1", labels={"app": "api"})
    fleet = make.fleet(nodes, [*(make.device_plugin_pod(n.name) for n in nodes), train, serve])
    policy = _policy(max_unavailable="100%", migrate_at_once=2, wait_for={"selector": MUST_FINISH, "timeout": "2h"})
    asked = []

    def past_runs(pool):
        asked.append(pool)
        return Pace(steps=(PastStep("h9", "host-driver-removed", dt.timedelta(minutes=40)),), parallel=1)

    planned = plan_migrate(
        MigrateAsk(targets=("hosts",)), fleet=fleet, policy_of={"hosts": policy}, now=NOW, requested_by="U0ALICE",
        gpu_pods=[train, serve], past_runs=past_runs,
        budgets=[DisruptionBudget(namespace="ml", name="api-pdb", selector={"app": "api"}, disruptions_allowed=0)])

    assert (planned.pool, planned.nodes, planned.order) == ("hosts", ("h1", "h2", "h3"),
                                                            RollingOrder(canary="h3", waves=(("h1", "h2"),)))
    assert [w.nodes for w in planned.plan.waves] == [("h3",), ("h1", "h2")]
    assert (planned.plan.created_for, asked) == ("U0ALICE", ["hosts"])
    summary = planned.plan.summary
    assert (summary.evictions_expected, summary.max_gpus_unavailable) == (2, 16)
    assert summary.notes[-3:] == (
        "the first node alone, then up to 2 at once: snapshot (labels, annotations, taints), cordon, drain GPU pods, "
        "wait for the host driver to go, let the operator deploy its driver, wait for its driver and validator, a "
        "test pod asking for one GPU, every GPU advertised, uncordon",
        "jobs waited for before the node goes (wait_for): h1: ml/train-1",
        "GPU pods evicted (PodDisruptionBudgets respected): h2: ml/serve-1")
    budgets, duration = summary.preflight[:2]
    assert (budgets.code, budgets.nodes, budgets.details) == ("budget-blocks", ("h2",), ("ml/serve-1",))
    assert duration.sentence.startswith(
        "The run takes about 10h45m at the pace of hosts's last runs (evict, gpu-check, validate, wait-for and "
        "wait-for-jobs at their configured timeouts: none finished in those runs) (2 waves, the slowest node h3 "
        "3h35m)"), duration.sentence
