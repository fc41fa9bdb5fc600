"""The mig step one call at a time, over the in-memory cluster: how it asks the GPU
Operator's MIG manager for a layout (label nvidia.com/mig.config, clearing
nvidia.com/mig.config.state), what holds it (GPU pods still on the node), what it says
while the MIG manager works (its state, the operands paused-for-mig-change, what the node
advertises), when it is done (success, and the node advertises exactly what params.expect
names) and when it fails (failed: code mig-failed). The sentences are the ones
workflows.engine.messages writes; the step only chooses them.

The context is tests/unit/test_step_outcomes.py's; a step that needs a control plane
runs in tests/integration."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest
from fake_cluster import Write

from tests.unit.test_step_outcomes import Ctx
from workflows.engine import messages as say
from workflows.engine.steps.contract import Done, Failed, LeaseLost, StepParamsError, Waiting
from workflows.engine.steps.mig import Mig

LAYOUT = "all-1g.10gb"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
PAUSED = "paused-for-mig-change"
# How soon the step looks again whenever it waits (seconds), watch event or not.
SOON = 5.0


@dataclass
class LeaseGoneCtx(Ctx):
    """The context of a replica that no longer holds the engine lease."""

    def act(self) -> None:
        raise LeaseLost("another replica holds the engine lease")


def put_node(cluster, make, *, config: str | None = "all-disabled", state: str | None = "success",
             labels: dict[str, str | None] | None = None, capacity: dict[str, str | None] | None = None,
             allocatable: dict[str, str | None] | None = None) -> None:
    """gpu-01 as the MIG manager left it: at layout `config` with `state` (None: no label)."""
    cluster.add_node(make.node("gpu-01", labels={MIG_CONFIG: config, MIG_STATE: state, **(labels or {})},
                               capacity=capacity, allocatable=allocatable))


def started(cluster, *, dry_run: bool = False, ctx_type: type[Ctx] = Ctx, **params) -> Ctx:
    """The step's context once the engine has run `prepare` for LAYOUT (and `params`)."""
    ctx = ctx_type(cluster, kind="mig", params={"config": LAYOUT, **params}, dry_run=dry_run)
    ctx.intent = Mig().prepare(ctx)
    return ctx


def mixed(make, cluster, *, state: str, capacity: dict[str, str | None],
          allocatable: dict[str, str | None] | None = None, **labels: str) -> None:
    """gpu-01 at LAYOUT with mig.strategy mixed: MIG slices are resources of their own and
    nvidia.com/gpu counts 0 unless `capacity` says otherwise."""
    put_node(cluster, make, config=LAYOUT, state=state,
             labels={"nvidia.com/mig.strategy": "mixed", **labels},
             capacity={"nvidia.com/gpu": "0", **capacity}, allocatable=allocatable)


# --- params and timeout --------------------------------------------------------------------


def test_a_mig_step_may_take_half_an_hour_unless_its_params_say_otherwise(fake_cluster):
    assert Mig().timeout(Ctx(fake_cluster, kind="mig", params={"config": LAYOUT})) == dt.timedelta(minutes=30)
    assert Mig().timeout(Ctx(fake_cluster, kind="mig", params={"config": LAYOUT, "timeout_s": 600})) == \
        dt.timedelta(minutes=10)


def test_a_timeout_of_no_time_is_refused_naming_the_mig_step(fake_cluster):
    with pytest.raises(StepParamsError, match=r"^mig step: params\.timeout_s must be more than 0, not 0$"):
        Mig().timeout(Ctx(fake_cluster, kind="mig", params={"config": LAYOUT, "timeout_s": 0}))


@pytest.mark.parametrize("params", [{}, {"config": ""}, {"config": None}])
def test_a_mig_step_without_a_layout_is_refused_before_it_touches_the_node(fake_cluster, make, params):
    put_node(fake_cluster, make)
    ctx = Ctx(fake_cluster, kind="mig", params=params)

    with pytest.raises(StepParamsError) as refused:
        Mig().prepare(ctx)

    assert str(refused.value) == "a mig step needs the MIG layout in params.config (e.g. all-1g.10gb)"
    assert fake_cluster.writes == [] and ctx.acts == 0


