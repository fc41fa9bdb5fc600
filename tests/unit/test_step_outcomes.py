"""Cordon, uncordon and evict one call at a time, over the in-memory cluster: the whole
outcome each call gives (the note a person reads, the detail the run keeps, how soon
it looks again, what the thread is told) and the writes it made, for every case the
cordon-restore and PDB rules distinguish.

The engine's own tests (test_engine_safety.py) run whole drains; these pin each answer.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from workflows.engine.steps.contract import Done, Failed, LeftOut, StepNotice, StepParamsError, Waiting
from workflows.engine.steps.cordoning import Cordon, CordonMark, Uncordon
from workflows.engine.steps.eviction import Evict
from workflows.kube.labels import ANNOTATION_CORDONED_BY

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
MINUTE = dt.timedelta(minutes=1)
RUN = "run-2"
MARK_TEXT = '{"at":"2025-06-07T12:00:00.000000Z","by":"gpuops for alice","prior_unschedulable":%s,"run":"%s"}'


@dataclass
class Ctx:
    """`workflows.engine.steps.StepContext` over the fake cluster, recording intents and acts."""

    gateway: Any
    node: str = "gpu-01"
    kind: str = "step"
    params: dict[str, Any] = field(default_factory=dict)
    intent: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    now: dt.datetime = NOW
    zone: dt.tzinfo = dt.timezone.utc
    timeout: dt.timedelta | None = None
    deadline: dt.datetime | None = None
    run_id: str = RUN
    request_id: str = "req-1"
    plan_kind: str = "drain"
    cordoned_by: str = "gpuops for alice"
    window_end: dt.datetime | None = None
    unfinished: tuple[str, ...] = ()
    cordon_intent: dict[str, Any] | None = None
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    recorded_times: dict[str, dt.datetime] = field(default_factory=dict)
    acts: int = 0

    @property
    def expired(self) -> bool:
        return self.deadline is not None and self.now >= self.deadline

    def act(self) -> None:
        self.acts += 1

    def record(self, *, key: str, action: str, target: str, detail: Any) -> None:
        self.records.setdefault(key, {"action": action, "target": target, "detail": detail})
        self.recorded_times.setdefault(key, self.now)

    def recorded(self, key: str) -> bool:
        return key in self.records

    def recorded_at(self, key: str) -> dt.datetime | None:
        return self.recorded_times.get(key)

    def step_intent(self, kind: str) -> dict[str, Any] | None:
        return self.cordon_intent if kind == "cordon" else None

    def run_unfinished(self, run_id: str) -> bool:
        return run_id in self.unfinished


@pytest.fixture
def cluster(fake_cluster, make):
    fake_cluster.add_node(make.node("gpu-01"))
    return fake_cluster


def set_node(cluster, make, *, unschedulable: bool, mark: tuple[bool, str] | None = None) -> str:
    annotations = {ANNOTATION_CORDONED_BY: MARK_TEXT % (str(mark[0]).lower(), mark[1])} if mark else None
    cluster.add_node(make.node("gpu-01", unschedulable=unschedulable, annotations=annotations))
    return cluster.node("gpu-01").resource_version


def written_mark(write) -> dict[str, Any]:
    return json.loads(write.args["annotations"][ANNOTATION_CORDONED_BY])


# ------------------------------------------------------------------ cordon


def test_cordoning_a_schedulable_node_marks_it_as_this_runs_in_the_same_patch(cluster):
    version = cluster.node("gpu-01").resource_version
    ctx = Ctx(cluster)

    assert Cordon().prepare(ctx) == {"prior_unschedulable": False}
    assert Cordon().advance(ctx) == Done("cordoned (it was schedulable)", {"prior_unschedulable": False})

    (write,) = cluster.writes
    assert (write.verb, write.target, write.args["resource_version"], write.args["dry_run"]) == (
        "cordon", "gpu-01", version, False)
    assert written_mark(write) == {"run": RUN, "by": "gpuops for alice", "prior_unschedulable": False,
                                   "at": "2025-06-07T12:00:00.000000Z"}
    assert ctx.acts == 1
    # Looked at again (after a restart): the mark is in place, nothing more is written.
    assert Cordon().advance(ctx) == Done("cordoned by this run (found in place)", {"prior_unschedulable": False})
    assert len(cluster.writes) == 1


def test_a_dry_run_cordon_asks_the_api_with_dry_run_and_changes_nothing(cluster):
    ctx = Ctx(cluster, dry_run=True)

    assert Cordon().advance(ctx) == Done("would cordon it (it was schedulable)", {"prior_unschedulable": False})

    assert [(w.verb, w.args["dry_run"]) for w in cluster.writes] == [("cordon", True)]
    assert not cluster.node("gpu-01").unschedulable


def test_a_node_someone_cordoned_gets_only_the_mark_saying_so_and_is_found_in_place_later(cluster, make):
    version = set_node(cluster, make, unschedulable=True)
    ctx = Ctx(cluster)

    assert Cordon().prepare(ctx) == {"prior_unschedulable": True}
    assert Cordon().advance(ctx) == Done(
        "already cordoned by someone else: marked it, and it will stay cordoned at the end", {"prior_unschedulable": True})
    (write,) = cluster.writes
    assert (write.verb, write.args["resource_version"], write.args["dry_run"]) == ("annotate", version, False)
    assert written_mark(write)["prior_unschedulable"] is True
    assert Cordon().advance(ctx) == Done(
        "this run's cordon mark is in place (it was cordoned before this run, and stays so)",
        {"prior_unschedulable": True})
    dry = Ctx(cluster, dry_run=True, run_id="run-9")
    set_node(cluster, make, unschedulable=True)
    assert Cordon().advance(dry).note == "already cordoned by someone else: would mark it, and it will stay cordoned at the end"
    assert cluster.writes[-1].args["dry_run"] is True


def test_a_node_another_run_holds_is_named_in_the_intent_and_left_to_that_run(cluster, make):
    set_node(cluster, make, unschedulable=True, mark=(False, "run-1"))
    ctx = Ctx(cluster)

    assert Cordon().prepare(ctx) == {"prior_unschedulable": True,
                                     "other_mark": {"run": "run-1", "by": "gpuops for alice"}}
    assert Cordon().advance(ctx) == Done(
        "already cordoned by gpuops run run-1 (gpuops for alice); left to that run: this run will not uncordon it",
        {"prior_unschedulable": True, "held_by_run": "run-1"})
    assert Cordon().advance(Ctx(cluster, unfinished=("run-1",))) == Failed(
        "gpu-01 is cordoned by gpuops run run-1 (gpuops for alice), which has not finished; two runs must not "
        "change one node at once. Let that run finish, or abort it, then start this one again",
        code="node-in-another-run")
    assert cluster.writes == []
    # This run's own mark is not "another run's".
    set_node(cluster, make, unschedulable=True, mark=(False, RUN))
    assert Cordon().prepare(ctx) == {"prior_unschedulable": True}


@pytest.mark.parametrize("before", [False, True], ids=["schedulable-before", "cordoned-before"])
def test_a_rollback_takes_over_the_cordon_of_the_run_it_undoes_with_that_runs_record_of_the_node(cluster, make,
                                                                                                  before):
    set_node(cluster, make, unschedulable=True, mark=(before, "run-1"))
    ctx = Ctx(cluster, params={"takes_over": "run-1"})

    then = "it was cordoned before that run, so it stays cordoned" if before else "it is given back at the end"
    assert Cordon().advance(ctx) == Done(f"took over the cordon run run-1 left: {then}",
                                         {"prior_unschedulable": before})
    (write,) = cluster.writes
    assert (written_mark(write)["run"], written_mark(write)["prior_unschedulable"]) == (RUN, before)


def test_a_node_changed_between_the_read_and_the_patch_is_read_again_soon(cluster):
    original = cluster.cordon_node

    def changed_first(name: str, **kwargs: Any) -> Any:
        cluster.label_node(name, labels={"team": "ml"}, dry_run=False)
        return original(name, **kwargs)

    cluster.cordon_node = changed_first
    assert Cordon().advance(Ctx(cluster)) == Waiting("gpu-01 changed while gpuops was changing it; reading it again",
                                                     retry_in=0.2)


def test_a_mark_gpuops_did_not_write_whole_reads_with_empty_fields(cluster, make):
    cluster.add_node(make.node("gpu-01", annotations={ANNOTATION_CORDONED_BY: '{"run": "run-1"}'}))
    assert CordonMark.of(cluster.node("gpu-01")) == CordonMark(run="run-1", by="", prior_unschedulable=False, at="")


def assert_step_time(cluster, logic: Any, kind: str, default_s: int) -> None:
    """`logic`'s step takes `default_s` unless its params say `timeout_s`, and no time at
    all is refused naming the step."""
    assert logic.timeout(Ctx(cluster, kind=kind)) == dt.timedelta(seconds=default_s)
    assert logic.timeout(Ctx(cluster, kind=kind, params={"timeout_s": 30})) == dt.timedelta(seconds=30)
    with pytest.raises(StepParamsError, match=f"^{kind} step: params.timeout_s must be more than 0, not 0$"):
        logic.timeout(Ctx(cluster, kind=kind, params={"timeout_s": 0}))


@pytest.mark.parametrize("logic", [Cordon(), Uncordon()])
def test_cordon_and_uncordon_take_two_minutes_unless_told(logic, cluster):
    assert logic.timeout(Ctx(cluster)) == dt.timedelta(seconds=120)
    assert logic.timeout(Ctx(cluster, params={"timeout_s": 30})) == dt.timedelta(seconds=30)


@pytest.mark.parametrize(("logic", "kind"), [(Cordon(), "cordon"), (Uncordon(), "uncordon"), (Evict(), "evict")])
def test_a_cordon_uncordon_or_evict_step_with_no_time_at_all_is_refused_naming_the_step(logic, kind, cluster):
    with pytest.raises(StepParamsError, match=f"^{kind} step: params.timeout_s must be more than 0, not 0$"):
        logic.timeout(Ctx(cluster, kind=kind, params={"timeout_s": 0}))


# ------------------------------------------------------------------ uncordon


def test_uncordoning_gives_back_only_a_node_this_run_cordoned_from_schedulable(cluster, make):
    version = set_node(cluster, make, unschedulable=True, mark=(False, RUN))
    ctx = Ctx(cluster)

    assert Uncordon().prepare(ctx) == {"unschedulable": True, "ours": True, "prior_unschedulable": False}
    assert Uncordon().advance(ctx) == Done("uncordoned", {"unschedulable": False})

    (write,) = cluster.writes
    assert (write.verb, write.args["annotations"], write.args["resource_version"], write.args["dry_run"]) == (
        "uncordon", {ANNOTATION_CORDONED_BY: None}, version, False)
    assert ctx.acts == 1 and not cluster.node("gpu-01").unschedulable


def test_a_node_cordoned_before_the_run_loses_only_the_mark(cluster, make):
    version = set_node(cluster, make, unschedulable=True, mark=(True, RUN))
    ctx = Ctx(cluster)

    assert Uncordon().prepare(ctx) == {"unschedulable": True, "ours": True, "prior_unschedulable": True}
    assert Uncordon().advance(ctx) == Done(
        "stays cordoned: it was cordoned before this run; only gpuops' mark was removed", {"unschedulable": True})

    (write,) = cluster.writes
    assert (write.verb, write.args["annotations"], write.args["resource_version"], write.args["dry_run"]) == (
        "annotate", {ANNOTATION_CORDONED_BY: None}, version, False)
    assert cluster.node("gpu-01").unschedulable


@pytest.mark.parametrize("unschedulable, mark, state", [(True, (False, "run-1"), "cordoned"),
                                                         (True, None, "cordoned"), (False, None, "schedulable")])
def test_a_node_without_this_runs_mark_is_left_as_it_is(cluster, make, unschedulable, mark, state):
    set_node(cluster, make, unschedulable=unschedulable, mark=mark)
    ctx = Ctx(cluster)

    assert Uncordon().prepare(ctx) == {"unschedulable": unschedulable, "ours": False, "prior_unschedulable": None}
    assert Uncordon().advance(ctx) == Done(f"not cordoned by this run: left as it is ({state})",
                                           {"unschedulable": unschedulable})
    assert cluster.writes == [] and ctx.acts == 0


def test_an_uncordon_racing_another_write_reads_the_node_again(cluster, make):
    set_node(cluster, make, unschedulable=True, mark=(True, RUN))
    original = cluster.annotate_node

    def changed_first(name: str, **kwargs: Any) -> Any:
        cluster.label_node(name, labels={"team": "ml"}, dry_run=False)
        return original(name, **kwargs)

    cluster.annotate_node = changed_first
    assert Uncordon().advance(Ctx(cluster)) == Waiting(
        "gpu-01 changed while gpuops was changing it; reading it again", retry_in=0.2)
    assert CordonMark.of(cluster.node("gpu-01")) is not None


@pytest.mark.parametrize("cordon_intent, node_unschedulable, stays", [
    ({"prior_unschedulable": False}, False, False),
    ({"prior_unschedulable": True}, False, True),    # what the cordon found decides, not the node now
    # A finished run's stale mark on a schedulable node: the real run cordons it, and gives it back.
    ({"prior_unschedulable": False, "other_mark": {"run": "run-1"}}, False, False),
    # Another run's mark on a cordoned node: that node stays cordoned.
    ({"prior_unschedulable": True, "other_mark": {"run": "run-1"}}, False, True),
    (None, True, True),                               # no cordon step: the node as it is decides
    (None, False, False),
])
def test_a_dry_run_uncordon_answers_from_what_the_cordon_found(cluster, make, cordon_intent, node_unschedulable,
                                                               stays):
    set_node(cluster, make, unschedulable=node_unschedulable)
    ctx = Ctx(cluster, dry_run=True, cordon_intent=cordon_intent)

    outcome = Uncordon().advance(ctx)

    if stays:
        assert outcome == Done("stays cordoned: it was cordoned before this run; only gpuops' mark was removed",
                               {"unschedulable": True})
        assert cluster.writes == []
    else:
        assert outcome == Done("would uncordon it", {"unschedulable": False})
        (write,) = cluster.writes
        assert (write.verb, write.args["annotations"], write.args["resource_version"], write.args["dry_run"]) == (
            "uncordon", {ANNOTATION_CORDONED_BY: None}, None, True)
    assert not cluster.node("gpu-01").unschedulable or node_unschedulable


# ------------------------------------------------------------------ evict


@pytest.fixture
def pods(cluster, make):
    """gpu-01 runs a GPU job, a CPU sidecar, a DaemonSet pod, a finished pod and one
    already terminating."""
    cluster.add_pod(make.workload("gpu-01", gpus=4, name="job", labels={"app": "job"}), uid="u-job")
    cluster.add_pod(make.pod(node="gpu-01", name="side", namespace="ml", owner_kind="ReplicaSet"), uid="u-side")
    cluster.add_pod(make.pod(node="gpu-01", name="ds", owner_kind="DaemonSet"), uid="u-ds")
    cluster.add_pod(make.workload("gpu-01", gpus=1, name="done", phase="Succeeded"), uid="u-done")
    cluster.add_pod(make.workload("gpu-01", gpus=1, name="going", deleting=True), uid="u-going")
    return cluster


def target(pod: str, uid: str, why: str) -> dict[str, str]:
    return {"pod": pod, "uid": uid, "why": why}


DRAIN_INTENT = {
    "scope": "all", "on_timeout": "fail",
    "evict": [target("ml/job", "u-job", "uses GPUs: nvidia.com/gpu=4"),
              target("ml/side", "u-side", "uses no GPU; evicted because a drain empties the node (scope all)")],
    "skipped": [target("gpu-operator/ds", "u-ds", "DaemonSet pod (owner): its controller would put it straight back"),
                target("ml/done", "u-done", "finished (Succeeded): holds nothing, left alone")],
    "terminating": [target("ml/going", "u-going", "already terminating: waited for, not evicted")],
}


def test_a_drain_chooses_every_pod_but_daemonsets_and_finished_ones_and_waits_for_terminating_ones(pods):
    intent = Evict().prepare(Ctx(pods, params={"scope": "all-non-daemonset"}))
    assert intent["evict"] == DRAIN_INTENT["evict"] and intent["terminating"] == DRAIN_INTENT["terminating"]
    assert [t["pod"] for t in intent["skipped"]] == ["gpu-operator/ds", "ml/done"]
    assert (intent["scope"], intent["on_timeout"]) == ("all", "fail")
    assert list(intent) == ["scope", "on_timeout", "evict", "skipped", "terminating"]


@pytest.mark.parametrize("action, on_timeout", [("wait", "fail"), ("skip", "skip"), ("delete", "delete"),
                                                (None, "fail"), ("bogus", "fail")])
def test_the_pools_pdb_timeout_action_becomes_the_steps_on_timeout(pods, action, on_timeout):
    params = {"pdb_timeout_action": action} if action else {}
    assert Evict().prepare(Ctx(pods, params=params))["on_timeout"] == on_timeout
    # Written on the step itself, on_timeout wins.
    assert Evict().prepare(Ctx(pods, params={**params, "on_timeout": "skip"}))["on_timeout"] == "skip"
    with pytest.raises(StepParamsError, match="^on_timeout must be 'fail', 'skip' or 'delete', not 'later'$"):
        Evict().prepare(Ctx(pods, params={**params, "on_timeout": "later"}))


@pytest.mark.parametrize("kind_default, plan_kind, params, scope", [
    (None, "drain", {}, "all"), (None, "upgrade", {}, "gpu"), ("all", "upgrade", {}, "all"),
    (None, "drain", {"scope": "gpu"}, "gpu"), (None, "upgrade", {"scope": "all-non-daemonset"}, "all"),
])
def test_the_evict_scope_follows_the_plan_kind_the_step_kind_and_its_params(cluster, kind_default, plan_kind, params,
                                                                           scope):
    assert Evict(default_scope=kind_default).scope(Ctx(cluster, plan_kind=plan_kind, params=params)) == scope
    with pytest.raises(StepParamsError, match="^evict scope must be 'gpu' or 'all', not 'GPU'$"):
        Evict().scope(Ctx(cluster, params={"scope": "GPU"}))


def test_an_evict_waits_ten_minutes_unless_told_and_a_drain_plan_says_the_pools_drain_timeout(cluster):
    assert Evict().timeout(Ctx(cluster)) == dt.timedelta(seconds=600)
    assert Evict().timeout(Ctx(cluster, params={"pdb_timeout_s": 45})) == dt.timedelta(seconds=45)
    assert Evict().timeout(Ctx(cluster, params={"pdb_timeout_s": 45, "timeout_s": 30})) == dt.timedelta(seconds=30)


def test_evicting_sends_each_chosen_pod_through_the_eviction_api_once_on_record_and_is_done_when_they_are_gone(pods):
    ctx = Ctx(pods, intent=DRAIN_INTENT)

    waiting = Evict().advance(ctx)

    # What was there when it looked; the next look finds the evicted ones gone.
    assert waiting == Waiting("waiting for ml/job, ml/side, ml/going to terminate", retry_in=1.0)
    assert [(w.verb, w.target, dict(w.args)) for w in pods.writes] == [
        ("evict", "ml/job", {"uid": "u-job", "dry_run": False}), ("evict", "ml/side", {"uid": "u-side", "dry_run": False})]
    assert ctx.records == {
        "evict/u-job": {"action": "pod.evict", "target": "ml/job",
                        "detail": {"node": "gpu-01", "uid": "u-job", "why": "uses GPUs: nvidia.com/gpu=4"}},
        "evict/u-side": {"action": "pod.evict", "target": "ml/side",
                         "detail": {"node": "gpu-01", "uid": "u-side",
                                    "why": "uses no GPU; evicted because a drain empties the node (scope all)"}}}
    pods.terminate("u-going")
    assert Evict().advance(ctx) == Done("evicted 2 pods; 2 left alone (gpu-operator/ds and ml/done)",
                                        {"evicted": ["ml/job", "ml/side"], "skipped": DRAIN_INTENT["skipped"]})
    assert len(pods.writes) == 2


def test_a_chosen_pod_that_finished_or_was_replaced_counts_as_gone(pods, make):
    pods.add_pod(make.workload("gpu-01", gpus=4, name="job", phase="Failed"), uid="u-job")
    pods.add_pod(make.pod(node="gpu-01", name="side", namespace="ml", owner_kind="ReplicaSet", phase="Succeeded"),
                 uid="u-side")
    pods.terminate("u-going")
    intent = {**DRAIN_INTENT, "skipped": []}
    assert Evict().advance(Ctx(pods, intent=intent)) == Done("evicted 2 pods", {"evicted": ["ml/job", "ml/side"],
                                                                                 "skipped": []})
    assert pods.writes == []


def test_a_pod_removed_by_its_controller_just_before_its_eviction_does_not_stop_the_others(pods):
    pods.racing.add("u-job")
    Evict().advance(Ctx(pods, intent=DRAIN_INTENT))
    assert [w.target for w in pods.writes] == ["ml/job", "ml/side"]
    assert "u-side" not in pods.pods


def test_a_blocked_eviction_waits_naming_the_budgets_words_and_tells_the_thread_what_happens_at_the_deadline(pods):
    pods.blocked.add("u-job")
    pods.terminate("u-going")
    deadline = NOW + 10 * MINUTE
    for on_timeout, then in (("fail", "the run halts with the node cordoned, for a person to decide"),
                             ("skip", "the node is left out of the run and uncordoned"),
                             ("delete", "the blocked pods are deleted, bypassing the budget")):
        ctx = Ctx(pods, intent={**DRAIN_INTENT, "on_timeout": on_timeout}, deadline=deadline, timeout=10 * MINUTE)
        outcome = Evict().advance(ctx)
        budget = "Cannot evict pod as it would violate the pod's disruption budget."
        assert outcome == Waiting(
            f"eviction of ml/job is blocked by a PodDisruptionBudget: {budget}", retry_in=2.0,
            notice=StepNotice("pdb-blocked", f"gpu-01: eviction of ml/job is blocked by a PodDisruptionBudget: {budget}. "
                                         f"Retrying until 2025-06-07 12:10:00 UTC; then {then}. Scaling the workload "
                                         "up elsewhere frees the budget"))
    assert "u-job" in pods.pods and pods.did("delete") == []
    # The deadline in the display zone.
    berlin = Ctx(pods, intent=DRAIN_INTENT, deadline=deadline, timeout=10 * MINUTE, zone=ZoneInfo("Europe/Berlin"))
    notice = Evict().advance(berlin).notice  # type: ignore[union-attr]
    assert notice is not None and "Retrying until 2025-06-07 14:10:00 CEST" in notice.text, notice


def test_at_the_deadline_a_blocked_eviction_fails_leaves_the_node_out_or_deletes_as_the_step_says(pods):
    pods.blocked.add("u-job")
    pods.terminate("u-going")
    budget = "Cannot evict pod as it would violate the pod's disruption budget."
    summary = {"evicted": ["ml/job", "ml/side"], "skipped": DRAIN_INTENT["skipped"], "blocked": {"ml/job": budget}}

    def at_deadline(on_timeout: str) -> Ctx:
        return Ctx(pods, intent={**DRAIN_INTENT, "on_timeout": on_timeout}, now=NOW + 10 * MINUTE,
                   deadline=NOW + 10 * MINUTE, timeout=10 * MINUTE)

    assert Evict().advance(at_deadline("fail")) == Failed(
        f"gpu-01: eviction of ml/job is blocked by a PodDisruptionBudget: {budget}; gave up after 10m. Free the "
        "budget (scale the workload up elsewhere) or move the pod by hand, then start a new run", summary,
        code="eviction-blocked")
    assert Evict().advance(at_deadline("skip")) == LeftOut(
        f"gpu-01 is left out of this run: eviction of ml/job is blocked by a PodDisruptionBudget: {budget} still, "
        "after 10m. Its remaining pods keep running; it is uncordoned and the run goes on with the other nodes",
        summary)
    assert pods.did("delete") == []

    deleting = at_deadline("delete")
    assert Evict().advance(deleting) == Waiting(
        "eviction timed out; deleted ml/job despite the budget (on_timeout: delete)", retry_in=1.0, overdue_ok=True)
    assert [(w.verb, w.target, dict(w.args)) for w in pods.writes if w.verb == "delete"] == [
        ("delete", "ml/job", {"uid": "u-job", "dry_run": False, "grace_seconds": None})]
    assert deleting.records["delete/u-job"] == {
        "action": "pod.delete", "target": "ml/job",
        "detail": {"node": "gpu-01", "uid": "u-job",
                   "why": f"deleted despite its PodDisruptionBudget (on_timeout: delete) after: {budget}"}}


def test_a_deleted_pod_is_waited_for_two_minutes_past_the_deadline_then_the_step_fails(pods):
    pods.terminate("u-going")
    pods.terminate("u-side")
    deadline = NOW + 10 * MINUTE
    recorded = {"delete/u-job": {"action": "pod.delete"}}
    pods.slow.add("u-job")
    pods.delete_pod("ml", "job", uid="u-job", dry_run=False)  # deleted, still terminating
    pods.writes.clear()

    def at(when: dt.datetime) -> Ctx:
        return Ctx(pods, intent={**DRAIN_INTENT, "on_timeout": "delete"}, now=when, deadline=deadline,
                   timeout=10 * MINUTE, records=dict(recorded))

    just_before = deadline + dt.timedelta(seconds=119)
    assert Evict().advance(at(just_before)) == Waiting("waiting for ml/job to terminate", retry_in=1.0,
                                                       overdue_ok=True)
    assert Evict().advance(at(deadline + dt.timedelta(seconds=120))) == Failed(
        "ml/job did not terminate within 2 minutes of being deleted", code="pods-would-not-go")
    assert pods.writes == []  # terminating: never evicted or deleted again
    # Before the deadline a deleted pod is simply waited for.
    assert Evict().advance(at(NOW)) == Waiting("waiting for ml/job to terminate", retry_in=1.0)


def test_a_delete_on_record_that_never_reached_the_api_is_sent_and_only_once_it_landed_it_is_not(pods):
    pods.terminate("u-going")
    pods.terminate("u-side")
    pods.slow.add("u-job")
    ctx = Ctx(pods, intent={**DRAIN_INTENT, "on_timeout": "delete"}, records={"delete/u-job": {}},
              now=NOW + 10 * MINUTE, deadline=NOW + 10 * MINUTE, timeout=10 * MINUTE)

    Evict().advance(ctx)
    Evict().advance(ctx)

    assert pods.did() == [("delete", "ml/job")] and ctx.acts == 1
    assert "evict/u-job" not in ctx.records


def test_a_dry_run_evict_asks_the_api_with_dry_run_and_reports_what_a_budget_would_block(pods):
    pods.blocked.add("u-job")
    ctx = Ctx(pods, intent=DRAIN_INTENT, dry_run=True)

    outcome = Evict().advance(ctx)

    budget = "Cannot evict pod as it would violate the pod's disruption budget."
    assert outcome == Done("would evict 3 pods; 2 left alone (gpu-operator/ds and ml/done); a PodDisruptionBudget would block ml/job "
                           "right now", {"evicted": ["ml/job", "ml/side"], "skipped": DRAIN_INTENT["skipped"],
                                         "blocked": {"ml/job": budget}})
    assert [(w.target, w.args["dry_run"]) for w in pods.writes] == [("ml/job", True), ("ml/side", True)]
    assert set(pods.pods) >= {"u-job", "u-side"}
    pods.terminate("u-going")
    pods.blocked.clear()
    pods.terminate("u-job")
    pods.terminate("u-side")
    assert Evict().advance(Ctx(pods, intent=DRAIN_INTENT, dry_run=True)) == Done(
        "would evict 2 pods; 2 left alone (gpu-operator/ds and ml/done)", {"evicted": ["ml/job", "ml/side"],
                                                          "skipped": DRAIN_INTENT["skipped"]})


def test_an_intent_written_before_a_key_existed_reads_the_missing_list_as_empty(pods):
    pods.terminate("u-going")
    only_evict = {"scope": "all", "on_timeout": "fail", "evict": DRAIN_INTENT["evict"]}
    Evict().advance(Ctx(pods, intent=only_evict))
    assert Evict().advance(Ctx(pods, intent=only_evict)) == Done("evicted 2 pods", {"evicted": ["ml/job", "ml/side"],
                                                                                   "skipped": []})
    assert Evict().advance(Ctx(pods, intent={"terminating": []})) == Done("evicted 0 pods", {"evicted": [],
                                                                                             "skipped": []})


def test_a_chosen_pod_already_terminating_is_waited_for_while_the_next_is_evicted(pods, make):
    pods.add_pod(make.workload("gpu-01", gpus=4, name="job", labels={"app": "job"}, deleting=True), uid="u-job")
    Evict().advance(Ctx(pods, intent=DRAIN_INTENT))
    assert pods.did() == [("evict", "ml/side")]


def test_a_delete_on_record_is_sent_again_and_the_next_pod_is_still_evicted(pods):
    Evict().advance(Ctx(pods, intent=DRAIN_INTENT, records={"delete/u-job": {}}))
    assert pods.did() == [("delete", "ml/job"), ("evict", "ml/side")]


def test_at_the_deadline_only_the_pods_a_budget_still_blocks_are_deleted_whatever_their_order(pods):
    pods.blocked.add("u-side")
    pods.terminate("u-going")
    ctx = Ctx(pods, intent={**DRAIN_INTENT, "on_timeout": "delete"}, now=NOW + 10 * MINUTE,
              deadline=NOW + 10 * MINUTE, timeout=10 * MINUTE)
    Evict().advance(ctx)
    assert pods.did() == [("evict", "ml/job"), ("evict", "ml/side"), ("delete", "ml/side")]
    assert list(ctx.records) == ["evict/u-job", "evict/u-side", "delete/u-side"]
