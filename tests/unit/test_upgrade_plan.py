"""How a pool's driver upgrade is planned in each mode: gpuops drives (autoUpgrade off)
or gates the operator's own upgrade (autoUpgrade on): who is held back, which steps each
node goes through, what the plan tells the approvers, and what a rollback gives back."""

from __future__ import annotations

import datetime as dt

import pytest

from workflows.pools.config import GpuCheck, PoolConfig
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
                                  ("validate", "s1"), ("uncordon", "s1"), ("hold", "s1"), ("driver-version", "s1")]
    # The last runs only if the canary fails: the object set back to what it names now.
    assert dict(canary.steps[-1].params) == {"object": "ClusterPolicy", "name": canary.steps[1].params["name"],
                                             "version": NEW, "set_back": True, "on_failure": True}
    assert [_kinds(w) for w in rest] == [[("cordon", n), ("operator-upgrade", n), ("validate", n), ("uncordon", n)]
                                         for n in ("s2", "s3")]
    upgrade = next(s for s in canary.steps if s.kind == "operator-upgrade")
    assert upgrade.params["version"] == NEW
    notes = planned.plan.summary.notes
    assert any("gpuops gates the operator" in n and "upgrade-failed halts the run" in n for n in notes)
    assert any("also drives training-a" in n and "stay held after this run" in n for n in notes)
    assert any(n.startswith("if the canary fails, ClusterPolicy") and "set back to" in n for n in notes)
    assert not any(s.kind in ("evict", "driver") for w in planned.plan.waves for s in w.steps)


def test_with_auto_upgrade_off_gpuops_drives_and_holds_nothing(make):
    planned = _plan(_one_policy(make, auto_upgrade=False))

    assert planned.scope.mode == "gpuops-drives"
    kinds = [s.kind for w in planned.plan.waves for s in w.steps]
    assert "operator-hold" not in kinds and "operator-upgrade" not in kinds
    assert kinds[:5] == ["driver-version", "cordon", "evict", "driver", "validate"]
    assert any("their driver pods take" in n and "next restart" in n for n in planned.plan.summary.notes)
    # Pods that come straight back are evicted again as often as the pool allows (3 unset).
    assert {s.params["evict_retries"] for w in planned.plan.waves for s in w.steps if s.kind == "evict"} == {3}


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
    notes = planned.plan.summary.notes
    assert any("also drives training-a (as run run-old changed it for them)" in n for n in notes)
    # The other pool was held back from the run's version: it runs 580.95.05 already.
    also = next(n for n in notes if "also drives training-a" in n)
    assert "still run 580.95.05" in also and "/gpu upgrade" not in also, also
    # One node: no next wave to wait for, and one node goes back.
    assert not any("before the next wave" in n for n in notes), notes
    assert any("s1 is the only node" in n for n in notes), notes
    assert any("a rollback of run run-old: s1 goes back to 580.95.05" in n for n in notes), notes


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


CHECK = GpuCheck.model_validate({"namespace": "gpu-checks", "command": ["nvidia-smi", "-L"], "timeout": "2m"})


@pytest.mark.parametrize("auto_upgrade", [True, False])
def test_a_configured_check_pod_runs_on_every_node_after_validation_and_before_it_is_given_back(make, auto_upgrade):
    planned = _plan(_one_policy(make, auto_upgrade=auto_upgrade), gpu_check=CHECK)

    for wave in planned.plan.waves:
        for node in wave.nodes:
            kinds = [s.kind for s in wave.steps if s.node == node]
            assert kinds[kinds.index("validate") + 1:kinds.index("uncordon") + 1] == ["gpu-check", "uncordon"]
    check = next(s for s in planned.plan.waves[0].steps if s.kind == "gpu-check")
    assert dict(check.params) == {"namespace": "gpu-checks", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                                  "command": ("nvidia-smi", "-L"), "resource": "nvidia.com/gpu", "timeout_s": 120}
    assert any("a check pod in gpu-checks runs `nvidia-smi -L`" in n and "non-zero exit halts the run" in n
               for n in planned.plan.summary.notes)


def test_a_pools_own_check_replaces_the_fleets_and_a_disabled_one_turns_it_off(make):
    fleet = _one_policy(make, auto_upgrade=False)
    own = POLICY.model_copy(update={"gpu_check": GpuCheck.model_validate({"command": ["own-check"]})})
    planned = plan_upgrade(UpgradeAsk(pool="serving-a", version=NEW), fleet=fleet, policy=own, now=NOW,
                           requested_by="U0ALICE", cluster_policy_scope="all-pools", gpu_check=CHECK)
    commands = {s.params["command"] for w in planned.plan.waves for s in w.steps if s.kind == "gpu-check"}
    assert commands == {("own-check",)}
    off = POLICY.model_copy(update={"gpu_check": GpuCheck(enabled=False)})
    planned = plan_upgrade(UpgradeAsk(pool="serving-a", version=NEW), fleet=fleet, policy=off, now=NOW,
                           requested_by="U0ALICE", cluster_policy_scope="all-pools", gpu_check=CHECK)
    assert not any(s.kind == "gpu-check" for w in planned.plan.waves for s in w.steps)
    assert not any("check pod" in n for n in planned.plan.summary.notes)


