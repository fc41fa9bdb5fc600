"""What a drain's plan says and refuses, in the details an approver or requester reads:

- the pods a drain leaves alone (finished, failed, static/mirror pods) are not in its
  preview, a bare pod shows no owner, and the preview names the pool, its size, the
  window occurrence and each node's wave and GPUs;
- validation waits for every GPU GFD's labels count, or for what the node advertises
  when the labels say nothing;
- the notes, in order: the waves (a timed drain names its window end even on a pool
  with `open_drain_max`), the PDBs that may block, the pods `wait_for` waits for (only
  when some match);
- an asked-for time already past is refused with its sentence; a drain asked for `now`
  and planned a moment later, or one planned at its very start, is not; a naive `now`
  is a programming error naming drains;
- a re-plan does not count the request it replaces; a node a run cordoned counts as back
  in service from the run's end (not a person's earlier cordon, not a run without end);
- capacity is checked for the drain's own span: a request after it does not shrink it,
  and each wave's preview counts only what overlaps;
- what would fit: the first time in a window, within four weeks to the minute, when an
  overlapping request ends or the next window starts, checked for the drain's own length;
- a drain every node of which has findings is refused naming the pool.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from tests.unit import test_drain_plan as drains
from tests.unit.test_drain_plan import (
    HOUR,
    Cluster,
    approved_drain,
    berlin,
    build_cluster,
    config,
    parse,
    plan,
    refusal,
)
from workflows.drain.plan import DrainRefused, WorkloadView, plan_drain
from workflows.kube.labels import ANNOTATION_CORDONED_BY
from workflows.pools.windows import Occurrence

# The drain plans' fleet and clock (pytest finds fixtures by their name here).
cluster = drains.cluster
now = drains.now

SATURDAY = berlin("2026-12-05 02:00")


def _plan_spec(spec, cluster: Cluster, now: dt.datetime, *, open_requests=(), **kwargs):
    """`spec` planned at `now` (the request was read earlier, at the fixture's clock)."""
    return plan_drain(spec, fleet=cluster.fleet, pods_by_node=cluster.pods_by_node,
                      policy=config().pools[spec.pool], open_requests=open_requests, now=now,
                      requested_by="U0ADA", **kwargs)


# ------------------------------------------------------------------ the preview


def test_pods_a_drain_leaves_alone_are_not_in_its_preview_and_a_bare_pod_has_no_owner(make, cluster, now):
    failed = make.workload("gpu-a-03", gpus=1, name="failed-0", phase="Failed")
    static = make.workload("gpu-a-03", gpus=0, name="etcd-gpu-a-03", namespace="kube-system", owner_kind="Node")
    mirror = dataclasses.replace(make.workload("gpu-a-03", gpus=0, name="probe-gpu-a-03", owner_kind=None),
                                 annotations={"kubernetes.io/config.mirror": "5f1c"})
    bare = make.workload("gpu-a-03", gpus=1, name="notebook-0", owner_kind=None)
    pods = {**cluster.pods_by_node,
            "gpu-a-03": (*cluster.pods_by_node["gpu-a-03"], failed, static, mirror, bare)}

    drain = plan("gpu-a-03 at sat 02:00", Cluster(cluster.fleet, pods), now)

    assert drain.preview.nodes[0].workloads == (
        WorkloadView(namespace="ml", name="notebook-0", gpus=1, owner=None, waited_for=False, pdbs=()),)
    assert drain.plan.summary.evictions_expected == 1


def test_the_preview_names_the_pool_its_size_the_window_and_each_nodes_wave_and_gpus(make, now):
    cluster = build_cluster(make, **{"gpu-a-04": {"gpus": 4}})

    drain = plan("train-a at sat 02:00", cluster, now)

    preview = drain.preview
    assert (preview.pool, preview.pool_nodes) == ("train-a", 4)
    assert preview.window == Occurrence(SATURDAY, berlin("2026-12-05 06:00"))
    assert [(n.node, n.wave, n.gpus, n.already_cordoned) for n in preview.nodes] == [
        ("gpu-a-01", 0, 8, False), ("gpu-a-02", 0, 8, False),
        ("gpu-a-03", 1, 8, False), ("gpu-a-04", 1, 4, False)]


def test_validation_waits_for_every_gpu_the_labels_count_or_what_the_node_advertises(make, now):
    # gpu-a-04 advertises 6 of the 8 GPUs GFD counts; gpu-a-03's labels give no count.
    cluster = build_cluster(make, **{"gpu-a-04": {"capacity": {"nvidia.com/gpu": "6"}},
                                     "gpu-a-03": {"capacity": {"nvidia.com/gpu": "6"},
                                                  "labels": {"nvidia.com/gpu.count": None}}})

    drain = plan("gpu-a-03 gpu-a-04 at sat 02:00", cluster, now)

    validate = {node: [s for s in drain.plan.waves[0].steps_for(node) if s.kind == "validate"][0]
                for node in ("gpu-a-03", "gpu-a-04")}
    assert {node: step.params["advertised_gpus"] for node, step in validate.items()} == {
        "gpu-a-03": 6, "gpu-a-04": 8}


# ------------------------------------------------------------------ the notes


def test_the_notes_name_the_waves_the_blocking_pdb_and_the_pods_waited_for_in_that_order(cluster, now):
    cfg = config(train_a={"open_drain_max": "3d"})

    waited = plan("gpu-a-01 gpu-a-02 at sat 02:00", cluster, now, cfg=cfg)
    none_waited = plan("gpu-a-02 at sat 02:00", cluster, now, cfg=cfg)

    waves = ("One wave of 2 nodes: it stays drained until someone says `drain done` or the window ends at "
             "Sat 2026-12-05 06:00 CET, then is validated and uncordoned.")
    pdb = ("PDB serve/api-pdb allows 0 disruptions now but a wave evicts 1 of its pods: eviction retries for up "
           "to 30m, then halts the run with the node cordoned, for a person to decide.")
    assert waited.plan.summary.notes == (
        waves, pdb,
        "1 pod matches wait_for (gpuops.io/must-finish=true): the drain waits up to 6h for them to finish "
        "before evicting.")
    assert none_waited.plan.summary.notes == (waves.replace("One wave of 2 nodes", "One wave of 1 node"), pdb)


# ------------------------------------------------------------------ when it starts


def test_an_asked_for_time_that_passed_before_planning_is_refused_with_the_time_it_is(cluster, now):
    spec = parse("gpu-a-01 at sat 02:00 for 1h", cluster, now)

    with pytest.raises(DrainRefused) as refused:
        _plan_spec(spec, cluster, SATURDAY + dt.timedelta(minutes=5))

    assert refused.value.code == "past-time"
    assert refused.value.reason == ("Sat 2026-12-05 02:00 CET is in the past (it is now Sat 2026-12-05 02:05 CET); "
                                    "pick a later time, or next-window.")


def test_a_drain_planned_at_its_start_or_asked_for_now_and_planned_a_moment_later_is_planned(cluster, now):
    at_start = _plan_spec(parse("gpu-a-01 at sat 02:00 for 1h", cluster, now), cluster, SATURDAY)
    asked_now = parse("gpu-b-01 for 1h", cluster, now)
    a_moment_later = _plan_spec(asked_now, cluster, now + dt.timedelta(minutes=1))

    assert (at_start.plan.nodes, at_start.plan.summary.window_end) == (("gpu-a-01",), SATURDAY + HOUR)
    assert (a_moment_later.plan.nodes, a_moment_later.plan.summary.window_end) == (("gpu-b-01",), now + HOUR)


def test_planning_with_a_time_without_a_zone_is_a_programming_error_naming_drains(cluster, now):
    spec = parse("gpu-a-01 at sat 02:00 for 1h", cluster, now)

    with pytest.raises(ValueError) as naive:
        _plan_spec(spec, cluster, dt.datetime(2026, 12, 2, 10, 0))

    assert str(naive.value) == "drains need an aware datetime, not 2026-12-02T10:00:00"


# ------------------------------------------------------------------ what counts against it


def test_a_replan_does_not_count_the_request_it_replaces(cluster, now):
    itself = approved_drain("gpu-a-01", "gpu-a-02", start=SATURDAY, end=berlin("2026-12-05 06:00"))
    spec = parse("gpu-a-01 gpu-a-02 gpu-a-03 at sat 02:00", cluster, now)

    replanned = _plan_spec(spec, cluster, now, open_requests=[itself], replacing="req-1111")

    assert [w.nodes for w in replanned.plan.waves] == [("gpu-a-01", "gpu-a-02"), ("gpu-a-03",)]


def _run_cordon(*, before_run: bool) -> dict:
    mark = ('{"by": "gpuops", "run": "run-7", "at": "2026-12-01T10:00:00Z", "prior_unschedulable": %s}'
            % ("true" if before_run else "false"))
    return {"unschedulable": True, "annotations": {ANNOTATION_CORDONED_BY: mark}}


@pytest.mark.parametrize(
    ("before_run", "run_ends", "waves"),
    [
        # The run that cordoned gpu-a-04 ends as the drain starts: the node is back by then.
        (False, SATURDAY, [("gpu-a-01", "gpu-a-02")]),
        # A run held until `drain done` may still hold it.
        (False, None, [("gpu-a-01",), ("gpu-a-02",)]),
        # A person cordoned it before the run: the run leaves that cordon in place when it ends.
        (True, SATURDAY, [("gpu-a-01",), ("gpu-a-02",)]),
        # A run ending after the drain starts still holds it.
        (False, SATURDAY + dt.timedelta(minutes=1), [("gpu-a-01",), ("gpu-a-02",)]),
    ],
)
def test_a_node_a_run_cordoned_counts_as_back_in_service_from_the_runs_end(make, now, before_run, run_ends, waves):
    cluster = build_cluster(make, **{"gpu-a-04": _run_cordon(before_run=before_run)})
    spec = parse("gpu-a-01 gpu-a-02 at sat 02:00", cluster, now)

    drain = _plan_spec(spec, cluster, now, runs_ending={"run-7": run_ends})

    assert [w.nodes for w in drain.plan.waves] == waves


def test_capacity_is_checked_for_the_drains_own_span_and_each_wave_counts_what_overlaps_it(cluster, now):
    # Holds gpu-a-03 and gpu-a-04 from 04:00, when the drain has ended.
    later = approved_drain("gpu-a-03", "gpu-a-04", start=berlin("2026-12-05 04:00"),
                           end=berlin("2026-12-05 06:00"))

    drain = plan("gpu-a-01 gpu-a-02 gpu-a-03 at sat 02:00 for 2h", cluster, now, open_requests=[later])

    assert [(w.nodes, w.unavailable_nodes, w.ready_gpus) for w in drain.preview.waves] == [
        (("gpu-a-01", "gpu-a-02"), 2, 16), (("gpu-a-03",), 1, 24)]


# ------------------------------------------------------------------ what would fit


def test_a_drain_too_long_for_its_window_says_when_it_fits_in_full(cluster, now):
    refused = refusal("gpu-a-01 at 2026-12-05 05:00 for 2h", cluster, now)

    assert refused.reason == (
        "windows: a drain from Sat 2026-12-05 05:00 CET to Sat 2026-12-05 07:00 CET would run past the end of "
        "pool train-a's window at Sat 2026-12-05 06:00 CET. The first time it fits is Sun 2026-12-06 02:00 CET: "
        "ask with `at 2026-12-06 02:00 Europe/Berlin`.")


@pytest.mark.parametrize("words", ["gpu-a-03 at sat 02:00 for 1h", "gpu-a-03 at sat 02:00"])
def test_what_fits_is_checked_for_the_drains_own_length_not_beyond(cluster, now, words):
    # gpu-a-01 and gpu-a-02 are out this Saturday's window and next Saturday's.
    this_week = approved_drain("gpu-a-01", "gpu-a-02", start=SATURDAY, end=berlin("2026-12-05 06:00"))
    next_week = approved_drain("gpu-a-01", "gpu-a-02", start=berlin("2026-12-12 02:00"),
                               end=berlin("2026-12-12 06:00"), id_="req-2222")

    refused = refusal(words, cluster, now, open_requests=[this_week, next_week])

    assert (refused.code, refused.fits_at) == ("max_unavailable", berlin("2026-12-06 02:00"))
    assert (refused.check.nodes, refused.check.unavailable_during, refused.check.concurrent_nodes) == (
        ("gpu-a-03",), 3, 2)


def test_the_next_window_exactly_four_weeks_ahead_is_still_found(cluster, now):
    # gpu-a-01 and gpu-a-02 are out until New Year's Day, outside any window.
    holiday = approved_drain("gpu-a-01", "gpu-a-02", start=SATURDAY, end=berlin("2027-01-01 12:00"))

    refused = refusal("gpu-a-03 at sat 02:00 for 1h", cluster, now, open_requests=[holiday])

    assert refused.fits_at == berlin("2027-01-02 02:00") == SATURDAY + dt.timedelta(days=28)


@pytest.mark.parametrize(
    ("held_for", "fits_after"),
    [
        (3 * HOUR, 3 * HOUR),
        (dt.timedelta(days=28), dt.timedelta(days=28)),
        (dt.timedelta(days=28, minutes=1), None),
        (None, None),  # held until someone says `drain done`
    ],
)
def test_on_an_always_open_pool_a_drain_fits_when_the_overlapping_request_ends_within_four_weeks(
        cluster, now, held_for, fits_after):
    other = dataclasses.replace(
        approved_drain("gpu-b-02", start=now, end=now), pool="serve-b",
        window_end=now + held_for if held_for is not None else None)

    refused = refusal("gpu-b-01 for 1h", cluster, now, open_requests=[other])

    assert refused.code == "max_unavailable"
    assert refused.fits_at == (now + fits_after if fits_after is not None else None)


def test_a_drain_whose_every_node_has_findings_is_refused_naming_the_pool(make, now):
    # Every node of train-a advertises 7 of the 8 GPUs GFD counts.
    cluster = build_cluster(make, **{f"gpu-a-0{n}": {"capacity": {"nvidia.com/gpu": "7"}} for n in range(1, 5)})

    refused = refusal("train-a at sat 02:00", cluster, now)

    assert refused.code == "every-node-has-findings"
    assert refused.reason == (
        "every node the drain of pool train-a would change has an open finding it does not fix (gpu-a-01, "
        "gpu-a-02, gpu-a-03 and gpu-a-04); fix them first, or name the ones to change anyway with "
        "`--include <node>`.")
