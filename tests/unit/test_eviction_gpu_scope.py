"""Emptying a node of GPU pods before a change that cannot start under them (a driver, a
MIG layout): pods that tolerate the cordon are placed on the node again by their owners,
so the evict step chases them (evicts them again, up to the pool's `evict_retries`
rounds, then fails naming them) and, once all are gone, watches a few seconds for
returns before it is done. A drain (scope all) keeps kubectl's way and does not chase.

The step's logic over the fake cluster (tests/unit/test_step_outcomes.py's context)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from tests.unit.test_step_outcomes import NOW, Ctx
from workflows.engine.steps.contract import Done, Failed, StepNotice, StepParamsError, Waiting
from workflows.engine.steps.eviction import CORDON_TAINT, RETURN_SETTLE, Evict, _tolerates_cordon
from workflows.kube.objects import Placement, Toleration


def chosen(pod: str, uid: str, *, tolerates: bool) -> dict[str, object]:
    return {"pod": pod, "uid": uid, "why": "uses GPUs: nvidia.com/gpu=4", "tolerates_cordon": tolerates}


GPU_INTENT = {"scope": "gpu", "on_timeout": "fail", "evict": [chosen("ml/job", "u-job", tolerates=True)],
              "skipped": [], "terminating": []}


@pytest.fixture
def node(fake_cluster, make):
    """gpu-01, cordoned for the change; ml/job, chosen and evicted, is gone."""
    fake_cluster.add_node(make.node("gpu-01", unschedulable=True))
    return fake_cluster


@pytest.fixture
def returned(node, make):
    """ml/job's owner put a new pod on the cordoned node (it tolerates the cordon)."""
    node.add_pod(make.workload("gpu-01", gpus=4, name="job-2", labels={"app": "job"}), uid="u-job-2")
    return node


def test_a_gpu_pod_that_came_back_is_evicted_again_on_record_and_the_thread_is_told(returned):
    ctx = Ctx(returned, intent=GPU_INTENT)

    outcome = Evict().advance(ctx)

    assert outcome == Waiting("waiting for ml/job-2 to terminate", retry_in=1.0, notice=StepNotice(
        "pods-returned", "ml/job-2 (Job owner) came back to gpu-01 right after eviction: it tolerates "
        "node.kubernetes.io/unschedulable, so the scheduler places it on the cordoned node again. gpuops evicts "
        "again up to 3 times, then halts the run with the node cordoned"))
    assert [(w.verb, w.target) for w in returned.writes] == [("evict", "ml/job-2")]
    # Each pod's eviction on record with its round, then the round's own record.
    assert ctx.records == {
        "evict/u-job-2": {"action": "pod.evict", "target": "ml/job-2", "detail": {
            "node": "gpu-01", "uid": "u-job-2", "why": "uses GPUs: nvidia.com/gpu=4", "returned": True, "round": 1,
            "owner": "Job owner"}},
        "returned/1": {"action": "pods.returned", "target": "node gpu-01",
                       "detail": {"round": 1, "of": 3, "pods": ["ml/job-2 (Job owner)"]}}}


def test_pods_that_keep_coming_back_past_the_pools_rounds_fail_the_step_naming_them(returned, make):
    ctx = Ctx(returned, intent=GPU_INTENT, params={"evict_retries": 1})
    Evict().advance(ctx)  # round 1 of 1: ml/job-2 evicted again
    assert "u-job-2" not in returned.pods
    returned.add_pod(make.workload("gpu-01", gpus=4, name="job-3", labels={"app": "job"}), uid="u-job-3")

    outcome = Evict().advance(ctx)

    assert outcome == Failed(
        "ml/job-3 (Job owner) kept coming back to gpu-01 after 1 more eviction (they tolerate "
        "node.kubernetes.io/unschedulable): remove that toleration from their owners, or scale them down, then start "
        "a new run", {
            "returned": [{"pod": "ml/job-3", "uid": "u-job-3", "why": "uses GPUs: nvidia.com/gpu=4",
                          "owner": "Job owner", "deleting": False}], "rounds": 1},
        code="pods-keep-returning")
    assert [w.target for w in returned.writes] == ["ml/job-2"]  # the third is not evicted: a person decides