def test_starting_remembers_the_layout_asked_for_and_what_the_node_had_without_changing_anything(
        fake_cluster, make):
    put_node(fake_cluster, make, config="all-disabled", state="success")
    ctx = Ctx(fake_cluster, kind="mig", params={"config": LAYOUT})

    assert Mig().prepare(ctx) == {"config": LAYOUT, "prior_config": "all-disabled", "prior_state": "success"}
    assert fake_cluster.writes == [] and ctx.acts == 0


def test_a_node_the_mig_manager_never_labelled_is_remembered_as_having_no_layout_and_no_state(fake_cluster, make):
    put_node(fake_cluster, make, config=None, state=None)

    assert Mig().prepare(Ctx(fake_cluster, kind="mig", params={"config": LAYOUT})) == {
        "config": LAYOUT, "prior_config": None, "prior_state": None}


# --- asking for the layout -----------------------------------------------------------------


def test_a_node_at_another_layout_is_asked_for_the_new_one_on_the_lease_and_its_old_state_is_cleared(
        fake_cluster, make):
    put_node(fake_cluster, make, config="all-disabled", state="success")
    ctx = started(fake_cluster)

    outcome = Mig().advance(ctx)

    assert outcome == Waiting(say.mig_requested(LAYOUT), retry_in=SOON)
    assert ctx.acts == 1
    assert fake_cluster.writes == [Write("label", "gpu-01", {
        "annotations": {}, "labels": {MIG_CONFIG: LAYOUT, MIG_STATE: None}, "resource_version": None,
        "dry_run": False})]
    labels = fake_cluster.node("gpu-01").labels
    assert labels[MIG_CONFIG] == LAYOUT and MIG_STATE not in labels


def test_the_old_layouts_success_is_not_taken_for_the_new_ones(fake_cluster, make):
    put_node(fake_cluster, make, config="all-disabled", state="success")
    ctx = started(fake_cluster)
    Mig().advance(ctx)  # asks for LAYOUT

    outcome = Mig().advance(ctx)

    assert outcome == Waiting(say.mig_waiting(LAYOUT, None, [], "8x nvidia.com/gpu"), retry_in=SOON)
    assert "(state: not started)" in outcome.reason
    assert len(fake_cluster.writes) == 1  # asked once


def test_a_replica_that_lost_the_lease_changes_no_label(fake_cluster, make):
    put_node(fake_cluster, make)
    ctx = started(fake_cluster, ctx_type=LeaseGoneCtx)

    with pytest.raises(LeaseLost):
        Mig().advance(ctx)

    assert fake_cluster.writes == []
    assert fake_cluster.node("gpu-01").labels[MIG_CONFIG] == "all-disabled"


def test_gpu_pods_still_on_the_node_hold_the_change_and_are_named(fake_cluster, make):
    put_node(fake_cluster, make)
    fake_cluster.add_pod(make.workload("gpu-01", gpus=4, name="trainer-1"), uid="u-1")
    fake_cluster.add_pod(make.workload("gpu-01", gpus=1, resource="nvidia.com/mig-1g.10gb", name="trainer-0"),
                         uid="u-0")
    fake_cluster.add_pod(make.pod(node="gpu-01", namespace="ml", name="web", owner_kind="ReplicaSet"), uid="u-2")
    ctx = started(fake_cluster)

    outcome = Mig().advance(ctx)

    assert outcome == Waiting(say.gpu_pods_in_the_way(["ml/trainer-0", "ml/trainer-1"], "changing the MIG layout"),
                              retry_in=SOON)
    assert outcome.reason.startswith("not changing the MIG layout while GPU pods still run here: ")
    assert fake_cluster.writes == [] and ctx.acts == 0


