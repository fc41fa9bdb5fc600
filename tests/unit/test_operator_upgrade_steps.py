"""The steps that leave a node's driver upgrade to the GPU Operator's own upgrade
controller (autoUpgrade on), one call at a time over the in-memory cluster.

operator-hold: on start it picks, of the nodes named, those without the skip label
(holding) or those a gpuops run holds (releasing); a skip label without gpuops's mark is a
person's and is named as left alone; a node that is gone is passed over. It then writes one
audit row naming every target, and labels each `nvidia.com/gpu-driver-upgrade.skip=true`
with the run's id as its mark (or takes both off), passing over a node that is gone or
already as wanted. A dry run asks the API with dry_run, records nothing and says "would".
A step without node names is refused. It takes two minutes unless told.

operator-upgrade: on start it notes the version, the operator's state on the node and the
node's newest driver pod. A node without an operator driver pod fails it; a dry run only
says it would follow the operator. Until the driver DaemonSet of the pod's namespace names
the version, the hold stays on. Then the hold (skip label and mark) comes off in one patch,
on record, and a node the run cordoned gets the operator's `node-initial-state.unschedulable`
note in the same patch. A person's skip label holds the step; a node without the operator's
state label is not followed; each state the operator goes through keeps the step waiting
and says what the operator does; upgrade-done with the new driver pod at the version and
Ready is done; upgrade-failed fails the step naming the driver pod's state. A node that
began upgrade-failed has its failed driver pod deleted once (by uid, a pod already gone or
replaced counting as deleted), then fails only if the new pod fails. It takes thirty
minutes unless told.

The context is tests/unit/test_step_outcomes.py's; the sentences are the ones
workflows.engine.messages writes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from tests.unit.fake_cluster import FakeCluster
from tests.unit.fleet_builder import DRIVER_VERSION, NOW, OPERATOR_NS
from tests.unit.test_step_outcomes import RUN, Ctx, assert_step_time
from workflows.engine.steps.contract import Done, Failed, StepParamsError, Waiting
from workflows.engine.steps.operator_upgrade import OperatorHold, OperatorUpgrade
from workflows.kube.errors import Conflict
from workflows.kube.labels import (
    ANNOTATION_UPGRADE_HELD_BY,
    ANNOTATION_UPGRADE_INITIAL_UNSCHEDULABLE,
    LABEL_UPGRADE_SKIP,
    LABEL_UPGRADE_STATE,
)
from workflows.kube.objects import DriverTemplate

OLD = DRIVER_VERSION  # what the node's driver pod runs when the step starts
WANTED = "590.44.01"
OLD_POD = f"{OPERATOR_NS}/nvidia-driver-old"
NEW_POD = f"{OPERATOR_NS}/nvidia-driver-new"
SKIP = "nvidia.com/gpu-driver-upgrade.skip=true"
LET_GO = (f"removed {SKIP} from gpu-01: the GPU Operator's upgrade controller may now upgrade it (gpuops gives "
          "the node back after its own checks)")


class OperatorCluster(FakeCluster):
    """The fake cluster with what these steps use beyond it: the driver DaemonSets of a
    namespace, and a label patch carrying annotations too (as the gateway's label_node)."""

    def __init__(self, snapshot: Any) -> None:
        super().__init__(snapshot)
        self.templates: list[DriverTemplate] = []

    def list_driver_templates(self, namespace: str) -> list[DriverTemplate]:
        return [t for t in self.templates if t.namespace == namespace]

    def label_node(self, name: str, *, labels: Any, dry_run: bool, resource_version: str | None = None,
                   annotations: Any = None) -> Any:
        return self._patch("label", name, labels=labels, annotations=annotations,
                           resource_version=resource_version, dry_run=dry_run)


@pytest.fixture
def gpu_cluster(make) -> OperatorCluster:
    """gpu-01 with its driver pod nvidia-driver-old (uid u-old) at OLD; the operator's
    driver DaemonSet already names WANTED."""
    cluster = OperatorCluster(make.snapshot)
    cluster.add_node(make.node("gpu-01"))
    add_driver(cluster, make, "old", version=OLD)
    cluster.templates.append(make.driver_template(version=WANTED))
    return cluster


def add_driver(cluster: OperatorCluster, make, which: str, *, version: str, **pod: Any) -> None:
    """The driver pod nvidia-driver-<which> (uid u-<which>); a new one is younger than the old."""
    created = NOW - dt.timedelta(hours=1 if which == "old" else 0)
    cluster.add_pod(make.driver_pod("gpu-01", version=version, name=f"nvidia-driver-{which}", created_at=created,
                                    **pod), uid=f"u-{which}")


def set_node(cluster: OperatorCluster, make, *, state: str | None = None, held_by: str | None = None,
             skip: bool = False, unschedulable: bool = False) -> None:
    labels = {LABEL_UPGRADE_STATE: state, LABEL_UPGRADE_SKIP: "true" if skip else None}
    annotations = {ANNOTATION_UPGRADE_HELD_BY: held_by} if held_by else None
    cluster.add_node(make.node("gpu-01", labels=labels, annotations=annotations, unschedulable=unschedulable))


def started(cluster: OperatorCluster, **ctx: Any) -> Ctx:
    """The context of an operator-upgrade step to WANTED, its intent written by prepare."""
    intent = OperatorUpgrade().prepare(Ctx(cluster, kind="operator-upgrade", params={"version": WANTED}))
    return Ctx(cluster, kind="operator-upgrade", params={"version": WANTED}, intent=intent, **ctx)


def upgrading(state: str, what: str) -> Waiting:
    return Waiting(f"the GPU Operator is upgrading this node: {state} ({what})", retry_in=5.0)


def written(cluster: OperatorCluster) -> list[tuple[str, str, dict[str, Any], dict[str, Any], Any]]:
    return [(w.verb, w.target, w.args["labels"], w.args["annotations"], w.args["dry_run"]) for w in cluster.writes]


# ------------------------------------------------------------------ operator-upgrade: start


def test_the_step_notes_the_version_the_operators_state_and_the_driver_pod_it_starts_from(gpu_cluster, make):
    set_node(gpu_cluster, make, state="upgrade-required")

    intent = OperatorUpgrade().prepare(Ctx(gpu_cluster, params={"version": WANTED}))

    assert intent == {"version": WANTED, "state_before": "upgrade-required",
                      "driver_pod": {"pod": OLD_POD, "uid": "u-old", "version": OLD, "ready": True}}
    assert gpu_cluster.writes == []


@pytest.mark.parametrize("params", [{}, {"version": ""}])
def test_an_operator_upgrade_without_a_version_is_refused(gpu_cluster, params):
    with pytest.raises(StepParamsError, match=r"^an operator-upgrade step needs the driver version in "
                                              r"params\.version$"):
        OperatorUpgrade().prepare(Ctx(gpu_cluster, params=params))


@pytest.mark.parametrize(("logic", "kind", "seconds"), [(OperatorUpgrade(), "operator-upgrade", 1800),
                                                        (OperatorHold(), "operator-hold", 120)])
def test_an_operator_upgrade_takes_thirty_minutes_and_a_hold_two_unless_told_and_never_no_time(
        gpu_cluster, logic, kind, seconds):
    assert_step_time(gpu_cluster, logic, kind, seconds)


# ------------------------------------------------------------------ operator-upgrade: letting go


def test_a_node_without_an_operator_driver_pod_fails_the_step(gpu_cluster):
    gpu_cluster.terminate("u-old")
    ctx = started(gpu_cluster)

    assert OperatorUpgrade().advance(ctx) == Failed(
        "gpu-01 runs no GPU Operator driver pod (a host driver, or the operator does not manage it): gpuops does "
        "not change host drivers", code="no-driver-pod")
    assert gpu_cluster.writes == []


def test_a_dry_run_says_it_would_follow_the_operator_and_touches_nothing(gpu_cluster, make):
    set_node(gpu_cluster, make, held_by="run-1", skip=True, unschedulable=True)
    ctx = started(gpu_cluster, dry_run=True)

    assert OperatorUpgrade().advance(ctx) == Done(f"would let the GPU Operator upgrade gpu-01 to {WANTED} and follow it")
    assert (gpu_cluster.writes, ctx.records, ctx.acts) == ([], {}, 0)


@pytest.mark.parametrize(("templates", "now"), [
    ([("gpu-operator", OLD)], f"owner ({OLD})"),
    ([], "no driver DaemonSet selects this node"),
    ([("other-ns", WANTED)], "no driver DaemonSet selects this node"),
], ids=["at-the-old-version", "none", "only-in-another-namespace"])
def test_the_hold_stays_until_the_driver_daemonset_of_the_pods_namespace_names_the_version(
        gpu_cluster, make, templates, now):
    set_node(gpu_cluster, make, held_by="run-1", skip=True, unschedulable=True)
    gpu_cluster.templates = [dataclasses.replace(make.driver_template(version=v), namespace=ns) for ns, v in templates]
    ctx = started(gpu_cluster)

    assert OperatorUpgrade().advance(ctx) == Waiting(
        f"waiting for the GPU Operator to put driver {WANTED} into the DaemonSet that runs this node's driver "
        f"(now: {now}) before restarting the pod", retry_in=2.0)
    assert (gpu_cluster.writes, ctx.records, ctx.acts) == ([], {}, 0)


def test_once_the_daemonset_names_the_version_the_hold_comes_off_with_the_unschedulable_note_in_one_patch(
        gpu_cluster, make):
    set_node(gpu_cluster, make, state="upgrade-required", held_by="run-1", skip=True, unschedulable=True)
    ctx = started(gpu_cluster)

    assert OperatorUpgrade().advance(ctx) == Waiting(LET_GO, retry_in=5.0)

    assert written(gpu_cluster) == [("label", "gpu-01", {LABEL_UPGRADE_SKIP: None},
                                     {ANNOTATION_UPGRADE_HELD_BY: None,
                                      ANNOTATION_UPGRADE_INITIAL_UNSCHEDULABLE: "true"}, False)]
    assert ctx.records == {"let-go": {"action": "driver-upgrade.let-go", "target": "node gpu-01",
                                      "detail": {"version": WANTED, "held_by": "run-1"}}}
    assert ctx.acts == 1
    node = gpu_cluster.node("gpu-01")
    assert LABEL_UPGRADE_SKIP not in node.labels and ANNOTATION_UPGRADE_HELD_BY not in node.annotations
    assert node.annotations[ANNOTATION_UPGRADE_INITIAL_UNSCHEDULABLE] == "true"
    # Looked at again: the hold is off, the operator's state is followed, nothing more is written.
    assert OperatorUpgrade().advance(ctx) == upgrading(
        "upgrade-required", "queued: it starts the node when it next looks (at least every 2 minutes)")
    assert len(gpu_cluster.writes) == 1


def test_a_node_not_cordoned_loses_only_the_hold(gpu_cluster, make):
    set_node(gpu_cluster, make, held_by="run-1", skip=True)
    ctx = started(gpu_cluster)

    assert OperatorUpgrade().advance(ctx) == Waiting(LET_GO, retry_in=5.0)

    assert written(gpu_cluster) == [("label", "gpu-01", {LABEL_UPGRADE_SKIP: None},
                                     {ANNOTATION_UPGRADE_HELD_BY: None}, False)]
    assert ANNOTATION_UPGRADE_INITIAL_UNSCHEDULABLE not in gpu_cluster.node("gpu-01").annotations


def test_a_skip_label_a_person_set_holds_the_step_and_is_left_alone(gpu_cluster, make):
    set_node(gpu_cluster, make, state="upgrade-required", skip=True, unschedulable=True)
    ctx = started(gpu_cluster)

    assert OperatorUpgrade().advance(ctx) == Waiting(
        f"someone labelled gpu-01 {SKIP}: the GPU Operator will not upgrade it while that stays; remove the label "
        "to let the run go on, or abort the run", retry_in=30.0)
    assert (gpu_cluster.writes, ctx.records, ctx.acts) == ([], {}, 0)


# ------------------------------------------------------------------ operator-upgrade: following the operator


def test_a_node_the_operators_upgrade_controller_does_not_follow_keeps_the_step_waiting(gpu_cluster):
    assert OperatorUpgrade().advance(started(gpu_cluster)) == Waiting(
        "gpu-01 has no nvidia.com/gpu-driver-upgrade-state label: the GPU Operator's upgrade controller is not "
        "following it (is autoUpgrade still on?)", retry_in=30.0)


@pytest.mark.parametrize(("state", "new_pod", "what"), [
    ("pod-restart-required", None, "restarting the driver pod"),
    ("validation-required", {"version": WANTED}, "waiting for the validator"),
    ("upgrade-done", None, "done, but the node's driver pod is not the new one yet"),
    ("upgrade-done", {"version": WANTED, "ready": False}, "done, but the node's driver pod is not the new one yet"),
    ("upgrade-done", {"version": "570.1.2"}, "done, but the node's driver pod is not the new one yet"),
    ("upgrade-done", "none", "done, but the node's driver pod is not the new one yet"),
], ids=["old-pod-still-there", "validating-a-ready-new-pod", "done-but-old-pod", "done-new-pod-not-ready",
        "done-new-pod-other-version", "done-no-driver-pod"])
def test_each_state_of_the_operators_upgrade_keeps_the_step_waiting_and_says_what_the_operator_does(
        gpu_cluster, make, state, new_pod, what):
    ctx = started(gpu_cluster)
    set_node(gpu_cluster, make, state=state, unschedulable=True)
    if new_pod is not None:
        gpu_cluster.terminate("u-old")
    if isinstance(new_pod, dict):
        add_driver(gpu_cluster, make, "new", **new_pod)

    assert OperatorUpgrade().advance(ctx) == upgrading(state, what)
    assert (gpu_cluster.writes, ctx.records) == ([], {})


def test_the_step_is_done_when_the_operator_says_upgrade_done_and_the_new_driver_pod_runs_the_version_ready(
        gpu_cluster, make):
    ctx = started(gpu_cluster)
    set_node(gpu_cluster, make, state="upgrade-done", unschedulable=True)
    gpu_cluster.terminate("u-old")
    add_driver(gpu_cluster, make, "new", version=WANTED)

    assert OperatorUpgrade().advance(ctx) == Done(
        f"the GPU Operator upgraded the node: driver pod {NEW_POD} runs {WANTED} and is Ready (upgrade-done)")
    assert (gpu_cluster.writes, ctx.records, ctx.acts) == ([], {}, 0)


@pytest.mark.parametrize(("crashing", "said"), [
    (True, " (driver pod: CrashLoopBackOff (6 restarts))"), (False, "")], ids=["with-its-pod", "without-a-pod"])
def test_upgrade_failed_fails_the_step_naming_the_driver_pods_state(gpu_cluster, make, crashing, said):
    ctx = started(gpu_cluster)
    set_node(gpu_cluster, make, state="upgrade-failed", unschedulable=True)
    gpu_cluster.terminate("u-old")
    if crashing:
        add_driver(gpu_cluster, make, "new", version=WANTED, ready=False, restarts=6,
                   waiting_reason="CrashLoopBackOff")

    assert OperatorUpgrade().advance(ctx) == Failed(
        f"the GPU Operator marked gpu-01 upgrade-failed{said}; the node stays cordoned, the nodes not yet upgraded "
        "stay held back", code="operator-upgrade-failed")
    assert gpu_cluster.writes == []


# ------------------------------------------------------------------ operator-upgrade: a node that began upgrade-failed


@pytest.fixture
def failed_before(gpu_cluster, make) -> Ctx:
    """gpu-01 began the step upgrade-failed (a rollback of the node its upgrade failed on),
    its driver pod nvidia-driver-old crash-looping at OLD."""
    set_node(gpu_cluster, make, state="upgrade-failed", unschedulable=True)
    gpu_cluster.pods.clear()
    add_driver(gpu_cluster, make, "old", version=OLD, ready=False, restarts=6, waiting_reason="CrashLoopBackOff")
    return started(gpu_cluster)


def test_a_node_that_began_upgrade_failed_has_its_failed_driver_pod_deleted_once_by_uid(
        gpu_cluster, make, failed_before):
    outcome = OperatorUpgrade().advance(failed_before)

    assert outcome == Waiting(f"deleted the failed driver pod {OLD_POD}: the operator does not replace a pod on an "
                              "upgrade-failed node itself", retry_in=2.0)
    (write,) = gpu_cluster.writes
    assert (write.verb, write.target, dict(write.args)) == (
        "delete", OLD_POD, {"uid": "u-old", "dry_run": False, "grace_seconds": None})
    assert "u-old" not in gpu_cluster.pods and failed_before.acts == 1
    # The operator's DaemonSet makes the new pod; the step follows it and deletes nothing more.
    add_driver(gpu_cluster, make, "new", version=WANTED, ready=False, phase="Pending", waiting_reason="ContainerCreating")
    assert OperatorUpgrade().advance(failed_before) == upgrading("upgrade-failed", "failed")
    assert len(gpu_cluster.writes) == 1


def test_a_failed_driver_pod_gone_before_its_delete_counts_as_deleted(gpu_cluster, failed_before):
    gpu_cluster.racing.add("u-old")  # the operator's controller removes it just before the delete

    assert OperatorUpgrade().advance(failed_before).reason.startswith(f"deleted the failed driver pod {OLD_POD}")
    assert gpu_cluster.did() == [("delete", OLD_POD)]


def test_a_failed_driver_pod_replaced_before_its_delete_counts_as_deleted(gpu_cluster, failed_before):
    def replaced(namespace: str, name: str, *, uid: str, dry_run: bool) -> None:
        raise Conflict(f"DELETE /api/v1/namespaces/{namespace}/pods/{name}: Precondition failed: UID in "
                       f"precondition: {uid}, UID in object meta: u-other", status=409)

    gpu_cluster.delete_pod = replaced

    assert OperatorUpgrade().advance(failed_before).reason.startswith(f"deleted the failed driver pod {OLD_POD}")


@pytest.mark.parametrize(("pod", "text"), [
    ({"restarts": 6, "waiting_reason": "CrashLoopBackOff"}, "CrashLoopBackOff (6 restarts)"),
    ({"phase": "Pending", "waiting_reason": "ImagePullBackOff"}, "ImagePullBackOff (0 restarts)"),
], ids=["crash-looping", "image-not-pulled"])
def test_on_a_node_that_began_upgrade_failed_a_failing_new_driver_pod_fails_the_step(
        gpu_cluster, make, failed_before, pod, text):
    gpu_cluster.terminate("u-old")
    add_driver(gpu_cluster, make, "new", version=WANTED, ready=False, **pod)

    assert OperatorUpgrade().advance(failed_before) == Failed(f"the new driver pod {NEW_POD} is failing: {text}",
                                                              code="new-driver-failing")
    assert gpu_cluster.writes == []


def test_on_a_node_that_began_upgrade_failed_a_healthy_new_driver_pod_is_followed_to_done(
        gpu_cluster, make, failed_before):
    gpu_cluster.terminate("u-old")
    add_driver(gpu_cluster, make, "new", version=WANTED)
    set_node(gpu_cluster, make, state="upgrade-done", unschedulable=True)

    assert OperatorUpgrade().advance(failed_before) == Done(
        f"the GPU Operator upgraded the node: driver pod {NEW_POD} runs {WANTED} and is Ready (upgrade-done)")
    assert gpu_cluster.writes == []


@pytest.mark.parametrize("new_pod", [None, {"version": "570.1.2"}], ids=["no-driver-pod", "new-pod-other-version"])
def test_on_a_node_that_began_upgrade_failed_the_operator_is_followed_while_no_new_pod_fails(
        gpu_cluster, make, failed_before, new_pod):
    gpu_cluster.terminate("u-old")
    if new_pod is not None:
        add_driver(gpu_cluster, make, "new", **new_pod)

    assert OperatorUpgrade().advance(failed_before) == upgrading("upgrade-failed", "failed")
    assert gpu_cluster.writes == []


# ------------------------------------------------------------------ operator-hold: start


@pytest.fixture
def nodes(gpu_cluster, make) -> OperatorCluster:
    """gpu-01 free; gpu-02 skipped by a person; gpu-03 held by run-1; gpu-05 free; no gpu-04."""
    gpu_cluster.add_node(make.node("gpu-02", labels={LABEL_UPGRADE_SKIP: "true"}))
    gpu_cluster.add_node(make.node("gpu-03", labels={LABEL_UPGRADE_SKIP: "true"},
                                   annotations={ANNOTATION_UPGRADE_HELD_BY: "run-1"}))
    gpu_cluster.add_node(make.node("gpu-05"))
    return gpu_cluster


ALL = ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05"]


def test_holding_picks_the_nodes_the_operator_would_take_and_names_a_persons_skip_label_as_left_alone(nodes):
    intent = OperatorHold().prepare(Ctx(nodes, kind="operator-hold", params={"nodes": ALL}))

    assert intent == {"release": False, "targets": ["gpu-01", "gpu-05"], "left_alone": ["gpu-02"]}
    assert nodes.writes == []


def test_releasing_picks_only_the_nodes_a_gpuops_run_holds(nodes):
    intent = OperatorHold().prepare(Ctx(nodes, kind="operator-hold", params={"nodes": ALL, "release": True}))

    assert intent == {"release": True, "targets": ["gpu-03"], "left_alone": ["gpu-02"]}


@pytest.mark.parametrize("params", [{}, {"nodes": ["gpu-01", ""]}], ids=["no-nodes", "an-empty-name"])
def test_an_operator_hold_without_node_names_is_refused(nodes, params):
    with pytest.raises(StepParamsError, match="^an operator-hold step needs params.nodes, a list of node names$"):
        OperatorHold().prepare(Ctx(nodes, kind="operator-hold", params=params))


# ------------------------------------------------------------------ operator-hold: holding and releasing


def test_holding_labels_each_target_with_the_runs_mark_on_one_audit_row_passing_over_gone_and_done_nodes(nodes):
    targets = ["gpu-01", "gpu-04", "gpu-02", "gpu-05"]  # gpu-04 is gone, gpu-02 got its label meanwhile
    ctx = Ctx(nodes, intent={"release": False, "targets": targets, "left_alone": ["gpu-02"]})

    assert OperatorHold().advance(ctx) == Done(
        f"held 4 node(s) back from the GPU Operator's own upgrade ({SKIP}) until their turn: "
        "gpu-01, gpu-04, gpu-02, gpu-05", {"left_alone": ["gpu-02"]})

    assert ctx.records == {"driver-upgrade.hold": {"action": "driver-upgrade.hold", "target": "4 node(s)",
                                                   "detail": {"nodes": targets}}}
    assert written(nodes) == [("label", name, {LABEL_UPGRADE_SKIP: "true"}, {ANNOTATION_UPGRADE_HELD_BY: RUN}, False)
                              for name in ("gpu-01", "gpu-05")]
    assert ctx.acts == 2
    assert nodes.node("gpu-05").annotations[ANNOTATION_UPGRADE_HELD_BY] == RUN
    assert ANNOTATION_UPGRADE_HELD_BY not in nodes.node("gpu-02").annotations


def test_releasing_takes_off_the_label_and_mark_on_one_audit_row_passing_over_gone_and_done_nodes(nodes, make):
    nodes.add_node(make.node("gpu-06", labels={LABEL_UPGRADE_SKIP: "true"},
                             annotations={ANNOTATION_UPGRADE_HELD_BY: RUN}))
    targets = ["gpu-04", "gpu-01", "gpu-03", "gpu-06"]  # gpu-04 is gone, gpu-01 was given back already
    ctx = Ctx(nodes, intent={"release": True, "targets": targets, "left_alone": []})

    assert OperatorHold().advance(ctx) == Done(
        "gave 4 node(s) held by gpuops back to the GPU Operator's upgrade controller: gpu-04, gpu-01, gpu-03, gpu-06",
        {"left_alone": []})

    assert ctx.records == {"driver-upgrade.release": {"action": "driver-upgrade.release", "target": "4 node(s)",
                                                      "detail": {"nodes": targets}}}
    assert written(nodes) == [("label", name, {LABEL_UPGRADE_SKIP: None}, {ANNOTATION_UPGRADE_HELD_BY: None}, False)
                              for name in ("gpu-03", "gpu-06")]
    assert LABEL_UPGRADE_SKIP not in nodes.node("gpu-06").labels


@pytest.mark.parametrize(("release", "note"), [
    (False, f"would hold 1 node(s) back from the GPU Operator's own upgrade ({SKIP}) until their turn: gpu-01"),
    (True, "would give 1 node(s) held by gpuops back to the GPU Operator's upgrade controller: gpu-03"),
])
def test_a_dry_run_asks_the_api_with_dry_run_records_nothing_and_says_what_it_would_do(nodes, release, note):
    target = "gpu-03" if release else "gpu-01"
    before = nodes.node(target)
    ctx = Ctx(nodes, dry_run=True, intent={"release": release, "targets": [target], "left_alone": []})

    assert OperatorHold().advance(ctx) == Done(note, {"left_alone": []})

    assert ctx.records == {}
    assert [(w.target, w.args["dry_run"]) for w in nodes.writes] == [(target, True)]
    assert nodes.node(target) == before


@pytest.mark.parametrize(("release", "note"), [(False, "no node to hold back from the GPU Operator's upgrade"),
                                               (True, "no node held by gpuops to give back")])
def test_a_hold_or_release_with_no_node_to_change_writes_no_audit_row(nodes, release, note):
    ctx = Ctx(nodes, intent={"release": release, "targets": []})  # an intent written before left_alone existed

    assert OperatorHold().advance(ctx) == Done(note, {"left_alone": []})
    assert (ctx.records, nodes.writes) == ({}, [])