def test_each_round_of_returns_is_counted_once_and_a_pod_already_going_starts_none(returned, make):
    ctx = Ctx(returned, intent=GPU_INTENT)
    Evict().advance(ctx)  # round 1: ml/job-2
    returned.add_pod(make.workload("gpu-01", gpus=4, name="job-3", labels={"app": "job"}, deleting=True),
                     uid="u-job-3")
    going = Evict().advance(ctx)  # terminating already: waited for, evicted in no new round
    assert "returned/2" not in ctx.records and isinstance(going, Waiting)
    returned.add_pod(make.workload("gpu-01", gpus=4, name="job-4", labels={"app": "job"}), uid="u-job-4")

    Evict().advance(ctx)

    assert ctx.records["returned/2"]["detail"]["round"] == 2
    assert ctx.records["evict/u-job-4"]["detail"]["round"] == 2
    returned.add_pod(make.workload("gpu-01", gpus=4, name="job-5", labels={"app": "job"}), uid="u-job-5")
    Evict().advance(ctx)
    assert ctx.records["evict/u-job-5"]["detail"]["round"] == 3 and "returned/3" in ctx.records
    assert [w.target for w in returned.writes] == ["ml/job-2", "ml/job-4", "ml/job-5"]


def test_with_no_retries_a_pod_that_comes_back_fails_the_step_at_once_and_a_negative_count_is_refused(returned):
    outcome = Evict().advance(Ctx(returned, intent=GPU_INTENT, params={"evict_retries": 0}))

    assert isinstance(outcome, Failed) and outcome.code == "pods-keep-returning", outcome
    assert returned.writes == []
    with pytest.raises(StepParamsError, match=r"^evict_retries must be a whole number, 0 or more, not -1$"):
        Evict().advance(Ctx(returned, intent=GPU_INTENT, params={"evict_retries": -1}))


def test_a_drain_does_not_chase_pods_that_came_back(returned):
    ctx = Ctx(returned, intent={**GPU_INTENT, "scope": "all"})

    assert isinstance(Evict().advance(ctx), Done)
    assert returned.writes == []


def test_when_all_are_gone_it_watches_a_few_seconds_for_returns_before_it_is_done(node):
    ctx = Ctx(node, intent=GPU_INTENT)

    first = Evict().advance(ctx)
    watching = Waiting("the evicted pods are gone; they tolerate the cordon, so gpuops looks a few seconds more for "
                       "replacements that land on this node again", retry_in=RETURN_SETTLE.total_seconds())
    assert first == watching, first
    assert ctx.records["gone/0"] == {"action": "pods.gone", "target": "node gpu-01", "detail": {"pods": ["ml/job"]}}
    # A restart does not start the wait again: the time is on record, and it waits out the rest only.
    nearly = dataclasses.replace(ctx, now=NOW + RETURN_SETTLE - dt.timedelta(milliseconds=500))
    assert Evict().advance(nearly) == dataclasses.replace(watching, retry_in=0.5)
    later = dataclasses.replace(ctx, now=NOW + RETURN_SETTLE)
    assert isinstance(Evict().advance(later), Done)
    # An intent that chose nothing to evict has nothing to watch for.
    assert isinstance(Evict().advance(Ctx(node, intent={"scope": "gpu"})), Done)
    # Pods that do not tolerate the cordon are not waited for.
    plain = Ctx(node, intent={**GPU_INTENT, "evict": [chosen("ml/job", "u-job", tolerates=False)]})
    assert isinstance(Evict().advance(plain), Done)


