"""The engine's steps as pure decisions: which pods a drain or a driver change evicts
and why, the cordon mark, waiting on the inventory, holding, and which nodes a stopped
run leaves cordoned."""

from __future__ import annotations

import dataclasses
import datetime as dt
import zoneinfo
from dataclasses import dataclass, field
from typing import Any

import pytest

from storage.ids import RequestId, RunId, StepId
from storage.runs import Run
from storage.steps import Step
from workflows.engine.runs import nodes_left_cordoned, step_intent, step_note, step_params
from workflows.engine.steps.contract import Done, StepParamsError, Waiting
from workflows.engine.steps.cordoning import CordonMark
from workflows.engine.steps.driver import git_owner
from workflows.engine.steps.eviction import decide
from workflows.engine.steps.waiting import Hold, WaitFor
from workflows.fleet.assessment import NodeInventory
from workflows.kube.labels import ANNOTATION_CORDONED_BY
from workflows.kube.objects import NodeObject, PodObject, PodOnNode

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)


def _pod(make, *, gpus: int = 0, owner: str | None = "ReplicaSet", env: str | None = None,
         labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         phase: str = "Running", deleting: bool = False) -> PodOnNode:
    pod: PodObject = make.pod(node="gpu-01", namespace="ml", owner_kind=owner, phase=phase, deleting=deleting,
                              labels=labels, gpu_requests={"nvidia.com/gpu": gpus} if gpus else None)
    if annotations:
        pod = PodObject(**{**{f: getattr(pod, f) for f in PodObject.__slots__}, "annotations": annotations})
    return PodOnNode(pod=pod, uid="uid-1", visible_devices=env)


@pytest.mark.parametrize("scope", ["gpu", "all"])
def test_gpu_pods_are_evicted_in_either_scope_and_say_what_they_use(make, scope):
    decision = decide(_pod(make, gpus=2), scope=scope)
    assert (decision.action, decision.why) == ("evict", "uses GPUs: nvidia.com/gpu=2")


def test_a_pod_that_sees_every_gpu_through_its_environment_is_evicted_although_it_requests_none(make):
    decision = decide(_pod(make, env="all"), scope="gpu")
    assert decision.action == "evict"
    assert "NVIDIA_VISIBLE_DEVICES=all" in decision.why and "driver could not unload" in decision.why
    assert decide(_pod(make, env="void"), scope="gpu").action == "skip"
    assert decide(_pod(make, labels={"gpuops.io/gpu-user": "true"}), scope="gpu").action == "evict"


def test_a_pod_without_gpus_keeps_running_for_driver_work_but_is_evicted_by_a_drain(make):
    assert decide(_pod(make), scope="gpu").why == "uses no GPU: left running (scope gpu)"
    assert decide(_pod(make), scope="all").action == "evict"


def test_daemonset_mirror_finished_and_terminating_pods_are_never_evicted_and_the_detail_says_why(make):
    daemon = decide(_pod(make, owner="DaemonSet", gpus=1), scope="all")
    assert daemon.action == "skip" and daemon.why.startswith("DaemonSet owner pod: not evicted, its controller "
                                                              "would put it straight back")
    assert "NB: it uses GPUs" in daemon.why
    mirror = decide(_pod(make, owner="Node", annotations={"kubernetes.io/config.mirror": "x"}), scope="all")
    assert mirror.action == "skip" and "static (mirror) pod" in mirror.why
    assert decide(_pod(make, gpus=1, phase="Succeeded"), scope="all").why == "finished (Succeeded): holds nothing, left alone"
    assert decide(_pod(make, gpus=1, phase="Failed"), scope="gpu").why == "finished (Failed): holds nothing, left alone"
    assert decide(_pod(make, gpus=1, deleting=True), scope="all").action == "wait"


def _node(make, annotation: str | None, *, unschedulable: bool = True) -> NodeObject:
    return make.node("gpu-01", annotations={ANNOTATION_CORDONED_BY: annotation} if annotation else None,
                     unschedulable=unschedulable)


