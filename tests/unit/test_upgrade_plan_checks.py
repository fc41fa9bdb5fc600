"""What a pool's driver upgrade plan holds, step by step and word for word
(workflows/upgrade/plan.py, `plan_upgrade`), beyond tests/unit/test_upgrade_plan.py.

Pinned here:
- both modes' whole step lists with their params: gpuops drives (the version set on the
  canary first, cordon, the pool's `wait_for` jobs, eviction at its drain timeout, the
  driver restart and validation at its validate timeout, the check pod, uncordon, the
  soak, and the canary's set-back that runs only on failure) and gpuops gates the
  operator (every node the ClusterPolicy reaches held first, the operator's upgrade given
  the drain timeout plus the `wait_for` timeout plus the validate timeout);
- the summary: evictions expected, the largest wave's GPUs (a node whose count is unknown
  counts none), every note in its order;
- rollbacks: each node takes over the run's cordon, the nodes it held are given back at
  the end, a failed node with findings and an object already set back still move, the
  allowed-versions list does not apply;
- Git mode names who applies the change on both version steps and in its note; an object
  Helm keeps is patched and the plan says what the release's next apply does;
- the check pod's notes (a DCGM diagnostic, a burn-in) with image, resource, namespace;
- refusals with sentence and code: no windows, a version not allowed, a canary with
  findings; a start at the next window; the ready-GPU floor shaping the waves;
- the pre-flight: the pool's pace and the engine's parallel nodes, and a budget's pods
  deleted by the operator when gpuops gates it."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.unit.test_upgrade_plan import CHECK, NEW, NOW, POLICY, _one_policy
from workflows.kube.objects import DisruptionBudget
from workflows.pools.config import GpuCheck, PoolConfig
from workflows.preflight.facts import Pace, PastStep
from workflows.upgrade.plan import RollbackOf, UpgradeAsk, plan_upgrade
from workflows.upgrade.scope import UpgradeRefused

OLD = "580.95.05"
CP = "ClusterPolicy cluster-policy"
# The pool's own timeouts, each distinct so every sum and step says which it used.
TIMED = POLICY.model_copy(update={"wait_for": PoolConfig.WaitFor(selector="must-finish=yes", timeout="1h"),
                                  "drain_timeout": dt.timedelta(minutes=20),
                                  "validate_timeout": dt.timedelta(minutes=7)})
CHECK_STEP = {"timeout_s": 120, "namespace": "gpu-checks", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
              "command": ("nvidia-smi", "-L"), "resource": "nvidia.com/gpu"}
SET_VERSION = {"object": "ClusterPolicy", "name": "cluster-policy", "version": NEW}
SET_BACK = {**SET_VERSION, "set_back": True, "on_failure": True}
SET_BACK_NOTE = (f"if the canary fails, {CP} is set back to {OLD} before the run halts (only while it still names "
                 f"{NEW}; kept by Git, the run says what to set back there); s1 keeps what it was given and waits "
                 "for a rollback request")
GATES_NOTE = (f"gpuops gates the operator (autoUpgrade on for {CP}): every node is held back from the operator's "
              "upgrade (label nvidia.com/gpu-driver-upgrade.skip=true) before the version changes, and let go in "
              "its wave; the operator cordons, waits for jobs, deletes GPU pods and restarts the driver per its "
              "upgradePolicy; gpuops validates every GPU before it uncordons. A node the operator marks "
              "upgrade-failed halts the run, and the nodes not yet let go stay held")


def _pool(make, *, auto_upgrade=False, version=OLD, nodes=("s1", "s2", "s3"), node_kw=None, extra_pods=(),
          **policy_marks):
    """Pool serving-a alone under one ClusterPolicy naming `version`; `node_kw` per node."""
    built = [make.node(n, pool="serving-a", **(node_kw or {}).get(n, {})) for n in nodes]
    pods = [p for n in built for p in make.operands(n.name)]
    policy = make.cluster_policy(driver={"enabled": True, "version": version,
                                         "upgradePolicy": {"autoUpgrade": auto_upgrade}}, **policy_marks)
    return make.fleet(built, [*pods, *extra_pods], policies=[policy])


def _upgrade(fleet, policy=POLICY, *, version=NEW, ask=None, **kw):
    return plan_upgrade(ask or UpgradeAsk(pool="serving-a", version=version), fleet=fleet, policy=policy, now=NOW,
                        requested_by="U0ALICE", **kw)


def _steps(planned) -> list[list[tuple[str, str, dict]]]:
    return [[(s.kind, s.node, dict(s.params)) for s in w.steps] for w in planned.plan.waves]


def _driven_steps(node: str, *, version=NEW, takes_over=None, check=True) -> list[tuple[str, str, dict]]:
    """What gpuops does to one node it drives under TIMED (a rollback's cordon `takes_over`)."""
    return [("cordon", node, {"was_cordoned": False, **({"takes_over": takes_over} if takes_over else {})}),
            ("wait-for-jobs", node, {"timeout_s": 3600, "selector": "must-finish=yes"}),
            ("evict", node, {"scope": "gpu", "pdb_timeout_s": 1200, "pdb_timeout_action": "halt", "evict_retries": 3}),
            ("driver", node, {"timeout_s": 420, "version": version}),
            ("validate", node, {"timeout_s": 420}),
            *([("gpu-check", node, CHECK_STEP)] if check else []),
            ("uncordon", node, {"leave_cordoned": False})]


def _gated_steps(node: str, *, upgrade_s: int, validate_s: int = 420, check=True, takes_over=None):
    return [("cordon", node, {"was_cordoned": False, **({"takes_over": takes_over} if takes_over else {})}),
            ("operator-upgrade", node, {"timeout_s": upgrade_s, "version": NEW}),
            ("validate", node, {"timeout_s": validate_s}),
            *([("gpu-check", node, CHECK_STEP)] if check else []),
            ("uncordon", node, {"leave_cordoned": False})]


# ---- the two modes, whole


def test_gpuops_driving_a_pool_runs_every_node_through_the_pools_timeouts_after_the_canary_sets_the_version(make):
    trainer = make.workload("s2", gpus=2, name="trainer-0", labels={"must-finish": "yes"})
    planned = _upgrade(_pool(make, extra_pods=[trainer]), TIMED, gpu_check=CHECK, gpu_pods=[trainer])

    assert _steps(planned) == [
        [("driver-version", "s1", SET_VERSION), *_driven_steps("s1"), ("hold", "s1", {"seconds": 300}),
         ("driver-version", "s1", SET_BACK)],
        _driven_steps("s2"),
        _driven_steps("s3")]
    summary = planned.plan.summary
    assert (summary.evictions_expected, summary.max_gpus_unavailable) == (1, 8)
    assert summary.notes == (
        f"{CP} is set to {NEW} at the canary's first step (now: {OLD} on 3 nodes)",
        "s1 goes first, alone; the pool then waits 5m before the next wave",
        SET_BACK_NOTE,
        "jobs waited for before the node goes (wait_for): s2: ml/trainer-0",
        "before each node is given back, a check pod in gpu-checks runs `nvidia-smi -L` on it "
        "(nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04, one nvidia.com/gpu); a non-zero exit halts the run with "
        "the node cordoned")


@pytest.mark.parametrize(("policy", "upgrade_s"), [
    (TIMED, 1200 + 3600 + 420),  # drain timeout + wait_for's timeout + validate timeout
    (TIMED.model_copy(update={"wait_for": None}), 1200 + 420),
])
def test_gating_the_operator_holds_every_node_it_reaches_first_and_gives_its_upgrade_the_pools_time(
        make, policy, upgrade_s):
    planned = _upgrade(_one_policy(make, auto_upgrade=True), policy, gpu_check=CHECK,
                       cluster_policy_scope="all-pools")

    assert _steps(planned) == [
        [("operator-hold", "s1", {"nodes": ("s1", "s2", "s3", "t1")}), ("driver-version", "s1", SET_VERSION),
         *_gated_steps("s1", upgrade_s=upgrade_s), ("hold", "s1", {"seconds": 300}),
         ("driver-version", "s1", SET_BACK)],
        _gated_steps("s2", upgrade_s=upgrade_s),
        _gated_steps("s3", upgrade_s=upgrade_s)]
    assert planned.plan.summary.notes == (
        f"{CP} is set to {NEW} at the canary's first step (now: {OLD} on 3 nodes)",
        GATES_NOTE,
        "s1 goes first, alone; the pool then waits 5m before the next wave",
        SET_BACK_NOTE,
        "before each node is given back, a check pod in gpu-checks runs `nvidia-smi -L` on it "
        "(nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04, one nvidia.com/gpu); a non-zero exit halts the run with "
        "the node cordoned",
        f"{CP} also drives training-a (upgrades.cluster_policy_scope: all-pools): their nodes are held back from "
        f"the operator's upgrade and stay held after this run; upgrade them in turn with /gpu upgrade <pool> to {NEW}")


# ---- rollbacks


def test_a_gated_rollback_takes_over_the_runs_cordon_and_gives_the_nodes_it_held_back_at_the_end(make):
    fleet = _one_policy(make, auto_upgrade=True, held=("s2", "s3"), policy_version=NEW, upgraded=("s1",))
    planned = _upgrade(fleet, TIMED, version=OLD, gpu_check=CHECK,
                       rollback=RollbackOf(run="run-old", nodes=("s1",), version=OLD, release=("s2", "s3")))

    back = {"object": "ClusterPolicy", "name": "cluster-policy", "version": OLD}
    assert _steps(planned) == [[
        ("operator-hold", "s1", {"nodes": ("s1", "t1")}), ("driver-version", "s1", back),
        ("cordon", "s1", {"was_cordoned": False, "takes_over": "run-old"}),
        ("operator-upgrade", "s1", {"timeout_s": 1200 + 3600 + 420, "version": OLD}),
        ("validate", "s1", {"timeout_s": 420}), ("gpu-check", "s1", CHECK_STEP),
        ("uncordon", "s1", {"leave_cordoned": False}), ("hold", "s1", {"seconds": 300}),
        ("operator-hold", "s1", {"nodes": ("s2", "s3"), "release": True})]]
    assert planned.plan.summary.notes[-2:] == (
        "at the end, s2 and s3 (held back by run-old and never upgraded) are given back to the operator",
        f"a rollback of run run-old: s1 goes back to {OLD}, taking over the cordon that run left")


def test_a_rollback_moves_its_failed_node_despite_its_findings_the_object_set_back_and_the_allowed_list(make):
    # s1 advertises 7 of its 8 GPUs (an open finding); the canary's set-back already put
    # the object back to OLD and every node reports OLD; OLD is not in the allowed list.
    fleet = _pool(make, nodes=("s1", "s2"), node_kw={"s1": {"capacity": {"nvidia.com/gpu": "7"}}})
    planned = _upgrade(fleet, TIMED, version=OLD, allowed_versions=(NEW,),
                       rollback=RollbackOf(run="run-9", nodes=("s1",), version=OLD))

    assert _steps(planned) == [[
        ("driver-version", "s1", {"object": "ClusterPolicy", "name": "cluster-policy", "version": OLD}),
        *_driven_steps("s1", version=OLD, takes_over="run-9", check=False), ("hold", "s1", {"seconds": 300})]]
    assert planned.plan.summary.notes == (
        f"{CP} is set to {OLD} at the canary's first step (now: {OLD} on 2 nodes)",
        "s1 is the only node; the run watches it 5m after its upgrade, then ends",
        f"a rollback of run run-9: s1 goes back to {OLD}, taking over the cordon that run left")


# ---- who keeps the version


def test_in_git_mode_both_version_steps_and_the_note_name_who_applies_the_change_in_git(make):
    flux = {"kustomize.toolkit.fluxcd.io/name": "gpu", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"}
    planned = _upgrade(_pool(make, labels=flux), POLICY.model_copy(update={"driver_version_source": "git"}))

    canary = planned.plan.waves[0].steps
    by = "Flux Kustomization flux-system/gpu"
    assert (canary[0].kind, dict(canary[0].params)) == ("driver-version", {**SET_VERSION, "git": True, "owner": by})
    assert (canary[-1].kind, dict(canary[-1].params)) == ("driver-version",
                                                          {**SET_BACK, "git": True, "owner": by})
    assert planned.plan.summary.notes[0] == (
        f"Git mode: gpuops does not patch {CP}. Once the run starts, its thread says to change spec.driver.version "
        f"from {OLD} to {NEW} in Git; {by} applies it, and the run waits inside the window until {CP} names {NEW}, "
        "then goes wave by wave. Another version halts the run before any node moves; a window that ends first "
        "gives every node back untouched")


def test_an_object_helm_keeps_is_patched_and_the_plan_says_what_the_releases_next_apply_does(make):
    helm = {"meta.helm.sh/release-name": "gpu-operator"}
    planned = _upgrade(_pool(make, auto_upgrade=True, annotations=helm))

    canary = planned.plan.waves[0].steps
    assert [dict(s.params) for s in canary if s.kind == "driver-version"] == [SET_VERSION, SET_BACK]
    assert planned.plan.summary.notes == (
        f"{CP} is set to {NEW} at the canary's first step (now: {OLD} on 3 nodes)",
        f"{CP} is applied by Helm release gpu-operator (annotation meta.helm.sh/release-name=gpu-operator): the "
        "next apply of that release sets the version it names",
        GATES_NOTE,
        "s1 goes first, alone; the pool then waits 5m before the next wave",
        SET_BACK_NOTE)


# ---- the check pod's notes


def test_a_diag_check_and_a_burn_in_are_noted_with_their_image_resource_and_namespace(make):
    check = GpuCheck.model_validate({
        "diag": 2, "namespace": "dcgm-checks",
        "burn_in": {"image": "nvcr.io/nvidia/pytorch:24.05-py3", "command": ["all_reduce_perf", "-g", "8"]}})
    planned = _upgrade(_pool(make), POLICY.model_copy(update={"gpu_check": check}))

    assert planned.plan.summary.notes[-2:] == (
        "before each node is given back, a check pod in dcgm-checks runs DCGM's diagnostics at level 2 "
        "(`dcgmi diag -r 2 -j`, nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04) on every "
        "nvidia.com/gpu of the node; a failed test halts the run with the node cordoned, quoting it",
        "after the check, the pool's burn-in runs `all_reduce_perf -g 8` (nvcr.io/nvidia/pytorch:24.05-py3) on "
        "every nvidia.com/gpu of each node; a non-zero exit halts the run with the node cordoned")


# ---- refusals, windows and waves


@pytest.mark.parametrize(("policy", "kw", "code", "reason"), [
    (PoolConfig.model_validate({"kind": "training"}), {}, "windows",
     "pool serving-a has no maintenance windows, so no upgrade may run: configure pools.serving-a.windows"),
    (POLICY, {"allowed_versions": ("580.95.06",)}, "version-not-allowed",
     f"driver {NEW} is not in upgrades.allowed_versions (580.95.06); ask an admin to add it"),
    (POLICY.model_copy(update={"canary": "s2"}), {}, "canary-has-findings",
     "s2, the canary of pool serving-a, has an open finding (advertised-mismatch) the driver upgrade does not fix, "
     "and the driver upgrade starts with its canary: fix it first, name another canary in the pool's "
     "configuration, or ask with `--include s2` (validation waits for every GPU it should advertise; if it does "
     "not pass, the run halts there before any other node changes)."),
])
def test_an_upgrade_is_refused_with_the_sentence_and_code_of_what_stops_it(make, policy, kw, code, reason):
    fleet = _pool(make, node_kw={"s2": {"capacity": {"nvidia.com/gpu": "7"}}})
    with pytest.raises(UpgradeRefused) as refused:
        _upgrade(fleet, policy, **kw)
    assert (refused.value.code, refused.value.reason) == (code, reason)


def test_an_upgrade_asked_for_the_next_window_starts_at_it_and_must_start_before_it_ends(make):
    # Friday 10:00, inside today's window: the next window is Saturday's.
    daily = PoolConfig.model_validate({"kind": "training", "windows": [
        {"days": "daily", "start": "08:00", "end": "12:00", "timezone": "UTC"}]})
    planned = _upgrade(_pool(make), daily, ask=UpgradeAsk(pool="serving-a", version=NEW, next_window=True))

    saturday = dt.datetime(2026, 12, 5, 8, 0, tzinfo=dt.timezone.utc)
    assert (planned.window_start, planned.window_end) == (saturday, saturday + dt.timedelta(hours=4))
    assert (planned.plan.summary.window_start, planned.plan.summary.window_end) == (
        saturday, saturday + dt.timedelta(hours=4))


def test_the_pools_ready_gpu_floor_keeps_each_wave_smaller_than_its_budget_alone_would(make):
    two = {"kind": "training", "windows": "always", "max_unavailable": 2}
    # 24 GPUs; at most 2 nodes out, but at least 16 GPUs ready: one node at a time.
    floored = _upgrade(_pool(make), PoolConfig.model_validate({**two, "min_ready_gpus": 16}))
    assert [w.nodes for w in floored.plan.waves] == [("s1",), ("s2",), ("s3",)]
    assert floored.plan.summary.max_gpus_unavailable == 8
    free = _upgrade(_pool(make), PoolConfig.model_validate(two))
    assert [w.nodes for w in free.plan.waves] == [("s1",), ("s2", "s3")]
    assert free.plan.summary.max_gpus_unavailable == 16


def test_a_node_whose_gpu_count_gfd_does_not_report_counts_no_gpus_in_the_largest_wave(make):
    planned = _upgrade(_pool(make, nodes=("s1",), node_kw={"s1": {"labels": {"nvidia.com/gpu.count": None}}}))

    assert planned.plan.nodes == ("s1",)
    assert planned.plan.summary.max_gpus_unavailable == 0


# ---- what the pre-flight checks read


def test_the_preflight_reads_the_pools_pace_and_parallel_nodes_and_leaves_a_budgets_pods_to_the_operator(make):
    api = make.workload("s2", gpus=1, name="api-0", namespace="serve", owner_kind="StatefulSet",
                        labels={"app": "api"})
    budget = DisruptionBudget(namespace="serve", name="api-pdb", selector={"app": "api"}, disruptions_allowed=0)
    asked: list[str] = []

    def pace_of(pool: str) -> Pace:
        asked.append(pool)
        return Pace(steps=tuple(PastStep(node=n, kind="operator-upgrade", took=dt.timedelta(minutes=20))
                                for n in ("s1", "s2", "s3")), parallel=1)

    two = PoolConfig.model_validate({"kind": "training", "windows": "always", "max_unavailable": 2,
                                     "upgrade_soak": "5m"})
    planned = _upgrade(_pool(make, auto_upgrade=True, extra_pods=[api]), two, gpu_pods=[api], budgets=[budget],
                       past_runs=pace_of)

    assert asked == ["serving-a"]
    assert [w.nodes for w in planned.plan.waves] == [("s1",), ("s2", "s3")]
    found = {n.code: n for n in planned.plan.summary.preflight}
    assert found["budget-blocks"].sentence == (
        "PodDisruptionBudget serve/api-pdb allows 0 disruptions now, but a wave moves 1 of the GPU pods it protects "
        "(serve/api-0): the GPU Operator deletes them per its upgradePolicy (its own drain settings decide).")
    # 20 minutes of operator-upgrade a node, validate at its 10 minutes, the canary's 5m
    # soak; one node of a wave at a time: the second wave takes its two nodes' time (1h).
    assert found["no-window-end"].sentence == (
        "The run takes about 1h35m at the pace of serving-a's last runs (validate at their configured timeouts: "
        "none finished in those runs) (2 waves, the slowest node s1 35m); the pool's windows are always open: "
        "no end to fit")
