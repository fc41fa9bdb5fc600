"""The steps that move a node between a host-installed driver and the operator's, one call
at a time over the in-memory cluster (workflows/engine/steps/host_driver.py):

- `snapshot` records the node's labels, annotations, taints and schedulability before the
  run changes anything, writes nothing, and says how many labels and taints it kept.
- `node-labels` sets its labels (None removes one) in one patch, keeping in its intent
  the values it found; a node already so is not written; a dry run asks the API with
  dry_run and changes nothing; a step without labels is refused.
- `restore` puts back every label among `keys` as the snapshot had it (removed where it
  had none) and the taints exactly, in one patch naming the resourceVersion it read,
  audited with what it found; a node already as the snapshot had it is not written; a
  dry run neither audits nor changes; a node changed under it is read again soon; a
  step missing labels, keys or taints is refused.
- `host-driver-removed` / `host-driver-installed` wait for a person, retrying every 5
  seconds and telling the thread once what to do; a confirmation completes it, naming
  the person; the node's evidence (a driver that stopped, or started, since the step
  began) completes it, audited, only where the pool trusts evidence, and is otherwise
  shown in the waiting text; a node whose driver already was as wanted when the step
  began says its evidence cannot tell; a dry run reports what it would wait for.
- Each step's time: one minute for a snapshot, two for labels and restore, eight hours
  (or less, the window's end) for a person at the host driver; no time at all is refused
  naming the step.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tests.unit.fake_cluster import FakeCluster
from tests.unit.test_gpu_check_step import CheckCtx
from tests.unit.test_step_outcomes import NOW, RUN, Ctx, assert_step_time
from workflows.engine import messages as say
from workflows.engine.steps.contract import Done, StepNotice, StepParamsError, Waiting
from workflows.engine.steps.host_driver import HostDriverByHand, Restore, SetNodeLabels, Snapshot
from workflows.kube.objects import NodeObject, Taint

NODE = "gpu-01"
HOST = {"nvidia.com/gpu.deploy.driver": "pre-installed"}
NO_SCHEDULE = Taint(key="gpuops.io/maintenance", value="driver", effect="NoSchedule")
NO_VALUE = Taint(key="nvidia.com/gpu", value="", effect="NoExecute")


class RestoringCluster(FakeCluster):
    """The fake cluster with the one patch `restore` makes: labels and taints together,
    refused (409) when the node's resourceVersion moved on."""

    def restore_node(self, name: str, *, labels: Mapping[str, str | None], taints: Sequence[Taint],
                     resource_version: str | None, dry_run: bool) -> NodeObject:
        try:
            node = self._patch("restore", name, labels=labels, resource_version=resource_version, dry_run=dry_run)
        finally:
            last = self.writes[-1]
            self.writes[-1] = dataclasses.replace(last, args={**last.args, "taints": tuple(taints)})
        if not dry_run:
            node = self.nodes[name] = dataclasses.replace(node, taints=tuple(taints))
        return node


@pytest.fixture
def cluster(make) -> RestoringCluster:
    return RestoringCluster(make.snapshot)


def put_node(cluster: RestoringCluster, make, *, labels: Mapping[str, str | None] | None = None,
             taints: tuple[Taint, ...] = (), **kwargs: Any) -> NodeObject:
    cluster.add_node(dataclasses.replace(make.node(NODE, labels=labels, **kwargs), taints=taints))
    return cluster.node(NODE)


# ------------------------------------------------------------------ snapshot


def test_a_snapshot_records_labels_annotations_taints_and_schedulability_and_writes_nothing(cluster, make):
    node = put_node(cluster, make, labels=HOST, annotations={"team": "ml"}, taints=(NO_SCHEDULE, NO_VALUE),
                    unschedulable=True)
    ctx = Ctx(cluster, kind="snapshot")

    ctx.intent = Snapshot().prepare(ctx)

    assert ctx.intent == {"labels": dict(node.labels), "annotations": {"team": "ml"},
                          "taints": [{"key": "gpuops.io/maintenance", "value": "driver", "effect": "NoSchedule"},
                                     {"key": "nvidia.com/gpu", "value": "", "effect": "NoExecute"}],
                          "unschedulable": True}
    assert ctx.intent["labels"]["nvidia.com/gpu.deploy.driver"] == "pre-installed"
    assert Snapshot().advance(ctx) == Done(
        f"recorded gpu-01's {len(node.labels)} labels, its annotations and 2 taints: what a rollback puts back")
    assert cluster.writes == [] and ctx.records == {} and ctx.acts == 0