def test_the_cordon_mark_reads_back_what_gpuops_wrote_and_ignores_anything_else(make):
    mark = CordonMark(run="run-1", by="gpuops for alice", prior_unschedulable=True, at="2025-06-07T12:00:00.000000Z")
    assert CordonMark.of(_node(make, mark.to_text())) == mark
    assert CordonMark.of(_node(make, "by hand")) is None
    assert CordonMark.of(_node(make, '{"by": "someone"}')) is None
    assert CordonMark.of(_node(make, None)) is None


@dataclass
class _Ctx:
    inventory: NodeInventory | None = None
    kind: str = "step"
    params: dict[str, Any] = field(default_factory=dict)
    intent: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    now: dt.datetime = NOW
    zone: dt.tzinfo = dt.timezone.utc
    node: str = "gpu-h100-01"
    window_end: dt.datetime | None = None
    request_id: str = "req-7f3a2c"

    def node_inventory(self) -> NodeInventory | None:
        return self.inventory


def test_waiting_for_a_healthy_node_is_done_at_once_and_names_the_conditions(make):
    step = WaitFor(("node-ready", "gpus-advertised", "device-plugin-ready", "validator-ready"))
    outcome = step.advance(_Ctx(inventory=make.assess(make.node())))  # type: ignore[arg-type]
    assert outcome == Done("holds: node-ready, gpus-advertised, device-plugin-ready, validator-ready")


def test_a_node_that_advertises_too_few_gpus_keeps_the_step_waiting_and_says_how_many(make):
    short = make.assess(make.node(capacity={"nvidia.com/gpu": "7"}, allocatable={"nvidia.com/gpu": "7"}))
    step = WaitFor(("gpus-advertised",))
    assert step.advance(_Ctx(inventory=short)) == Waiting("waiting: 7/8 GPUs advertised (7 allocatable)")  # type: ignore[arg-type]
    # A dry run looks once and reports what it would wait for.
    assert step.advance(_Ctx(inventory=short, dry_run=True)) == Done(  # type: ignore[arg-type]
        "would wait, now: 7/8 GPUs advertised (7 allocatable)")


def test_a_wait_for_an_unknown_condition_is_refused_with_the_known_ones(make):
    with pytest.raises(StepParamsError, match="unknown condition gpus-happy; use: device-plugin-ready"):
        WaitFor(("node-ready",)).prepare(_Ctx(params={"conditions": ["gpus-happy"]}))  # type: ignore[arg-type]


def test_a_hold_tells_the_runs_thread_its_end_in_the_display_zone_saying_which():
    hold = Hold()
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    intent = hold.prepare(_Ctx(params={"seconds": 90}))  # type: ignore[arg-type]
    assert hold.advance(_Ctx(intent=intent, zone=berlin)).reason == (  # type: ignore[arg-type, union-attr]
        "holding until 2025-06-07 14:01:30 CEST")
    assert hold.advance(_Ctx(intent=intent, zone=berlin, now=NOW + dt.timedelta(seconds=90))) == Done(  # type: ignore[arg-type]
        "held until 2025-06-07 14:01:30 CEST")


def test_a_hold_waits_until_its_time_and_is_done_from_then_on():
    hold = Hold()
    intent = hold.prepare(_Ctx(params={"seconds": 90}))  # type: ignore[arg-type]
    assert intent == {"until": "2025-06-07T12:01:30.000000Z", "open_ended": False, "warn_at": None}  # too short to warn
    waiting = hold.advance(_Ctx(intent=intent))  # type: ignore[arg-type]
    assert isinstance(waiting, Waiting) and waiting.retry_in == 90
    assert hold.advance(_Ctx(intent=intent, now=NOW + dt.timedelta(seconds=90))) == Done(  # type: ignore[arg-type]
        "held until 2025-06-07 12:01:30 UTC")
    # Without a time of its own, a hold lasts until the request's window ends.
    assert hold.prepare(_Ctx(window_end=NOW + dt.timedelta(hours=2))) == {  # type: ignore[arg-type]
        "until": "2025-06-07T14:00:00.000000Z", "open_ended": False, "warn_at": "2025-06-07T13:45:00.000000Z"}


