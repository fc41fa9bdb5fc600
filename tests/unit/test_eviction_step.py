"""The evict step where a pod it did not choose shows up on the node, and where the API
refuses an eviction.

With scope gpu a pod that arrives on the cordoned node after the step chose its pods is
taken for one that came back only if it is a GPU pod that still runs: a pod that is no
GPU pod keeps running and hides none after it, a finished pod being cleaned up is no
return, and a pod the step already knew (chosen, waited for or left alone) is never
counted again, even once it starts terminating. A pod that came back and that a
PodDisruptionBudget blocks is retried on each look within its one round, the thread hears
of the budget, the pods chosen first are still evicted alongside it, and at the deadline
its delete is waited for past it as for any chosen pod.

A 429 that is not a budget's waits the API's Retry-After, 2 seconds when it names none,
30 at most. A dry run of an intent written before `skipped` existed still answers, and a
pod that only carries the gpuops.io/gpu-user label says so in the step's detail.

The step's logic over the fake cluster, with tests/unit/test_step_outcomes.py's context.
"""

from __future__ import annotations

import pytest

from tests.unit.fake_cluster import PDB_REFUSAL
from tests.unit.test_eviction_gpu_scope import GPU_INTENT, chosen
from tests.unit.test_eviction_throttled import APF_ANSWER, _answer
from tests.unit.test_step_outcomes import MINUTE, NOW, Ctx, target
from workflows.engine.steps.contract import Done, StepNotice, Waiting
from workflows.engine.steps.eviction import Evict

# ml/job was chosen and evicted; it tolerates no cordon, so the step watches for no return.
GONE_INTENT = {**GPU_INTENT, "evict": [chosen("ml/job", "u-job", tolerates=False)]}
CAME_BACK = StepNotice("pods-returned", "ml/job-2 (Job owner) came back to gpu-01 right after eviction: it tolerates "
                       "node.kubernetes.io/unschedulable, so the scheduler places it on the cordoned node again. gpuops "
                       "evicts again up to 3 times, then halts the run with the node cordoned")


@pytest.fixture
def cordoned(fake_cluster, make):
    """gpu-01, cordoned for a driver or MIG change."""
    fake_cluster.add_node(make.node("gpu-01", unschedulable=True))
    return fake_cluster


def came_back(cluster, make, *, blocked: bool = False) -> None:
    """ml/job's owner put ml/job-2 on the cordoned node; a budget may protect it."""
    cluster.add_pod(make.workload("gpu-01", gpus=4, name="job-2"), uid="u-job-2")
    if blocked:
        cluster.blocked.add("u-job-2")


# ------------------------------------------------------------------ pods that arrive


def test_a_pod_that_is_no_gpu_pod_arriving_keeps_running_and_hides_no_gpu_pod_named_after_it(cordoned, make):
    cordoned.add_pod(make.pod(node="gpu-01", name="cpu-web", namespace="ml", owner_kind="ReplicaSet"), uid="u-web")
    came_back(cordoned, make)
    ctx = Ctx(cordoned, intent=GONE_INTENT)

    outcome = Evict().advance(ctx)

    assert outcome == Waiting("waiting for ml/job-2 to terminate", retry_in=1.0, notice=CAME_BACK)
    assert cordoned.did() == [("evict", "ml/job-2")]
    assert ctx.records["returned/1"]["detail"]["pods"] == ["ml/job-2 (Job owner)"]
    assert "u-web" in cordoned.pods


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_being_cleaned_up_on_the_node_is_no_pod_that_came_back(cordoned, make, phase):
    cordoned.add_pod(make.workload("gpu-01", gpus=4, name="old-run", phase=phase, deleting=True), uid="u-old")
    ctx = Ctx(cordoned, intent=GONE_INTENT)

    assert Evict().advance(ctx) == Done("evicted 1 pod", {"evicted": ["ml/job"], "skipped": []})
    assert ctx.records == {} and cordoned.writes == []


def test_a_pod_left_alone_at_the_start_that_begins_terminating_is_no_pod_that_came_back(cordoned, make):
    """A GPU DaemonSet pod (a device plugin) its controller rolls while the step runs."""
    cordoned.add_pod(make.pod(node="gpu-01", name="plugin", owner_kind="DaemonSet", deleting=True,
                              gpu_requests={"nvidia.com/gpu": 1}), uid="u-plugin")
    left_alone = target("gpu-operator/plugin", "u-plugin", "DaemonSet pod (owner): not evicted")
    ctx = Ctx(cordoned, intent={**GONE_INTENT, "skipped": [left_alone]})

    assert Evict().advance(ctx) == Done("evicted 1 pod; 1 left alone (gpu-operator/plugin)",
                                        {"evicted": ["ml/job"], "skipped": [left_alone]})
    assert ctx.records == {} and cordoned.writes == []


# ------------------------------------------------------------------ a budget and pods that came back