def test_a_snapshot_of_a_schedulable_node_without_taints_says_it_kept_none(cluster, make):
    put_node(cluster, make)
    ctx = Ctx(cluster, kind="snapshot")

    ctx.intent = Snapshot().prepare(ctx)

    assert (ctx.intent["taints"], ctx.intent["unschedulable"], ctx.intent["annotations"]) == ([], False, {})
    assert Snapshot().advance(ctx).note.endswith("labels, its annotations and 0 taints: what a rollback puts back")


# ------------------------------------------------------------------ node-labels


def test_setting_labels_keeps_what_it_found_and_sets_and_removes_them_in_one_patch(cluster, make):
    version = put_node(cluster, make, labels={**HOST, "gpuops.io/host-driver": "550"}).resource_version
    ctx = Ctx(cluster, kind="node-labels",
              params={"labels": {"nvidia.com/gpu.deploy.driver": "true", "gpuops.io/host-driver": None}})

    ctx.intent = SetNodeLabels().prepare(ctx)

    assert ctx.intent == {"labels": {"nvidia.com/gpu.deploy.driver": "true", "gpuops.io/host-driver": None},
                          "prior": {"nvidia.com/gpu.deploy.driver": "pre-installed", "gpuops.io/host-driver": "550"}}
    assert SetNodeLabels().advance(ctx) == Done(
        "set on gpu-01: gpuops.io/host-driver removed, nvidia.com/gpu.deploy.driver=true")
    (write,) = cluster.writes
    assert (write.verb, write.target, write.args["labels"], write.args["resource_version"], write.args["dry_run"]) == (
        "label", NODE, {"nvidia.com/gpu.deploy.driver": "true", "gpuops.io/host-driver": None}, None, False)
    labels = cluster.node(NODE).labels
    assert labels["nvidia.com/gpu.deploy.driver"] == "true" and "gpuops.io/host-driver" not in labels
    assert cluster.node(NODE).resource_version != version and ctx.acts == 1
    # Looked at again (after a restart): the labels are in place, nothing more is written.
    assert SetNodeLabels().advance(ctx) == Done(
        "set on gpu-01: gpuops.io/host-driver removed, nvidia.com/gpu.deploy.driver=true")
    assert len(cluster.writes) == 1 and ctx.acts == 1


def test_labels_a_node_already_carries_are_not_written_again(cluster, make):
    put_node(cluster, make, labels={"nvidia.com/gpu.deploy.driver": "true"})
    ctx = Ctx(cluster, kind="node-labels", intent={"labels": {"nvidia.com/gpu.deploy.driver": "true",
                                                             "gpuops.io/host-driver": None}})

    assert SetNodeLabels().advance(ctx) == Done(
        "set on gpu-01: gpuops.io/host-driver removed, nvidia.com/gpu.deploy.driver=true")
    assert cluster.writes == [] and ctx.acts == 0


def test_label_values_from_a_stored_intent_are_written_as_text(cluster, make):
    put_node(cluster, make)
    ctx = Ctx(cluster, kind="node-labels", intent={"labels": {"gpuops.io/driver-major": 580}})

    assert SetNodeLabels().advance(ctx) == Done("set on gpu-01: gpuops.io/driver-major=580")
    assert cluster.writes[0].args["labels"] == {"gpuops.io/driver-major": "580"}


def test_a_dry_run_of_labels_asks_the_api_with_dry_run_and_changes_nothing(cluster, make):
    before = put_node(cluster, make, labels=HOST)
    ctx = Ctx(cluster, kind="node-labels", dry_run=True, intent={"labels": {"nvidia.com/gpu.deploy.driver": "true"}})

    assert SetNodeLabels().advance(ctx) == Done("would set on gpu-01: nvidia.com/gpu.deploy.driver=true")
    assert [(w.verb, w.target, w.args["dry_run"]) for w in cluster.writes] == [("label", NODE, True)]
    assert cluster.node(NODE) == before


@pytest.mark.parametrize("params", [{}, {"labels": {}}], ids=["no-labels", "empty-labels"])
def test_a_labels_step_without_labels_is_refused_before_it_reads_the_node(cluster, params):
    ctx = Ctx(cluster, kind="node-labels", params=params)  # no node at all: it is not read

    with pytest.raises(StepParamsError, match="^a node-labels step needs params.labels, a map of label to value "
                                              r"\(null removes it\)$"):
        SetNodeLabels().prepare(ctx)