def test_an_open_ended_drain_holds_until_drain_done_however_long_that_takes():
    hold = Hold()
    # What a drain plan writes on a `windows: always` pool without `for`: no end.
    params = {"until": None, "released_by": "drain done"}
    intent = hold.prepare(_Ctx(params=params))  # type: ignore[arg-type]
    assert intent == {"until": None, "open_ended": True, "warn_at": None}

    for later in (dt.timedelta(minutes=1), dt.timedelta(days=30)):
        held = hold.advance(_Ctx(params=params, intent=intent, now=NOW + later))  # type: ignore[arg-type]
        assert held == Waiting("holding until someone says `drain done`")

    released = {**params, "released_at": "2025-07-07T12:00:00.000000Z"}
    done = hold.advance(_Ctx(params=released, intent=intent, now=NOW + dt.timedelta(days=30)))  # type: ignore[arg-type]
    assert done == Done("held until 2025-07-07 12:00:00 UTC")


def test_an_open_ended_drain_on_a_pool_with_a_limit_ends_at_the_limit_and_warns_before():
    hold = Hold()
    params = {"until": None, "released_by": "drain done", "at_most_s": 86400}
    intent = hold.prepare(_Ctx(params=params))  # type: ignore[arg-type]
    assert intent == {"until": "2025-06-08T12:00:00.000000Z", "open_ended": True,
                      "warn_at": "2025-06-08T11:45:00.000000Z"}

    warned = hold.advance(_Ctx(params=params, intent=intent, now=NOW + dt.timedelta(hours=23, minutes=50)))  # type: ignore[arg-type]
    assert isinstance(warned, Waiting) and warned.notice is not None
    assert warned.notice.text == ("This drain has no end of its own and reaches the pool's limit for open-ended "
                                  "drains (open_drain_max) at 2025-06-08 12:00:00 UTC: the nodes are then "
                                  "validated and uncordoned.")
    assert hold.advance(_Ctx(params=params, intent=intent, now=NOW + dt.timedelta(days=1))) == Done(  # type: ignore[arg-type]
        "held until 2025-06-08 12:00:00 UTC")


def test_a_long_hold_tells_the_thread_a_quarter_of_an_hour_before_the_window_ends_once_for_the_run():
    hold = Hold()
    intent = hold.prepare(_Ctx(window_end=NOW + dt.timedelta(hours=2)))  # type: ignore[arg-type]

    early = hold.advance(_Ctx(intent=intent))  # type: ignore[arg-type]
    assert isinstance(early, Waiting) and early.notice is None
    assert early.retry_in == (dt.timedelta(hours=1, minutes=45)).total_seconds()  # wakes up to warn

    late = hold.advance(_Ctx(intent=intent, now=NOW + dt.timedelta(hours=1, minutes=46)))  # type: ignore[arg-type]
    assert isinstance(late, Waiting) and late.notice is not None and late.notice.per_run
    assert late.notice.text == ("The drain window ends at 2025-06-07 14:00:00 UTC: the nodes are then validated "
                                "and uncordoned. Need longer? `/gpu drain extend req-7f3a2c <duration>`")
    assert late.retry_in == dt.timedelta(minutes=14).total_seconds()

    # After `drain done` there is nothing to warn about.
    released = hold.advance(_Ctx(intent=intent, now=NOW + dt.timedelta(hours=1, minutes=46),  # type: ignore[arg-type]
                                 params={"released_at": "2025-06-07T13:50:00.000000Z"}))
    assert isinstance(released, Waiting) and released.notice is None


def _run(dry_run: bool = False) -> Run:
    return Run(id=RunId("run-1"), request_id=RequestId("req-1"), state="failed", dry_run=dry_run, current_wave=0,
               created_at=NOW, started_at=NOW, ended_at=NOW, halted_reason=None)


def _step(node: str, kind: str, state: str, seq: int, detail: dict[str, Any] | None = None) -> Step:
    return Step(id=StepId(seq), run_id=RunId("run-1"), wave=0, node=node, seq=seq, kind=kind,  # type: ignore[arg-type]
                state=state, attempt=1, started_at=NOW, ended_at=None, detail=detail or {}, error=None)  # type: ignore[arg-type]