def test_a_pod_that_came_back_and_a_budget_blocks_is_retried_each_look_within_its_one_round(cordoned, make):
    came_back(cordoned, make, blocked=True)
    ctx = Ctx(cordoned, intent=GONE_INTENT, params={"evict_retries": 1})
    blocked = f"eviction of ml/job-2 is blocked by a PodDisruptionBudget: {PDB_REFUSAL}"

    first = Evict().advance(ctx)
    again = Evict().advance(ctx)

    # The thread hears of the budget (what holds the step up), not only that the pod came back.
    for outcome in (first, again):
        assert isinstance(outcome, Waiting) and outcome.notice is not None, outcome
        assert (outcome.reason, outcome.retry_in, outcome.overdue_ok) == (blocked, 2.0, False)
        assert (outcome.notice.key, outcome.notice.text.startswith(f"gpu-01: {blocked}")) == ("pdb-blocked", True)
    # Evicted again on the second look, and still its first (and only allowed) round.
    assert cordoned.did() == [("evict", "ml/job-2"), ("evict", "ml/job-2")]
    assert [key for key in ctx.records if key.startswith("returned/")] == ["returned/1"]


def test_the_pods_chosen_first_are_still_evicted_when_a_pod_comes_back(cordoned, make):
    cordoned.add_pod(make.workload("gpu-01", gpus=4, name="job"), uid="u-job")
    cordoned.blocked.add("u-job")
    came_back(cordoned, make)
    ctx = Ctx(cordoned, intent=GPU_INTENT)

    outcome = Evict().advance(ctx)

    assert cordoned.did() == [("evict", "ml/job"), ("evict", "ml/job-2")]
    assert isinstance(outcome, Waiting) and outcome.notice is not None, outcome
    assert outcome.reason == f"eviction of ml/job is blocked by a PodDisruptionBudget: {PDB_REFUSAL}"
    assert outcome.notice.key == "pdb-blocked"


def test_a_pod_that_came_back_deleted_at_the_deadline_is_waited_for_past_it(cordoned, make):
    came_back(cordoned, make, blocked=True)
    ctx = Ctx(cordoned, intent={**GONE_INTENT, "on_timeout": "delete"}, now=NOW + 10 * MINUTE,
              deadline=NOW + 10 * MINUTE, timeout=10 * MINUTE)

    outcome = Evict().advance(ctx)

    assert outcome == Waiting("eviction timed out; deleted ml/job-2 despite the budget (on_timeout: delete)",
                              retry_in=1.0, overdue_ok=True, notice=CAME_BACK)
    assert cordoned.did() == [("evict", "ml/job-2"), ("delete", "ml/job-2")]


# ------------------------------------------------------------------ the API asks to slow down


@pytest.mark.parametrize(("header", "retry_in"), [
    (None, 2.0), ("0", 2.0), ("1", 2.0), ("10", 10.0), ("30", 30.0), ("31", 30.0), ("120", 30.0)])
def test_a_throttled_eviction_waits_the_apis_retry_after_two_seconds_at_least_and_thirty_at_most(
        cordoned, make, header, retry_in):
    cordoned.add_pod(make.workload("gpu-01", gpus=4, name="job"), uid="u-job")
    refusal = _answer(APF_ANSWER, **({"Retry-After": header} if header is not None else {}))

    def evict_pod(namespace: str, name: str, *, uid: str, dry_run: bool) -> None:
        raise refusal

    cordoned.evict_pod = evict_pod

    assert Evict().advance(Ctx(cordoned, intent=GPU_INTENT)) == Waiting(
        "the API server asked to slow down the eviction of ml/job (429, not a PodDisruptionBudget): Too many "
        "requests, please try again later.", retry_in=retry_in)


# ------------------------------------------------------------------ what the step says


def test_a_dry_run_of_an_intent_written_before_skipped_existed_reads_it_as_none_left_alone(cordoned, make):
    cordoned.add_pod(make.workload("gpu-01", gpus=4, name="job"), uid="u-job")
    only_evict = {"scope": "gpu", "on_timeout": "fail", "evict": GPU_INTENT["evict"]}

    outcome = Evict().advance(Ctx(cordoned, intent=only_evict, dry_run=True))

    assert outcome == Done("would evict 1 pod", {"evicted": ["ml/job"], "skipped": [], "blocked": {}})
    assert [(w.target, w.args["dry_run"]) for w in cordoned.writes] == [("ml/job", True)]


def test_a_pod_that_only_carries_the_gpu_user_label_is_chosen_and_the_detail_names_the_label(cordoned, make):
    cordoned.add_pod(make.pod(node="gpu-01", name="notebook", namespace="ml", owner_kind="ReplicaSet",
                              labels={"gpuops.io/gpu-user": "true"}), uid="u-nb")

    intent = Evict().prepare(Ctx(cordoned, params={"scope": "gpu"}))

    assert intent["evict"] == [target("ml/notebook", "u-nb", "uses GPUs without requesting them "
                                                             "(label gpuops.io/gpu-user=true)")]