def test_with_allow_gpu_pods_the_layout_is_asked_for_under_running_gpu_pods(fake_cluster, make):
    put_node(fake_cluster, make)
    fake_cluster.add_pod(make.workload("gpu-01", gpus=4, name="trainer-0"), uid="u-0")
    ctx = started(fake_cluster, allow_gpu_pods=True)

    assert Mig().advance(ctx) == Waiting(say.mig_requested(LAYOUT), retry_in=SOON)
    assert fake_cluster.did() == [("label", "gpu-01")]
    assert fake_cluster.node("gpu-01").labels[MIG_CONFIG] == LAYOUT


def test_a_dry_run_says_what_it_would_set_and_changes_nothing_even_with_gpu_pods_there(fake_cluster, make):
    put_node(fake_cluster, make, config="all-disabled", state="success")
    fake_cluster.add_pod(make.workload("gpu-01", gpus=4, name="trainer-0"), uid="u-0")
    ctx = started(fake_cluster, dry_run=True)

    outcome = Mig().advance(ctx)

    assert outcome == Done(say.would_set_mig(LAYOUT, "all-disabled"))
    assert outcome.note == f"would set nvidia.com/mig.config to {LAYOUT} (now all-disabled)"
    # The API server is asked in dry-run mode only (it checks the patch, keeps nothing).
    assert fake_cluster.writes == [Write("label", "gpu-01", {
        "annotations": {}, "labels": {MIG_CONFIG: LAYOUT, MIG_STATE: None}, "resource_version": None,
        "dry_run": True})]
    labels = fake_cluster.node("gpu-01").labels
    assert (labels[MIG_CONFIG], labels[MIG_STATE]) == ("all-disabled", "success")


def test_a_dry_run_on_a_node_without_a_layout_says_it_is_unset(fake_cluster, make):
    put_node(fake_cluster, make, config=None, state=None)

    assert Mig().advance(started(fake_cluster, dry_run=True)) == Done(say.would_set_mig(LAYOUT, None))


@pytest.mark.parametrize("state", ["success", "failed", "pending", None])
def test_a_dry_run_on_a_node_already_at_the_layout_says_what_the_mig_manager_reports_and_writes_nothing(
        fake_cluster, make, state):
    """Not "applied" whatever the state: a node whose MIG manager reports failed would fail
    the real run, and the dry run says so rather than claim success."""
    put_node(fake_cluster, make, config=LAYOUT, state=state)
    ctx = started(fake_cluster, dry_run=True, expect={"nvidia.com/mig-1g.10gb": 56})
    assert Mig().advance(ctx) == Done(say.would_leave_mig(LAYOUT, state, "8x nvidia.com/gpu"))
    assert fake_cluster.writes == [] and ctx.acts == 0


# --- waiting for the MIG manager ------------------------------------------------------------


def test_a_node_already_at_the_layout_with_success_is_left_alone_even_with_gpu_pods_there(fake_cluster, make):
    put_node(fake_cluster, make, config=LAYOUT, state="success")
    fake_cluster.add_pod(make.workload("gpu-01", gpus=4, name="trainer-0"), uid="u-0")
    ctx = started(fake_cluster)

    assert Mig().advance(ctx) == Done(say.mig_applied(LAYOUT))
    assert fake_cluster.writes == [] and ctx.acts == 0


@pytest.mark.parametrize("state", ["pending", "rebooting", "a-state-of-a-newer-mig-manager", None])
def test_while_the_mig_manager_works_the_step_waits_saying_its_state_and_what_the_node_advertises(
        fake_cluster, make, state):
    put_node(fake_cluster, make, config=LAYOUT, state=state)
    ctx = started(fake_cluster)

    outcome = Mig().advance(ctx)

    assert outcome == Waiting(say.mig_waiting(LAYOUT, state, [], "8x nvidia.com/gpu"), retry_in=SOON)
    assert outcome.reason.endswith("; advertising 8x nvidia.com/gpu")
    assert fake_cluster.writes == [] and ctx.acts == 0