# ------------------------------------------------------------------ restore

SNAPSHOT_TAINTS = [{"key": "gpuops.io/maintenance", "value": "driver", "effect": "NoSchedule"},
                   {"key": "nvidia.com/gpu", "effect": "NoExecute"}]
RESTORE_PARAMS = {"labels": {"nvidia.com/gpu.deploy.driver": "pre-installed", "team": "ml"},
                  "keys": ["nvidia.com/gpu.deploy.driver", "gpuops.io/host-driver"], "taints": SNAPSHOT_TAINTS}
PUT_BACK = {"nvidia.com/gpu.deploy.driver": "pre-installed", "gpuops.io/host-driver": None}
RESTORED = ("gpu-01 is back as its snapshot had it: gpuops.io/host-driver removed, "
            "nvidia.com/gpu.deploy.driver=pre-installed; 2 taints; it stays cordoned")


def after_the_run(cluster: RestoringCluster, make) -> NodeObject:
    """gpu-01 as the run being rolled back left it: the operator's driver, its own label, a taint changed."""
    return put_node(cluster, make, labels={"nvidia.com/gpu.deploy.driver": "true", "gpuops.io/host-driver": "gone"},
                    taints=(NO_SCHEDULE, Taint(key="extra", value="x", effect="NoSchedule")), unschedulable=True)


def prepared_restore(cluster: RestoringCluster, **kwargs: Any) -> Ctx:
    ctx = Ctx(cluster, kind="restore", params=RESTORE_PARAMS, **kwargs)
    ctx.intent = Restore().prepare(ctx)
    return ctx


def test_restoring_puts_back_the_snapshots_labels_among_keys_and_its_taints_in_one_audited_patch(cluster, make):
    version = after_the_run(cluster, make).resource_version
    ctx = prepared_restore(cluster)

    assert ctx.intent == {"labels": PUT_BACK, "taints": SNAPSHOT_TAINTS,
                          "found": {"nvidia.com/gpu.deploy.driver": "true", "gpuops.io/host-driver": "gone"}}
    assert Restore().advance(ctx) == Done(RESTORED)

    (write,) = cluster.writes
    assert write.verb == "restore" and write.target == NODE
    assert write.args["labels"] == PUT_BACK
    assert (write.args["resource_version"], write.args["dry_run"]) == (version, False)
    assert write.args["taints"] == (NO_SCHEDULE, NO_VALUE)
    node = cluster.node(NODE)
    assert node.labels["nvidia.com/gpu.deploy.driver"] == "pre-installed" and "gpuops.io/host-driver" not in node.labels
    assert "team" not in node.labels  # not among keys: the snapshot's other labels are not put back
    assert node.taints == (NO_SCHEDULE, NO_VALUE) and node.unschedulable
    assert ctx.records == {"restore": {"action": "node.restore", "target": "node gpu-01", "detail": {
        "labels": PUT_BACK, "taints": SNAPSHOT_TAINTS,
        "found": {"nvidia.com/gpu.deploy.driver": "true", "gpuops.io/host-driver": "gone"}}}}
    assert ctx.acts == 1
    # Looked at again (after a restart): the node is as the snapshot had it, nothing more is written.
    assert Restore().advance(ctx) == Done(RESTORED)
    assert len(cluster.writes) == 1 and ctx.acts == 1


def test_a_node_whose_labels_are_back_but_not_its_taints_is_still_restored(cluster, make):
    put_node(cluster, make, labels=HOST, taints=(NO_SCHEDULE,), unschedulable=True)
    ctx = prepared_restore(cluster)

    assert Restore().advance(ctx) == Done(RESTORED)
    assert [w.args["taints"] for w in cluster.writes] == [(NO_SCHEDULE, NO_VALUE)]
    assert cluster.node(NODE).taints == (NO_SCHEDULE, NO_VALUE)


def test_a_node_whose_taints_are_back_but_not_its_labels_is_still_restored(cluster, make):
    put_node(cluster, make, labels={"gpuops.io/host-driver": "gone"}, taints=(NO_VALUE, NO_SCHEDULE))
    ctx = prepared_restore(cluster)

    assert Restore().advance(ctx) == Done(RESTORED)
    assert [w.args["labels"] for w in cluster.writes] == [PUT_BACK]


