"""The driver step (kind `driver`), one call at a time over the in-memory cluster: it
restarts the node's GPU Operator driver pod and waits for the new one to be Ready.

On start it notes the node's newest live driver pod (only pods labelled
app.kubernetes.io/component=nvidia-driver count, terminating ones do not) and the version
asked for. Then:
- a node without an operator driver pod fails the step (`no-driver-pod`);
- a driver pod already at the version and Ready is left alone;
- with a version, the restart waits until every driver DaemonSet that selects the node
  (not one being deleted, not one for other nodes) names it; none selecting the node, or
  one without a driver image, counts as not there;
- GPU pods on the node hold the restart, unless `allow_gpu_pods: true`;
- the noted pod is deleted by namespace, name and uid, once, under the Lease; a pod that
  went or was replaced just before (NotFound, Conflict) counts as deleted;
- a dry run passes over both gates, asks the API with dry_run and says it would restart;
- after the delete (the old pod gone or terminating) the step waits for a fresh pod; the
  newest fresh pod that is not terminating decides: crash-looping or failing fails the
  step (`new-driver-failing`), not Ready keeps it waiting, another version than asked
  fails it (`driver-wrong-version`), Ready is done;
- it takes fifteen minutes unless `timeout_s` says otherwise.

The context is tests/unit/test_step_outcomes.py's; the cluster, with its driver
DaemonSets, is tests/unit/test_operator_upgrade_steps.py's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from tests.unit.fake_cluster import Write
from tests.unit.fleet_builder import NOW
from tests.unit.test_operator_upgrade_steps import (
    NEW_POD,
    OLD,
    OLD_POD,
    WANTED,
    OperatorCluster,
    add_driver,
    gpu_cluster,  # noqa: F401 (the fixture `cluster` builds on)
)
from tests.unit.test_step_outcomes import Ctx, assert_step_time
from workflows.engine.steps.contract import Done, Failed, Waiting
from workflows.engine.steps.driver import Driver

DELETED = Waiting(f"deleted driver pod {OLD_POD}; waiting for its DaemonSet to start a new one", retry_in=2.0)
NO_NEW_POD = Waiting("waiting for the DaemonSet to start a new driver pod", retry_in=5.0)
WOULD = Done(f"would delete driver pod {OLD_POD}; its DaemonSet would start a new one from the current template")


@pytest.fixture
def cluster(gpu_cluster: OperatorCluster) -> OperatorCluster:  # noqa: F811 (the imported fixture)
    """gpu-01 with its driver pod nvidia-driver-old (uid u-old) at OLD, Ready; the
    operator's driver DaemonSet (owner, selecting every node) already names WANTED."""
    return gpu_cluster


def started(cluster: OperatorCluster, params: dict[str, Any] | None = None, **ctx: Any) -> Ctx:
    """The context of a driver step (to WANTED unless `params` say otherwise), its intent
    written by prepare."""
    params = {"version": WANTED} if params is None else params
    intent = Driver().prepare(Ctx(cluster, kind="driver", params=params))
    return Ctx(cluster, kind="driver", params=params, intent=intent, **ctx)


def deleted(*, dry_run: bool = False, pod: str = OLD_POD, uid: str = "u-old") -> Write:
    return Write("delete", pod, {"uid": uid, "dry_run": dry_run, "grace_seconds": None})


def terminating(cluster: OperatorCluster, uid: str) -> None:
    """The pod `uid` is being deleted (it has a deletionTimestamp) but not gone yet."""
    found = cluster.pods[uid]
    cluster.pods[uid] = dataclasses.replace(found, pod=dataclasses.replace(found.pod, deleting=True))


def add_pod_at(cluster: OperatorCluster, make, which: str, *, created: dt.datetime, version: str = WANTED,
               **pod: Any) -> None:
    cluster.add_pod(make.driver_pod("gpu-01", version=version, name=f"nvidia-driver-{which}", created_at=created,
                                    **pod), uid=f"u-{which}")


def template(make, name: str, *, version: str | None, **fields: Any):
    """A driver DaemonSet of the operator's namespace; `version` None: no driver image."""
    found = make.driver_template(version=version or OLD)
    return dataclasses.replace(found, name=name, driver_image=found.driver_image if version else None, **fields)


# ------------------------------------------------------------------ start


def test_on_start_the_step_notes_the_newest_live_driver_pod_and_the_version(cluster, make):
    add_driver(cluster, make, "new", version=WANTED)  # younger than nvidia-driver-old, listed after it
    add_pod_at(cluster, make, "leaving", created=NOW + dt.timedelta(minutes=1), deleting=True)
    cluster.add_pod(make.device_plugin_pod("gpu-01", created_at=NOW + dt.timedelta(minutes=2)), uid="u-plugin")

    intent = Driver().prepare(Ctx(cluster, kind="driver", params={"version": WANTED}))

    assert intent == {"driver_pod": {"pod": NEW_POD, "uid": "u-new", "version": WANTED, "ready": True},
                      "version": WANTED}
    assert cluster.writes == []