def test_a_stopped_run_reports_the_nodes_it_cordoned_and_not_those_cordoned_before_it():
    steps = [
        _step("a", "cordon", "done", 0, {"intent": {"prior_unschedulable": False}}),
        _step("a", "uncordon", "skipped", 1),
        _step("b", "cordon", "done", 0, {"intent": {"prior_unschedulable": True}}),
        _step("c", "cordon", "running", 0, {"intent": {"prior_unschedulable": False}}),
        _step("d", "cordon", "done", 0, {"intent": {"prior_unschedulable": False}}),
        _step("d", "uncordon", "done", 1),
        _step("e", "cordon", "done", 0, {"intent": {"prior_unschedulable": False},
                                         "result": {"prior_unschedulable": True, "held_by_run": "run-0"}}),
        _step("f", "cordon", "pending", 0),
    ]
    assert nodes_left_cordoned(_run(), steps) == ("a", "c")
    assert nodes_left_cordoned(_run(dry_run=True), steps) == ()


def test_a_cordon_that_failed_after_it_started_counts_as_left_cordoned_and_one_never_started_does_not():
    """Fail closed: an abort fails the cordon in flight, and a cordon call that timed out
    may have landed; the run's view must name the node as its halt reason does."""
    started = _step("a", "cordon", "failed", 0, {"intent": {"prior_unschedulable": False}})
    never = dataclasses.replace(_step("b", "cordon", "failed", 0), started_at=None)
    before = _step("c", "cordon", "failed", 0, {"intent": {"prior_unschedulable": True}})
    assert nodes_left_cordoned(_run(), [started, never, before]) == ("a",)


def test_what_the_cordon_found_when_it_acted_decides_over_what_it_found_when_it_started():
    steps = [
        # A person cordoned it between the start and the cordon: marked, not ours to report.
        _step("a", "cordon", "done", 0, {"intent": {"prior_unschedulable": False},
                                         "result": {"prior_unschedulable": True}}),
        # Another run's stale mark on a schedulable node: this run cordoned it after all.
        _step("b", "cordon", "done", 0, {"intent": {"prior_unschedulable": False, "other_mark": {"run": "run-0"}},
                                         "result": {"prior_unschedulable": False}}),
        # In flight on a node another run holds cordoned: not ours (yet).
        _step("c", "cordon", "running", 0, {"intent": {"prior_unschedulable": True, "other_mark": {"run": "run-0"}}}),
        # A result that says nothing about it: the intent decides.
        _step("d", "cordon", "done", 0, {"intent": {"prior_unschedulable": True}, "result": {}}),
        _step("e", "cordon", "done", 0, {"intent": {"prior_unschedulable": False}, "result": {}}),
        # Detail that is not an object (storage holds any JSON): read as empty, never a crash.
        _step("f", "cordon", "done", 0, "cordoned"),  # type: ignore[arg-type]
    ]
    assert nodes_left_cordoned(_run(), steps) == ("b", "e", "f")


def test_a_step_reads_as_its_outcome_once_ended_and_as_what_it_waits_for_while_it_runs():
    assert step_note(_step("a", "evict", "done", 1, {"note": "evicted 2 pods", "waiting": "old"})) == "evicted 2 pods"
    assert step_note(_step("a", "evict", "running", 1, {"waiting": "waiting for ml/job to terminate"})) == (
        "waiting for ml/job to terminate")
    assert step_note(_step("a", "evict", "done", 1, {"waiting": "stale"})) is None  # ended: what it waited for is over
    assert step_note(_step("a", "evict", "pending", 1)) is None
    assert step_note(_step("a", "hold", "running", 1, {"note": 7})) == "7"
    assert step_note(_step("a", "evict", "running", 1, "not an object")) is None  # type: ignore[arg-type]


def test_params_and_intent_that_are_not_objects_read_as_empty():
    assert step_params(_step("a", "evict", "done", 1, {"params": ["x"], "intent": "y"})) == {}
    assert step_intent(_step("a", "evict", "done", 1, {"params": ["x"], "intent": "y"})) == {}
    assert step_params(_step("a", "evict", "done", 1, {"params": {"scope": "gpu"}})) == {"scope": "gpu"}