def test_a_node_already_as_its_snapshot_had_it_is_neither_written_nor_audited(cluster, make):
    put_node(cluster, make, labels=HOST, taints=(NO_VALUE, NO_SCHEDULE), unschedulable=True)
    ctx = prepared_restore(cluster)

    assert Restore().advance(ctx) == Done(RESTORED)
    assert cluster.writes == [] and ctx.records == {} and ctx.acts == 0


def test_restoring_one_taint_says_taint_once(cluster, make):
    after_the_run(cluster, make)
    ctx = Ctx(cluster, kind="restore", params={**RESTORE_PARAMS, "taints": SNAPSHOT_TAINTS[:1]})
    ctx.intent = Restore().prepare(ctx)

    assert Restore().advance(ctx) == Done(RESTORED.replace("2 taints", "1 taint"))
    assert cluster.node(NODE).taints == (NO_SCHEDULE,)


def test_a_dry_run_restore_asks_the_api_with_dry_run_and_neither_audits_nor_changes(cluster, make):
    before = after_the_run(cluster, make)
    ctx = prepared_restore(cluster, dry_run=True)

    assert Restore().advance(ctx) == Done(RESTORED)
    assert [(w.verb, w.args["dry_run"], w.args["resource_version"]) for w in cluster.writes] == [
        ("restore", True, before.resource_version)]
    assert cluster.node(NODE) == before and ctx.records == {}


def test_a_node_changed_while_it_is_restored_is_read_again_soon(cluster, make):
    after_the_run(cluster, make)
    ctx = prepared_restore(cluster)
    original = cluster.restore_node

    def changed_first(name: str, **kwargs: Any) -> Any:
        cluster.label_node(name, labels={"team": "infra"}, dry_run=False)
        return original(name, **kwargs)

    cluster.restore_node = changed_first  # type: ignore[method-assign]
    assert Restore().advance(ctx) == Waiting("gpu-01 changed while it was being restored; reading it again",
                                             retry_in=1.0)
    assert cluster.node(NODE).labels["gpuops.io/host-driver"] == "gone"


@pytest.mark.parametrize("missing", ["labels", "keys", "taints"])
def test_a_restore_step_missing_labels_keys_or_taints_is_refused(cluster, make, missing):
    put_node(cluster, make)
    params = {k: v for k, v in RESTORE_PARAMS.items() if k != missing}

    with pytest.raises(StepParamsError, match="^a restore step needs params labels \\(the snapshot's\\), keys "
                                              "\\(the labels to put back\\) and taints$"):
        Restore().prepare(Ctx(cluster, kind="restore", params=params))


# ------------------------------------------------------------------ a person at the host driver


def host_node(make, *, advertised: int = 8) -> NodeObject:
    return make.node(NODE, labels=HOST, capacity={"nvidia.com/gpu": str(advertised)})


def working(make):
    """A host driver that works: no operator driver pod, a Ready validator, every GPU advertised."""
    return make.assess(host_node(make), [make.device_plugin_pod(NODE), make.validator_pod(NODE)])


def gone(make, **validator: Any):
    """No driver: the validator waits for one (Running, not Ready, unless told), no GPU advertised."""
    validator.setdefault("ready", False)
    return make.assess(host_node(make, advertised=0), [make.validator_pod(NODE, **validator)])


def by_hand(inventory, *, install: bool, **kwargs: Any) -> tuple[HostDriverByHand, CheckCtx]:
    """The step once the engine ran `prepare` on `inventory`; the node may change after."""
    kind = "host-driver-installed" if install else "host-driver-removed"
    ctx = CheckCtx(None, kind=kind, inventory=inventory, **kwargs)
    step = HostDriverByHand(install=install)
    ctx.intent = step.prepare(ctx)
    return step, ctx


def told(*, install: bool) -> StepNotice:
    return StepNotice("host-driver/gpu-01", say.host_driver_by_hand("gpu-01", run=RUN, request="req-1",
                                                                    install=install))


def test_removal_waits_for_a_person_and_tells_the_thread_once_what_to_do(make):
    step, ctx = by_hand(working(make), install=False)

    assert ctx.intent == {"driver_worked": True}
    assert step.advance(ctx) == Waiting("waiting for a person to remove the host driver from gpu-01 and confirm it",
                                        retry_in=5.0, notice=told(install=False))
    assert ctx.records == {}