@pytest.mark.parametrize(("key", "operator", "effect", "tolerates"), [
    ("", "Exists", "", True),  # tolerates every taint
    (CORDON_TAINT, "Exists", "", True),
    (CORDON_TAINT, "Exists", "NoSchedule", True),
    (CORDON_TAINT, "Equal", "NoSchedule", True),
    (CORDON_TAINT, "Equal", "", True),
    (CORDON_TAINT, "Exists", "NoExecute", False),  # another effect than the cordon's
    ("", "Equal", "", False),  # Equal to an empty key matches no taint
    ("nvidia.com/gpu", "Exists", "NoSchedule", False),
])
def test_which_tolerations_let_a_pod_back_onto_a_cordoned_node(key, operator, effect, tolerates):
    assert _tolerates_cordon([Toleration(key=key, operator=operator, value="", effect=effect)]) is tolerates
    assert _tolerates_cordon([Toleration(key="other", operator="Exists", value="", effect=""),
                              Toleration(key=key, operator=operator, value="", effect=effect)]) is tolerates
    assert _tolerates_cordon([]) is False


def test_the_step_notes_which_chosen_pods_tolerate_the_cordon_and_only_those(node, make):
    """Only they are watched for after all are gone (their owners may place them back)."""
    cordon_proof = Placement(tolerations=(Toleration(key=CORDON_TAINT, operator="Exists", value="", effect=""),))
    for name, uid, owner, placement in (("job", "u-job", "Job", cordon_proof), ("web", "u-web", "ReplicaSet", None),
                                        ("ds", "u-ds", "DaemonSet", cordon_proof)):
        pod = make.workload("gpu-01", gpus=1, name=name) if owner != "DaemonSet" else \
            make.pod(node="gpu-01", name=name, owner_kind="DaemonSet", gpu_requests={"nvidia.com/gpu": 1})
        node.add_pod(dataclasses.replace(pod, placement=placement) if placement else pod, uid=uid)

    intent = Evict().prepare(Ctx(node, params={"scope": "gpu"}))

    assert {t["uid"]: t.get("tolerates_cordon") for t in intent["evict"]} == {"u-job": True, "u-web": None}
    assert [t.get("tolerates_cordon") for t in intent["skipped"]] == [None]  # the DaemonSet's is never waited for


def test_pods_the_step_already_knows_are_not_taken_for_returned_ones_and_returned_ones_are_named_in_order(node, make):
    """The evicted pod still terminating, a pod that was terminating already: known, waited
    for, never counted as come back. Two that did come back are named by namespace and name."""
    node.add_pod(make.workload("gpu-01", gpus=4, name="job", deleting=True), uid="u-job")
    node.add_pod(make.workload("gpu-01", gpus=4, name="going", deleting=True), uid="u-going")
    intent = {**GPU_INTENT, "terminating": [chosen("ml/going", "u-going", tolerates=False)]}
    ctx = Ctx(node, intent=intent)

    assert Evict().advance(ctx) == Waiting("waiting for ml/job, ml/going to terminate", retry_in=1.0)
    assert ctx.records == {} and node.writes == []

    node.add_pod(dataclasses.replace(make.workload("gpu-01", gpus=4, name="zeta"), namespace="ml"), uid="u-zeta")
    node.add_pod(dataclasses.replace(make.workload("gpu-01", gpus=4, name="alpha"), namespace="ml"), uid="u-alpha")
    outcome = Evict().advance(ctx)

    assert ctx.records["returned/1"]["detail"]["pods"] == ["ml/alpha (Job owner)", "ml/zeta (Job owner)"]
    assert isinstance(outcome, Waiting) and [w.target for w in node.writes] == ["ml/alpha", "ml/zeta"]


def test_a_bare_pod_that_arrives_is_evicted_as_returned_with_no_owner_named(node, make):
    node.add_pod(make.pod(node="gpu-01", name="bare", namespace="ml", owner_kind=None,
                          gpu_requests={"nvidia.com/gpu": 1}), uid="u-bare")
    ctx = Ctx(node, intent=GPU_INTENT)

    Evict().advance(ctx)

    assert ctx.records["evict/u-bare"]["detail"]["owner"] is None
    assert ctx.records["returned/1"]["detail"]["pods"] == ["ml/bare"]