class _OneNode:
    """The two gateway calls the cordon step makes, on one node value."""

    def __init__(self, node: NodeObject) -> None:
        self.node = node
        self.patches: list[str] = []

    def get_node(self, name: str) -> NodeObject:
        return self.node

    def cordon_node(self, name: str, **kwargs: Any) -> NodeObject:
        self.patches.append("cordon")
        return self.node

    def annotate_node(self, name: str, **kwargs: Any) -> NodeObject:
        self.patches.append("annotate")
        return self.node


@dataclass
class _CordonCtx(_Ctx):
    gateway: Any = None
    run_id: str = "run-2"
    cordoned_by: str = "gpuops for alice"
    unfinished: tuple[str, ...] = ()

    def run_unfinished(self, run_id: str) -> bool:
        return run_id in self.unfinished

    def act(self) -> None:
        return None


def test_a_node_another_unfinished_run_holds_fails_the_cordon_and_is_left_untouched(make):
    from workflows.engine.steps.contract import Failed
    from workflows.engine.steps.cordoning import Cordon

    mark = CordonMark(run="run-1", by="gpuops for bob", prior_unschedulable=False, at="x").to_text()
    gateway = _OneNode(_node(make, mark))
    outcome = Cordon().advance(_CordonCtx(gateway=gateway, unfinished=("run-1",)))  # type: ignore[arg-type]
    assert isinstance(outcome, Failed) and "cordoned by gpuops run run-1 (gpuops for bob), which has not finished" in outcome.reason
    # Left behind by a run that is over, the node is not this run's to uncordon either.
    outcome = Cordon().advance(_CordonCtx(gateway=gateway))  # type: ignore[arg-type]
    assert isinstance(outcome, Done) and outcome.detail == {"prior_unschedulable": True, "held_by_run": "run-1"}
    assert gateway.patches == []


def test_cordoning_a_node_a_human_cordoned_only_marks_it_and_remembers_it_was_cordoned(make):
    from workflows.engine.steps.cordoning import Cordon

    gateway = _OneNode(_node(make, None, unschedulable=True))
    outcome = Cordon().advance(_CordonCtx(gateway=gateway))  # type: ignore[arg-type]
    assert gateway.patches == ["annotate"]
    assert outcome == Done("already cordoned by someone else: marked it, and it will stay cordoned at the end",
                           {"prior_unschedulable": True})


def test_an_evict_step_from_a_drain_plan_reads_its_scope_and_the_pools_drain_timeout():
    from workflows.engine.steps.eviction import Evict

    # What workflows.drain writes for each node (the pool's drain_timeout and pdb_timeout_action).
    params = {"scope": "all-non-daemonset", "pdb_timeout_s": 45, "pdb_timeout_action": "wait"}
    assert Evict().scope(_Ctx(params=params)) == "all"  # type: ignore[arg-type]
    assert Evict().timeout(_Ctx(params=params)) == dt.timedelta(seconds=45)  # type: ignore[arg-type]
    with pytest.raises(StepParamsError, match="evict scope must be 'gpu' or 'all', not 'some'"):
        Evict().scope(_Ctx(params={"scope": "some"}))  # type: ignore[arg-type]


class _OnePolicy:
    """The two gateway calls the driver-version step makes, on one ClusterPolicy."""

    def __init__(self, make, version: str | None, *, conflict: bool = False) -> None:
        self.make, self.version, self.conflict = make, version, conflict
        self.patches: list[dict[str, Any]] = []

    def get_custom_object(self, path: str, name: str):
        assert path.endswith("/clusterpolicies") and name == "cluster-policy"
        return self.make.cluster_policy(driver={"version": self.version} if self.version else {})

    def patch_custom_object(self, path: str, name: str, *, spec, resource_version, dry_run):
        from workflows.kube.errors import Conflict

        if self.conflict:
            raise Conflict("the object has been modified", status=409, reason="Conflict")
        self.patches.append(spec)
        self.version = spec["driver"]["version"]


@dataclass
class _VersionCtx(_CordonCtx):
    recorded_rows: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def record(self, *, key: str, action: str, target: str, detail: Any) -> None:
        self.recorded_rows.append((key, dict(detail)))