def test_a_node_without_a_driver_pod_starts_with_none_noted_and_no_version_asked(cluster):
    cluster.terminate("u-old")

    assert Driver().prepare(Ctx(cluster, kind="driver")) == {"driver_pod": None, "version": None}


def test_a_driver_restart_takes_fifteen_minutes_unless_told_and_never_no_time(cluster):
    assert_step_time(cluster, Driver(), "driver", 900)


# ------------------------------------------------------------------ before the restart


def test_a_node_without_an_operator_driver_pod_fails_the_step(cluster):
    cluster.terminate("u-old")
    ctx = started(cluster)

    assert Driver().advance(ctx) == Failed(
        "gpu-01 runs no GPU Operator driver pod (a host driver, or the operator does not manage it): gpuops does "
        "not change host drivers", code="no-driver-pod")
    assert (cluster.writes, ctx.acts) == ([], 0)


def test_a_driver_pod_already_at_the_version_and_ready_is_left_alone(cluster, make):
    cluster.terminate("u-old")
    add_driver(cluster, make, "old", version=WANTED)
    ctx = started(cluster)

    assert Driver().advance(ctx) == Done(f"the driver pod already runs {WANTED} and is Ready: not restarted")
    assert (cluster.writes, ctx.acts) == ([], 0)


def test_a_driver_pod_at_the_version_but_not_ready_is_restarted(cluster, make):
    cluster.terminate("u-old")
    add_driver(cluster, make, "old", version=WANTED, ready=False)
    ctx = started(cluster)

    assert Driver().advance(ctx) == DELETED
    assert cluster.writes == [deleted()]


@pytest.mark.parametrize(("templates", "now"), [
    ([], "no driver DaemonSet selects this node"),
    ([("owner", WANTED, {"namespace": "other-ns"})], "no driver DaemonSet selects this node"),
    ([("owner", WANTED, {"node_selector": {"gpuops.io/pool": "infer-b"}})], "no driver DaemonSet selects this node"),
    ([("owner", None, {})], "owner (no driver image)"),
    ([("owner", OLD, {"node_selector": {"gpuops.io/pool": "train-a"}})], f"owner ({OLD})"),
    ([("owner", WANTED, {}), ("owner-b", OLD, {}), ("owner-c", None, {})],
     f"owner-b ({OLD}), owner-c (no driver image)"),
], ids=["none", "only-in-another-namespace", "only-for-other-nodes", "no-driver-image", "behind", "two-of-three"])
def test_the_restart_waits_until_the_driver_daemonsets_selecting_the_node_name_the_version(
        cluster, make, templates, now):
    cluster.templates = [template(make, name, version=version, **fields) for name, version, fields in templates]
    ctx = started(cluster)

    assert Driver().advance(ctx) == Waiting(
        f"waiting for the GPU Operator to put driver {WANTED} into the DaemonSet that runs this node's driver "
        f"(now: {now}) before restarting the pod", retry_in=2.0)
    assert (cluster.writes, ctx.acts) == ([], 0)


def test_driver_daemonsets_for_other_nodes_or_being_deleted_do_not_hold_the_restart(cluster, make):
    cluster.templates = [
        template(make, "owner", version=WANTED, node_selector={"gpuops.io/pool": "train-a"}),
        template(make, "owner-infer", version=OLD, node_selector={"gpuops.io/pool": "infer-b"}),
        template(make, "owner-old", version=OLD, deleting=True),
    ]
    ctx = started(cluster)

    assert Driver().advance(ctx) == DELETED
    assert cluster.writes == [deleted()]


def test_gpu_pods_on_the_node_hold_the_restart(cluster, make):
    cluster.add_pod(make.workload("gpu-01", gpus=1, name="trainer-1"), uid="u-t1")
    cluster.add_pod(make.workload("gpu-01", gpus=1, name="trainer-0"), uid="u-t0")
    ctx = started(cluster)

    assert Driver().advance(ctx) == Waiting(
        "not restarting the driver while GPU pods still run here: ml/trainer-0, ml/trainer-1 (they came back or "
        "were never evicted; evict them, or set allow_gpu_pods)", retry_in=5.0)
    assert (cluster.writes, ctx.acts) == ([], 0)


def test_allow_gpu_pods_lets_the_restart_go_ahead_with_gpu_pods_on_the_node(cluster, make):
    cluster.add_pod(make.workload("gpu-01", gpus=1, name="trainer-0"), uid="u-t0")
    ctx = started(cluster, {"version": WANTED, "allow_gpu_pods": True})

    assert Driver().advance(ctx) == DELETED
    assert cluster.writes == [deleted()]


# ------------------------------------------------------------------ the restart