def test_installing_waits_for_a_person_and_tells_the_thread_the_operators_driver_is_off(make):
    step, ctx = by_hand(gone(make), install=True)

    assert ctx.intent == {"driver_worked": False}
    assert step.advance(ctx) == Waiting("waiting for a person to install the host driver on gpu-01 and confirm it",
                                        retry_in=5.0, notice=told(install=True))


def test_a_node_with_no_inventory_is_taken_as_no_working_driver(make):
    step, ctx = by_hand(None, install=False)

    assert ctx.intent == {"driver_worked": False}
    assert step.advance(ctx).reason == ("gpu-01 had no working host driver when this step began, so its evidence "
                                        "cannot tell the change: waiting for a person to confirm")


def test_the_operators_own_driver_pod_is_no_working_host_driver_even_with_every_gpu_advertised(make):
    _, ctx = by_hand(make.assess(make.node(NODE)), install=False)

    assert ctx.intent == {"driver_worked": False}


def test_a_node_that_already_had_a_working_driver_cannot_show_an_install(make):
    step, ctx = by_hand(working(make), install=True, params={"evidence": True})

    assert step.advance(ctx) == Waiting(
        "gpu-01 already had a working driver when this step began, so its evidence cannot tell the change: "
        "waiting for a person to confirm", retry_in=5.0, notice=told(install=True))
    assert ctx.records == {}


@pytest.mark.parametrize("install", [False, True], ids=["removed", "installed"])
def test_a_confirmation_completes_the_step_naming_the_person(make, install):
    step, ctx = by_hand(working(make), install=install,
                        params={"confirmed_by": "U0ALICE", "confirmed_by_name": "alice"})
    where = "installed on" if install else "gone from"

    assert step.advance(ctx) == Done(f"alice confirmed the host driver is {where} gpu-01", {"confirmed_by": "U0ALICE"})
    ctx.params = {"confirmed_by": "U0ALICE"}
    assert step.advance(ctx) == Done(f"U0ALICE confirmed the host driver is {where} gpu-01",
                                     {"confirmed_by": "U0ALICE"})


DRY_RUN_WAITS = [(False, "would wait for a person to remove the host driver from gpu-01 and confirm it"),
                 (True, "would wait for a person to install the host driver on gpu-01 and confirm it")]


@pytest.mark.parametrize(("install", "text"), DRY_RUN_WAITS, ids=["removed", "installed"])
def test_a_dry_run_is_done_at_once_saying_whom_it_would_wait_for_to_do_what(make, install, text):
    step, ctx = by_hand(working(make), install=install, dry_run=True)

    assert step.advance(ctx) == Done(text)  # the detail empty
    assert ctx.records == {}


REMOVED_EVIDENCE = ("gpu-01 no longer has a working driver: no operator driver pod, validator {} (waiting for a "
                    "driver), 0 GPUs advertised")
INSTALLED_EVIDENCE = ("gpu-01 has a working driver and no operator driver pod: validator Running, Ready, "
                      "8 GPUs advertised")


@pytest.mark.parametrize(("validator", "shown"), [({}, "Running, not Ready"),
                                                  ({"phase": "Pending"}, "Pending")], ids=["starting", "pending"])
def test_a_driver_that_stopped_completes_the_removal_where_the_pool_trusts_evidence_and_is_audited(
        make, validator, shown):
    step, ctx = by_hand(working(make), install=False, params={"evidence": True})
    ctx.inventory = gone(make, **validator)
    evidence = REMOVED_EVIDENCE.format(shown)

    assert step.advance(ctx) == Done(f"the host driver is gone, by the node's evidence: {evidence}",
                                     {"evidence": evidence})
    assert ctx.records == {"evidence": {"action": "run.host-driver-removed", "target": "node gpu-01",
                                        "detail": {"by": "evidence", "evidence": evidence}}}


def test_a_driver_that_started_completes_the_install_where_the_pool_trusts_evidence_and_is_audited(make):
    step, ctx = by_hand(gone(make), install=True, params={"evidence": True})
    ctx.inventory = working(make)

    assert step.advance(ctx) == Done(f"the host driver is installed, by the node's evidence: {INSTALLED_EVIDENCE}",
                                     {"evidence": INSTALLED_EVIDENCE})
    assert ctx.records == {"evidence": {"action": "run.host-driver-installed", "target": "node gpu-01",
                                        "detail": {"by": "evidence", "evidence": INSTALLED_EVIDENCE}}}