POLICY_TO_NEW = {"object": "ClusterPolicy", "name": "cluster-policy", "version": "580.105.08"}


def test_the_driver_version_step_patches_the_policy_once_and_audits_the_version_it_replaced(make):
    from workflows.engine.steps.driver import SetDriverVersion

    gateway = _OnePolicy(make, "580.95.05")
    step = SetDriverVersion()
    intent = step.prepare(_VersionCtx(gateway=gateway, params=POLICY_TO_NEW))  # type: ignore[arg-type]
    assert intent == {"object": "ClusterPolicy cluster-policy", "version": "580.105.08", "prior_version": "580.95.05"}
    ctx = _VersionCtx(gateway=gateway, params=POLICY_TO_NEW, intent=intent)

    assert step.advance(ctx) == Done("ClusterPolicy cluster-policy: driver version 580.95.05 -> 580.105.08")  # type: ignore[arg-type]
    # Once landed (say the process restarted), it is not sent again.
    assert step.advance(ctx) == Done("ClusterPolicy cluster-policy: driver version 580.95.05 -> 580.105.08")  # type: ignore[arg-type]
    assert gateway.patches == [{"driver": {"version": "580.105.08"}}]
    assert ctx.recorded_rows == [("patch/ClusterPolicy cluster-policy",
                                  {"from": "580.95.05", "to": "580.105.08", "node": "gpu-h100-01"})]


def test_the_driver_version_step_does_not_overwrite_someone_elses_change_and_rereads_after_a_conflict(make):
    from workflows.engine.steps.contract import Failed
    from workflows.engine.steps.driver import SetDriverVersion

    intent = {"object": "ClusterPolicy cluster-policy", "version": "580.105.08", "prior_version": "580.95.05"}
    changed = _OnePolicy(make, "575.51.03")
    outcome = SetDriverVersion().advance(_VersionCtx(gateway=changed, params=POLICY_TO_NEW, intent=intent))  # type: ignore[arg-type]
    assert isinstance(outcome, Failed) and "changed since the step began (580.95.05 -> 575.51.03" in outcome.reason
    assert changed.patches == []
    racing = _OnePolicy(make, "580.95.05", conflict=True)
    outcome = SetDriverVersion().advance(_VersionCtx(gateway=racing, params=POLICY_TO_NEW, intent=intent))  # type: ignore[arg-type]
    assert isinstance(outcome, Waiting) and outcome.reason.endswith("(changed meanwhile; reading again)")
    with pytest.raises(StepParamsError, match="params.object"):
        SetDriverVersion().prepare(_VersionCtx(gateway=racing, params={"object": "Deployment", "name": "x",  # type: ignore[arg-type]
                                                                    "version": "1"}))


class _SomeNodes:
    """The node reads and label patches the operator-hold step makes, on a few nodes."""

    def __init__(self, nodes: dict[str, NodeObject]) -> None:
        self.nodes = nodes
        self.patches: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    def get_node(self, name: str) -> NodeObject:
        from workflows.kube.errors import NotFound

        if name not in self.nodes:
            raise NotFound(f"nodes {name} not found", status=404, reason="NotFound")
        return self.nodes[name]

    def label_node(self, name: str, *, labels, annotations, dry_run: bool) -> NodeObject:
        self.patches.append((name, dict(labels), dict(annotations)))
        node = self.nodes[name]
        merged_labels = {k: v for k, v in {**node.labels, **labels}.items() if v is not None}
        merged_notes = {k: v for k, v in {**node.annotations, **annotations}.items() if v is not None}
        self.nodes[name] = NodeObject(**{**{f: getattr(node, f) for f in NodeObject.__slots__},
                                         "labels": merged_labels, "annotations": merged_notes})
        return self.nodes[name]


SKIP, HELD_BY = "nvidia.com/gpu-driver-upgrade.skip", "gpuops.io/driver-upgrade-held-by"