def test_the_waiting_sentence_names_the_operands_paused_for_the_mig_change_sorted_and_no_gpus(fake_cluster, make):
    mixed(make, fake_cluster, state="rebooting", capacity={}, **{
        "nvidia.com/gpu.deploy.gpu-feature-discovery": PAUSED,
        "nvidia.com/gpu.deploy.device-plugin": PAUSED,
        "nvidia.com/gpu.deploy.driver": "paused-for-driver-upgrade",
        "nvidia.com/gpu.deploy.operator-validator": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": PAUSED,
        "example.com/gpu.deploy.dcgm": PAUSED,
    })

    outcome = Mig().advance(started(fake_cluster))

    assert outcome == Waiting(say.mig_waiting(
        LAYOUT, "rebooting", ["dcgm-exporter", "device-plugin", "gpu-feature-discovery"], "no GPUs"), retry_in=SOON)
    assert outcome.reason.endswith(
        "; operands still paused-for-mig-change: dcgm-exporter, device-plugin, gpu-feature-discovery; "
        "advertising no GPUs")


def test_what_the_node_advertises_is_its_gpu_resources_sorted_each_with_its_count(fake_cluster, make):
    mixed(make, fake_cluster, state="pending", capacity={
        "nvidia.com/mig-3g.40gb": "2", "nvidia.com/gpu": None, "nvidia.com/mig-1g.10gb": "7",
        "nvidia.com/gpu.shared": "0"})

    outcome = Mig().advance(started(fake_cluster))

    # cpu and memory are no GPU resource; a resource of 0 is none.
    assert outcome == Waiting(say.mig_waiting(
        LAYOUT, "pending", [], "7x nvidia.com/mig-1g.10gb, 2x nvidia.com/mig-3g.40gb"), retry_in=SOON)


def test_a_gpu_capacity_that_is_no_plain_count_is_not_counted_rather_than_breaking_the_step(fake_cluster, make):
    put_node(fake_cluster, make, config=LAYOUT, state="pending", capacity={"nvidia.com/gpu": "1k"})

    assert Mig().advance(started(fake_cluster)) == Waiting(say.mig_waiting(LAYOUT, "pending", [], "no GPUs"),
                                                           retry_in=SOON)


def test_failed_fails_the_step_with_the_mig_failed_code_naming_node_and_layout(fake_cluster, make):
    put_node(fake_cluster, make, config=LAYOUT, state="failed",
             labels={"nvidia.com/gpu.deploy.device-plugin": PAUSED})
    ctx = started(fake_cluster)

    outcome = Mig().advance(ctx)

    assert outcome == Failed(say.mig_failed("gpu-01", LAYOUT), code="mig-failed")
    assert outcome.reason.startswith(f"the MIG manager on gpu-01 reports failed for {LAYOUT}")
    assert fake_cluster.writes == [] and ctx.acts == 0


# --- success and what the node advertises -----------------------------------------------------


def test_success_is_done_only_once_the_node_advertises_every_expected_resource(fake_cluster, make):
    expect = {"nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-1g.10gb": 4}
    mixed(make, fake_cluster, state="success",
          capacity={"nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1g.10gb": "3"})
    ctx = started(fake_cluster, expect=expect)

    fewer = Mig().advance(ctx)

    assert fewer == Waiting(say.mig_not_advertised(
        LAYOUT, "3x nvidia.com/mig-1g.10gb, 1x nvidia.com/mig-3g.40gb",
        "4x nvidia.com/mig-1g.10gb, 1x nvidia.com/mig-3g.40gb"), retry_in=SOON)
    assert fewer.reason == (f"MIG layout {LAYOUT} applied; waiting for the node to advertise "
                            "4x nvidia.com/mig-1g.10gb, 1x nvidia.com/mig-3g.40gb "
                            "(now 3x nvidia.com/mig-1g.10gb, 1x nvidia.com/mig-3g.40gb)")

    mixed(make, fake_cluster, state="success",
          capacity={"nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1g.10gb": "4"})

    assert Mig().advance(ctx) == Done(say.mig_applied(LAYOUT))
    assert fake_cluster.writes == [] and ctx.acts == 0