@pytest.mark.parametrize("trusted", [None, False], ids=["pool-unsaid", "pool-distrusts"])
def test_evidence_a_pool_does_not_trust_is_shown_and_a_person_still_confirms_the_removal(make, trusted):
    params = {} if trusted is None else {"evidence": trusted}
    step, ctx = by_hand(working(make), install=False, params=params)
    ctx.inventory = gone(make)

    assert step.advance(ctx) == Waiting(
        REMOVED_EVIDENCE.format("Running, not Ready") + "; confirm once its packages are gone (a driver that stopped "
        "is not proof: a leftover install loads again at the next boot)", retry_in=5.0, notice=told(install=False))
    assert ctx.records == {}


def test_evidence_of_an_install_is_shown_and_a_person_still_confirms_it(make):
    step, ctx = by_hand(gone(make), install=True)
    ctx.inventory = working(make)

    assert step.advance(ctx) == Waiting(f"{INSTALLED_EVIDENCE}; confirm once its packages are installed",
                                        retry_in=5.0, notice=told(install=True))


@pytest.mark.parametrize("now", [
    pytest.param(lambda make: make.assess(host_node(make, advertised=0), []), id="no-validator"),
    pytest.param(lambda make: make.assess(host_node(make, advertised=0), [make.validator_pod(NODE)]),
                 id="validator-ready"),
    pytest.param(lambda make: make.assess(host_node(make, advertised=0), [
        make.driver_pod(NODE, ready=False), make.validator_pod(NODE, ready=False)]), id="operator-driver-pod"),
    pytest.param(lambda make: gone(make, deleting=True), id="validator-terminating"),
    pytest.param(lambda make: make.assess(host_node(make, advertised=3), [make.validator_pod(NODE, ready=False)]),
                 id="gpus-still-advertised"),
])
def test_a_node_short_of_every_sign_of_a_removed_driver_is_no_evidence(make, now):
    step, ctx = by_hand(working(make), install=False, params={"evidence": True})
    ctx.inventory = now(make)

    assert step.advance(ctx) == Waiting("waiting for a person to remove the host driver from gpu-01 and confirm it",
                                        retry_in=5.0, notice=told(install=False))
    assert ctx.records == {}


@pytest.mark.parametrize("now", [
    pytest.param(lambda make: make.assess(host_node(make, advertised=7), [make.validator_pod(NODE)]),
                 id="gpus-missing"),
    pytest.param(lambda make: make.assess(host_node(make), [make.validator_pod(NODE, ready=False)]),
                 id="validator-not-ready"),
    pytest.param(lambda make: make.assess(host_node(make)), id="operator-driver-pod"),
    pytest.param(lambda make: None, id="node-unseen"),
])
def test_a_node_short_of_every_sign_of_a_working_driver_is_no_evidence_of_an_install(make, now):
    step, ctx = by_hand(gone(make), install=True, params={"evidence": True})
    ctx.inventory = now(make)

    assert step.advance(ctx) == Waiting("waiting for a person to install the host driver on gpu-01 and confirm it",
                                        retry_in=5.0, notice=told(install=True))


# ------------------------------------------------------------------ time


@pytest.mark.parametrize(("logic", "kind", "default"), [
    (Snapshot(), "snapshot", 60), (SetNodeLabels(), "node-labels", 120), (Restore(), "restore", 120),
    (HostDriverByHand(install=False), "host-driver-removed", 8 * 3600),
    (HostDriverByHand(install=True), "host-driver-installed", 8 * 3600)])
def test_each_step_has_its_own_time_unless_told_and_no_time_at_all_is_refused_naming_it(
        cluster, logic, kind, default):
    assert_step_time(cluster, logic, kind, default)


def test_a_person_has_until_the_window_ends_if_that_is_sooner_and_no_time_once_it_has(cluster):
    step = HostDriverByHand(install=False)
    soon = NOW + dt.timedelta(hours=2)

    assert step.timeout(Ctx(cluster, window_end=soon)) == dt.timedelta(hours=2)
    assert step.timeout(Ctx(cluster, window_end=NOW + dt.timedelta(hours=9))) == dt.timedelta(hours=8)
    assert step.timeout(Ctx(cluster, window_end=NOW - dt.timedelta(minutes=5))) == dt.timedelta(0)