def test_holding_nodes_back_from_the_operator_leaves_a_persons_skip_label_and_releasing_takes_off_only_gpuops_own(make):
    from workflows.engine.steps.operator_upgrade import OperatorHold

    gateway = _SomeNodes({
        "free": make.node("free"),
        "persons": make.node("persons", labels={SKIP: "true"}),
        "earlier": make.node("earlier", labels={SKIP: "true"}, annotations={HELD_BY: "run-1"}),
    })
    params = {"nodes": ["free", "persons", "earlier", "gone"]}
    step = OperatorHold()
    intent = step.prepare(_VersionCtx(gateway=gateway, params=params))  # type: ignore[arg-type]
    assert intent == {"release": False, "targets": ["free"], "left_alone": ["persons"]}
    ctx = _VersionCtx(gateway=gateway, params=params, intent=intent)
    assert step.advance(ctx).note.startswith("held 1 node(s) back")  # type: ignore[arg-type, union-attr]
    assert step.advance(ctx).note.startswith("held 1 node(s) back")  # type: ignore[arg-type, union-attr]
    assert gateway.patches == [("free", {SKIP: "true"}, {HELD_BY: "run-2"})]  # once, after a repeat too
    # One intent key (the engine commits a key's audit row once).
    assert set(map(str, ctx.recorded_rows)) == {str(("driver-upgrade.hold", {"nodes": ["free"]}))}

    release = {**params, "release": True}
    intent = step.prepare(_VersionCtx(gateway=gateway, params=release))  # type: ignore[arg-type]
    assert intent == {"release": True, "targets": ["free", "earlier"], "left_alone": ["persons"]}
    step.advance(_VersionCtx(gateway=gateway, params=release, intent=intent))  # type: ignore[arg-type]
    assert gateway.nodes["persons"].labels.get(SKIP) == "true"
    assert all(SKIP not in gateway.nodes[n].labels and HELD_BY not in gateway.nodes[n].annotations
               for n in ("free", "earlier"))
    with pytest.raises(StepParamsError, match="params.nodes"):
        step.prepare(_VersionCtx(gateway=gateway, params={"nodes": "free"}))  # type: ignore[arg-type]


def test_a_wave_start_says_which_wave_of_how_many_the_nodes_done_and_the_time_left_at_the_pace_so_far():
    from dataclasses import replace

    from workflows.engine import run_messages as say
    from workflows.engine.waves import wave_progress

    steps = [replace(_step(node, "cordon", "pending", seq), wave=wave)
             for seq, (wave, node) in enumerate([(0, "a"), (1, "b"), (1, "c"), (2, "d"), (3, "e")])]
    first = wave_progress(steps, 0, started=NOW, now=NOW)
    assert say.wave_started(0, ["a"], **first) == "wave 1 of 4 started: a (0/5 nodes done)"
    # Two waves took 40 minutes: the two left take about as long.
    third = wave_progress(steps, 2, started=NOW, now=NOW + dt.timedelta(minutes=40))
    assert say.wave_started(2, ["d"], **third) == (
        "wave 3 of 4 started: d (3/5 nodes done; about 40m left at the pace of the waves so far)")


@pytest.mark.parametrize(("labels", "annotations", "owner"), [
    ({}, {"argocd.argoproj.io/tracking-id": "gpu:nvidia.com/ClusterPolicy:/cluster-policy"}, "Argo CD (gpu:nvidia.com/ClusterPolicy:/cluster-policy)"),
    ({"app.kubernetes.io/instance": "gpu-platform"}, {}, "Argo CD (gpu-platform)"),
    ({"kustomize.toolkit.fluxcd.io/name": "gpu", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"}, {},
     "Flux (kustomize flux-system/gpu)"),
    ({"helm.toolkit.fluxcd.io/name": "gpu-operator"}, {}, "Flux (helm gpu-operator)"),
    # Helm's own releases carry app.kubernetes.io/instance too: not Git's.
    ({"app.kubernetes.io/instance": "gpu-operator"}, {"meta.helm.sh/release-name": "gpu-operator"}, None),
    ({"app": "gpu-operator"}, {}, None),
])
def test_a_driver_object_a_gitops_tool_keeps_is_told_from_its_obvious_marks(labels, annotations, owner):
    assert git_owner(labels, annotations) == owner