@pytest.mark.parametrize(("check", "words"), [
    ({"resource": "cpu"}, "gpu_check.resource must be a GPU resource"),
    ({"command": []}, "gpu_check.command must name a program"),
    ({"namespace": "GPU_Checks"}, "gpu_check.namespace must be a namespace name"),
    ({"timeout": "2s"}, "gpu_check.timeout must be at least 10s"),
    ({"image": "cuda latest"}, "gpu_check.image must be an image reference without spaces"),
])
def test_a_check_pod_configuration_that_cannot_work_is_refused_at_start_with_the_key_and_the_fix(check, words):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=words):
        GpuCheck.model_validate(check)


def test_the_plan_names_per_node_the_jobs_it_waits_for_and_the_gpu_pods_it_moves_off(make):
    fleet = _one_policy(make, auto_upgrade=False)
    trainer = make.pod(node="s1", namespace="ml", name="trainer-0", owner_kind="Job", labels={"must-finish": "yes"},
                       gpu_requests={"nvidia.com/gpu": 8})
    replica = make.pod(node="s2", namespace="serve", name="llm-0", owner_kind="ReplicaSet",
                       gpu_requests={"nvidia.com/gpu": 1})
    done = make.pod(node="s2", namespace="ml", name="old", owner_kind="Job", phase="Succeeded",
                    gpu_requests={"nvidia.com/gpu": 1})
    policy = POLICY.model_copy(update={"wait_for": PoolConfig.WaitFor(selector="must-finish=yes", timeout="1h")})
    planned = plan_upgrade(UpgradeAsk(pool="serving-a", version=NEW), fleet=fleet, policy=policy, now=NOW,
                           requested_by="U0ALICE", cluster_policy_scope="all-pools", gpu_pods=[trainer, replica, done])
    notes = planned.plan.summary.notes
    assert "jobs waited for before the node goes (wait_for): s1: ml/trainer-0" in notes
    assert "GPU pods evicted (PodDisruptionBudgets respected): s2: serve/llm-0" in notes
    gated = _plan(_one_policy(make, auto_upgrade=True), gpu_pods=[trainer, replica])
    assert "GPU pods deleted by the GPU Operator per its upgradePolicy: s1: ml/trainer-0; s2: serve/llm-0" in (
        gated.plan.summary.notes)


def test_a_diag_check_runs_dcgms_diagnostics_on_every_gpu_in_the_pinned_image_and_the_plan_says_so(make):
    diag = POLICY.model_copy(update={"gpu_check": GpuCheck.model_validate({"diag": 3})})
    planned = plan_upgrade(UpgradeAsk(pool="serving-a", version=NEW), fleet=_one_policy(make, auto_upgrade=False),
                           policy=diag, now=NOW, requested_by="U0ALICE", cluster_policy_scope="all-pools")
    check = next(s for s in planned.plan.waves[0].steps if s.kind == "gpu-check")
    assert check.params["diag"] == 3 and check.params["count"] == "all"
    assert check.params["image"] == "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"
    assert "dcgmi diag -r 3 -j" in check.params["command"][2]
    assert check.params["timeout_s"] == 60 * 60  # level 3's own time, not the 5 minutes of a command check
    assert any("runs DCGM's diagnostics at level 3 (`dcgmi diag -r 3 -j`" in n and "a failed test halts the run" in n
               for n in planned.plan.summary.notes)


@pytest.mark.parametrize(("check", "words"), [
    ({"diag": 2, "command": ["nvidia-smi"]}, "gpu_check.diag runs DCGM's own command"),
    ({"diag": 4}, "Input should be 1, 2 or 3"),
    ({"count": 0}, "gpu_check.count must be a number of at least 1 or `all`"),
    ({"count": "some"}, "Input should be 'all'"),
])
def test_a_diag_check_configured_with_a_command_or_an_unknown_level_is_refused_at_start(check, words):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=words):
        GpuCheck.model_validate(check)


def test_a_diag_checks_own_timeout_and_resource_are_kept_when_written():
    check = GpuCheck.model_validate({"diag": 1, "timeout": "3m", "resource": "nvidia.com/gpu.shared", "count": 2})
    assert check.timeout == dt.timedelta(minutes=3) and check.count == 2 and check.resource == "nvidia.com/gpu.shared"


def test_a_pools_burn_in_runs_as_a_second_check_after_its_check_and_the_plan_says_so(make):
    own = POLICY.model_copy(update={"gpu_check": GpuCheck.model_validate({
        "diag": 1, "burn_in": {"image": "nvcr.io/nvidia/pytorch:24.05-py3", "command": ["all_reduce_perf", "-g", "8"]}})})
    planned = plan_upgrade(UpgradeAsk(pool="serving-a", version=NEW), fleet=_one_policy(make, auto_upgrade=False),
                           policy=own, now=NOW, requested_by="U0ALICE", cluster_policy_scope="all-pools")
    for wave in planned.plan.waves:
        for node in wave.nodes:
            steps = [s for s in wave.steps if s.node == node]
            kinds = [s.kind for s in steps]
            at = kinds.index("validate")
            assert kinds[at + 1:at + 4] == ["gpu-check", "gpu-check", "uncordon"]
            check, burn = steps[at + 1], steps[at + 2]
            assert check.params["diag"] == 1 and "purpose" not in check.params
            assert (burn.params["purpose"], burn.params["command"], burn.params["count"], burn.params["timeout_s"]) == (
                "burn-in", ("all_reduce_perf", "-g", "8"), "all", 1800)
    assert any("the pool's burn-in runs `all_reduce_perf -g 8`" in n for n in planned.plan.summary.notes)