def test_a_node_that_advertises_more_than_expected_keeps_the_step_waiting(fake_cluster, make):
    mixed(make, fake_cluster, state="success",
          capacity={"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-2g.20gb": "1"})

    outcome = Mig().advance(started(fake_cluster, expect={"nvidia.com/mig-1g.10gb": 7}))

    assert outcome == Waiting(say.mig_not_advertised(
        LAYOUT, "7x nvidia.com/mig-1g.10gb, 1x nvidia.com/mig-2g.20gb", "7x nvidia.com/mig-1g.10gb"), retry_in=SOON)


def test_a_wedged_node_at_success_that_advertises_no_gpus_keeps_the_step_waiting(fake_cluster, make):
    mixed(make, fake_cluster, state="success", capacity={},
          **{"nvidia.com/gpu.deploy.device-plugin": PAUSED})

    outcome = Mig().advance(started(fake_cluster, expect={"nvidia.com/mig-1g.10gb": 7}))

    assert outcome == Waiting(say.mig_not_advertised(LAYOUT, "no GPUs", "7x nvidia.com/mig-1g.10gb"), retry_in=SOON)


def test_an_expected_count_of_zero_asks_for_none_of_that_resource(fake_cluster, make):
    mixed(make, fake_cluster, state="success", capacity={"nvidia.com/mig-1g.10gb": "7"})

    outcome = Mig().advance(started(fake_cluster, expect={"nvidia.com/gpu": 0, "nvidia.com/mig-1g.10gb": 7}))

    assert outcome == Done(say.mig_applied(LAYOUT))


def test_a_slice_the_device_plugin_marked_unhealthy_still_counts_as_advertised(fake_cluster, make):
    # The step checks the layout the MIG manager made (capacity); the devices' health is
    # the gpu-check step's to judge.
    mixed(make, fake_cluster, state="success", capacity={"nvidia.com/mig-1g.10gb": "7"},
          allocatable={"nvidia.com/mig-1g.10gb": "6"})

    assert Mig().advance(started(fake_cluster, expect={"nvidia.com/mig-1g.10gb": 7})) == Done(say.mig_applied(LAYOUT))


def test_single_strategy_slices_are_counted_as_nvidia_com_gpu(fake_cluster, make):
    put_node(fake_cluster, make, config=LAYOUT, state="success", capacity={"nvidia.com/gpu": "56"})

    assert Mig().advance(started(fake_cluster, expect={"nvidia.com/gpu": 56})) == Done(say.mig_applied(LAYOUT))
    assert Mig().advance(started(fake_cluster, expect={"nvidia.com/gpu": 8})) == Waiting(
        say.mig_not_advertised(LAYOUT, "56x nvidia.com/gpu", "8x nvidia.com/gpu"), retry_in=SOON)


def test_a_whole_change_asks_once_waits_through_the_mig_managers_states_and_is_done(fake_cluster, make):
    put_node(fake_cluster, make, config="all-disabled", state="success")
    ctx = started(fake_cluster, expect={"nvidia.com/gpu": 56})
    step = Mig()

    said = [step.advance(ctx)]
    for state, gpus in (("pending", "8"), ("rebooting", "0"), ("success", "56")):
        put_node(fake_cluster, make, config=LAYOUT, state=state, capacity={"nvidia.com/gpu": gpus})
        said.append(step.advance(ctx))

    assert said == [Waiting(say.mig_requested(LAYOUT), retry_in=SOON),
                    Waiting(say.mig_waiting(LAYOUT, "pending", [], "8x nvidia.com/gpu"), retry_in=SOON),
                    Waiting(say.mig_waiting(LAYOUT, "rebooting", [], "no GPUs"), retry_in=SOON),
                    Done(say.mig_applied(LAYOUT))]
    assert ctx.acts == 1 and fake_cluster.did() == [("label", "gpu-01")]