def test_the_restart_deletes_the_noted_pod_by_uid_once_then_waits_for_a_ready_new_pod_at_the_version(
        cluster, make):
    ctx = started(cluster)

    assert Driver().advance(ctx) == DELETED
    assert (cluster.writes, ctx.acts) == ([deleted()], 1)
    assert "u-old" not in cluster.pods
    # Looked at again: the old pod is gone, the DaemonSet has not started the new one yet.
    assert Driver().advance(ctx) == NO_NEW_POD
    add_driver(cluster, make, "new", version=WANTED)
    assert Driver().advance(ctx) == Done(f"new driver pod {NEW_POD} is Ready ({WANTED})")
    assert (cluster.writes, ctx.acts) == ([deleted()], 1)


def test_without_a_version_the_restart_neither_waits_for_the_daemonset_nor_minds_the_new_pods_version(
        cluster, make):
    cluster.templates = [make.driver_template(version=WANTED)]
    ctx = started(cluster, {})

    assert Driver().advance(ctx) == DELETED
    add_driver(cluster, make, "new", version="570.1.2")
    assert Driver().advance(ctx) == Done(f"new driver pod {NEW_POD} is Ready (570.1.2)")


@pytest.mark.parametrize("answer", ["not-found", "conflict"])
def test_a_driver_pod_gone_or_replaced_just_before_the_delete_counts_as_deleted(cluster, make, answer):
    cluster.racing.add("u-old")  # its controller removes it just before our call
    if answer == "conflict":  # and a pod of the same name, older, took its place
        cluster.add_pod(make.driver_pod("gpu-01", name="nvidia-driver-old", created_at=NOW - dt.timedelta(hours=2)),
                            uid="u-other")
    ctx = started(cluster)

    assert Driver().advance(ctx) == DELETED
    assert (cluster.writes, ctx.acts) == ([deleted()], 1)


def test_a_dry_run_passes_over_both_gates_asks_the_api_with_dry_run_and_says_it_would_restart(cluster, make):
    cluster.templates = [make.driver_template(version=OLD)]
    cluster.add_pod(make.workload("gpu-01", gpus=1, name="trainer-0"), uid="u-t0")
    ctx = started(cluster, dry_run=True)

    assert Driver().advance(ctx) == WOULD
    assert (cluster.writes, ctx.acts) == ([deleted(dry_run=True)], 1)
    assert "u-old" in cluster.pods


@pytest.mark.parametrize("old_pod", ["gone", "terminating"])
def test_a_dry_run_after_the_old_pod_went_says_it_would_restart_and_touches_nothing(cluster, old_pod):
    ctx = started(cluster, dry_run=True)
    if old_pod == "gone":
        cluster.terminate("u-old")
    else:
        terminating(cluster, "u-old")

    assert Driver().advance(ctx) == WOULD
    assert (cluster.writes, ctx.acts) == ([], 0)


# ------------------------------------------------------------------ after the restart


def test_a_terminating_old_pod_and_a_terminating_new_one_keep_the_step_waiting_for_a_new_pod(cluster, make):
    ctx = started(cluster)
    terminating(cluster, "u-old")
    add_driver(cluster, make, "new", version=WANTED, deleting=True)

    assert Driver().advance(ctx) == NO_NEW_POD
    assert (cluster.writes, ctx.acts) == ([], 0)


@pytest.mark.parametrize(("new_pod", "outcome"), [
    ({"ready": False, "restarts": 6, "waiting_reason": "CrashLoopBackOff"},
     Failed(f"the new driver pod {NEW_POD} is failing: CrashLoopBackOff (6 restarts)", code="new-driver-failing")),
    ({"ready": False, "phase": "Failed"},
     Failed(f"the new driver pod {NEW_POD} is failing: Failed", code="new-driver-failing")),
    ({"ready": False},
     Waiting(f"waiting for the new driver pod {NEW_POD} to be Ready (now: Running, not Ready)", retry_in=5.0)),
    ({"version": "570.1.2"},
     Failed(f"the new driver pod {NEW_POD} runs 570.1.2, not {WANTED}: update the ClusterPolicy (or NVIDIADriver) "
            "driver version first", code="driver-wrong-version")),
    ({}, Done(f"new driver pod {NEW_POD} is Ready ({WANTED})")),
], ids=["crash-looping", "failed", "not-ready", "another-version", "ready-at-the-version"])
def test_the_new_driver_pod_decides_the_outcome(cluster, make, new_pod, outcome):
    ctx = started(cluster)
    cluster.terminate("u-old")
    add_driver(cluster, make, "new", **{"version": WANTED, **new_pod})

    assert Driver().advance(ctx) == outcome
    assert (cluster.writes, ctx.acts) == ([], 0)


def test_of_several_new_driver_pods_the_newest_not_terminating_decides(cluster, make):
    ctx = started(cluster)
    terminating(cluster, "u-old")
    add_pod_at(cluster, make, "first", created=NOW - dt.timedelta(minutes=30), ready=False, restarts=6,
               waiting_reason="CrashLoopBackOff")
    add_driver(cluster, make, "new", version=WANTED)
    add_pod_at(cluster, make, "leaving", created=NOW + dt.timedelta(minutes=1), deleting=True)

    assert Driver().advance(ctx) == Done(f"new driver pod {NEW_POD} is Ready ({WANTED})")
