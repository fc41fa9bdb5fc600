"""A pool's capacity rules at their edges, where a drain or a wave is refused or allowed
by one node, one GPU or one minute: the budget written as neither or both of a count and a
percent, and a bad one quoted back; requests that only touch a drain in time, which are
neither counted nor named; the worst stretch of a drain deciding whether it comes first
or last; a request with no waves holding nothing; the verdict naming what it checked; a
wave whose window is over (said in the display zone) and a wave checked only until its
window ends; which GPU pods a change of a node moves; and the order of a rolling change,
its waves cut by the floor at exactly the GPU that would break it, a node counted with the
GPUs it comes back with from the wave after its own."""

from __future__ import annotations

import dataclasses
import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from tests.unit.test_capacity import HOUR, SAT_0200, SAT_0600, check, names, other, pool_of, wave_check
from workflows.kube.labels import ANNOTATION_MIRROR
from workflows.kube.objects import NodeName
from workflows.pools.capacity import (
    MaxUnavailable,
    OrderRefused,
    PodsMoved,
    RollingOrder,
    check_wave,
    gpu_pods_moved,
    waves_within_budget,
)

MINUTE = dt.timedelta(minutes=1)


# ------------------------------------------------------------------ the budget as written


@pytest.mark.parametrize("written", [{"count": 1, "percent": 10}, {}])
def test_a_budget_that_is_both_or_neither_a_count_and_a_percent_says_it_must_be_exactly_one(written):
    with pytest.raises(ValueError, match="^max_unavailable is a count or a percent, exactly one$"):
        MaxUnavailable(**written)


@pytest.mark.parametrize(("written", "quoted"), [("two", "'two'"), (1.5, "1.5"), ("150%", "'150%'")])
def test_a_max_unavailable_that_cannot_be_read_is_quoted_back_as_written(written, quoted):
    with pytest.raises(ValueError) as refused:
        MaxUnavailable.parse(written)

    assert str(refused.value).endswith(f'from 0% to 100% (e.g. "25%"), not {quoted}')


@pytest.mark.parametrize(("written", "quoted"), [({"count": -1}, "-1"), ({"percent": 101}, "'101%'"),
                                               ({"percent": -5}, "'-5%'")])
def test_a_budget_out_of_range_is_refused_quoting_it(written, quoted):
    with pytest.raises(ValueError) as refused:
        MaxUnavailable(**written)

    assert str(refused.value).endswith(f'from 0% to 100% (e.g. "25%"), not {quoted}')


def test_a_budget_of_the_whole_pool_or_of_no_node_is_taken():
    assert [str(MaxUnavailable(percent=100)), str(MaxUnavailable(percent=0)), str(MaxUnavailable(count=0))] == [
        "100%", "0%", "0"]


# ------------------------------------------------------------------ overlap in time


def test_requests_that_only_touch_a_drain_in_time_are_neither_counted_nor_named(make):
    long_before = other("req-1111", names(2), start=SAT_0200 - 5 * HOUR, end=SAT_0200 - 3 * HOUR)
    ends_as_it_starts = other("req-2222", names(3), start=SAT_0200 - 2 * HOUR, end=SAT_0200)
    starts_as_it_ends = other("req-3333", names(4), start=SAT_0600, end=SAT_0600 + 2 * HOUR)

    result = check(pool_of(make), names(1, 2), max_unavailable="1",
                   concurrent=[long_before, ends_as_it_starts, starts_as_it_ends])

    assert result.concurrent == ()
    assert result.refusals[0].reason == (
        "max_unavailable: draining gpu-a-01 and gpu-a-02 would leave 2 of 4 nodes in pool train-a unavailable "
        "(none already cordoned or not Ready), but the pool allows 1 at once (max_unavailable 1). "
        "Drain at most 1 of these nodes at once.")


@pytest.mark.parametrize(("start", "end"), [(SAT_0200 - 2 * HOUR, SAT_0200 + MINUTE),
                                            (SAT_0600 - MINUTE, SAT_0600 + 2 * HOUR)])
def test_a_request_that_overlaps_a_drain_by_one_minute_is_counted_and_named(make, start, end):
    approved = other("req-2222", names(3), start=start, end=end)

    result = check(pool_of(make), names(1), max_unavailable="1", concurrent=[approved])

    assert result.concurrent == (approved,)
    assert "(none already cordoned or not Ready; up to 1 held by overlapping request req-2222)" \
        in result.refusals[0].reason


# ------------------------------------------------------------------ the worst stretch


@pytest.mark.parametrize("big_first", [True, False])
def test_the_worst_stretch_of_a_drain_decides_whether_it_comes_first_or_last(make, big_first):
    # gpu-a-02 has 4 GPUs, the others 8: 28 Ready now, 20 while gpu-a-03 is drained. For
    # one hour req-1111 holds gpu-a-01 (8 GPUs), for the other req-2222 gpu-a-02 (4): two
    # nodes out in both stretches, but 12 Ready GPUs while req-1111 holds and 16 after.
    members = pool_of(make, n2={"gpus": 4})
    big_at, small_at = (SAT_0200, SAT_0200 + HOUR) if big_first else (SAT_0200 + HOUR, SAT_0200)
    concurrent = [other("req-1111", names(1), start=big_at, end=big_at + HOUR),
                  other("req-2222", names(2), start=small_at, end=small_at + HOUR)]

    refused = check(members, names(3), max_unavailable="2", min_ready_gpus=13, concurrent=concurrent,
                    end=SAT_0200 + 2 * HOUR)
    fits = check(members, names(3), max_unavailable="2", min_ready_gpus=12, concurrent=concurrent,
                 end=SAT_0200 + 2 * HOUR)

    assert [r.rule for r in refused.refusals] == ["min_ready_gpus"]
    assert (refused.ready_gpus_during, refused.unavailable_during, refused.worst_at) == (12, 2, big_at)
    assert "would leave 12 Ready GPUs in pool train-a (of 28 now), below its floor of 13" in refused.refusals[0].reason
    assert fits.ok and fits.ready_gpus_during == 12


def test_of_equally_bad_stretches_the_verdict_names_the_first(make):
    morning = other("req-1111", names(1), start=SAT_0200, end=SAT_0200 + HOUR)
    later = other("req-2222", names(2), start=SAT_0200 + HOUR, end=SAT_0600)

    result = check(pool_of(make), names(3), max_unavailable="2", concurrent=[morning, later])

    assert result.ok and (result.unavailable_during, result.ready_gpus_during) == (2, 16)
    assert result.worst_at == SAT_0200


def test_a_request_without_waves_holds_no_node_and_no_gpu(make):
    nothing = other("req-1111")  # its plan has no waves

    # One node of four out and 24 of 32 GPUs Ready: exactly the budget and the floor.
    result = check(pool_of(make), names(1), max_unavailable="1", min_ready_gpus=24, concurrent=[nothing])

    assert result.ok, result.refusals
    assert (result.unavailable_during, result.concurrent_nodes, result.ready_gpus_during) == (1, 0, 24)
    assert not check(pool_of(make), names(1), max_unavailable="1", min_ready_gpus=25, concurrent=[nothing]).ok


def test_the_verdict_names_the_pool_nodes_span_rules_and_the_work_it_was_checked_against(make):
    approved = other("req-1111", names(1, 2), start=SAT_0200 + HOUR, end=SAT_0600 + HOUR)

    result = check(pool_of(make, count=8), names(3), max_unavailable="50%", min_ready_gpus=16, concurrent=[approved])

    assert result.ok
    assert (result.pool, result.nodes, result.start, result.end) == ("train-a", ("gpu-a-03",), SAT_0200, SAT_0600)
    assert (result.pool_size, result.max_unavailable, result.allowed_unavailable) == (8, MaxUnavailable(percent=50), 4)
    assert (result.concurrent, result.concurrent_nodes, result.worst_at) == ((approved,), 2, SAT_0200 + HOUR)
    assert (result.unavailable_during, result.ready_gpus_during, result.min_ready_gpus) == (3, 40, 16)


# ------------------------------------------------------------------ before a wave


def test_a_wave_whose_window_is_over_halts_on_the_window_rule_said_in_the_display_zone(make):
    def gate(now: dt.datetime):
        return check_wave(pool="train-a", wave=1, nodes=names(1), pool_nodes=pool_of(make), now=now,
                          window_end=SAT_0600, allowed_now=True, max_unavailable=MaxUnavailable(count=1),
                          min_ready_gpus=0, zone=ZoneInfo("Europe/Berlin"))

    over = gate(SAT_0600)

    assert (over.rule, over.over) == ("window", True)
    assert over.reason == "Wave 2 could not start before the window ended at 2026-12-05 06:00 CET"
    assert gate(SAT_0600 - MINUTE).fits


def test_a_wave_is_checked_only_until_its_window_ends(make):
    # req-1111 takes gpu-a-02 out from 06:00, when this wave's window ends.
    after = other("req-1111", names(2), start=SAT_0600, end=SAT_0600 + HOUR)
    before = other("req-1111", names(2), start=SAT_0600 - MINUTE, end=SAT_0600 + HOUR)

    assert wave_check(pool_of(make), names(1), max_unavailable="1", concurrent=[after]).fits
    assert wave_check(pool_of(make), names(1), max_unavailable="1", concurrent=[before]).rule == "max_unavailable"


# ------------------------------------------------------------------ GPU pods a change moves


def test_a_change_of_a_node_moves_only_its_running_gpu_pods_that_a_drain_can_evict(make):
    node = "gpu-a-01"
    gpus = {"nvidia.com/gpu": 1}
    mirror = make.pod(node=node, namespace="kube-system", name="mirror-gpu", owner_kind=None, gpu_requests=gpus)
    pods = [
        make.workload(node, gpus=2, name="train"),
        make.workload(node, gpus=1, name="must-finish", labels={"gpuops.io/must-finish": "true"}),
        make.pod(node=node, namespace="ml", name="bare", owner_kind=None, gpu_requests=gpus),
        make.workload(node, gpus=1, name="failed", phase="Failed"),
        make.workload(node, gpus=1, name="succeeded", phase="Succeeded"),
        make.workload(node, gpus=1, name="leaving", deleting=True),
        make.pod(node=node, namespace="ml", name="cpu-only", owner_kind="Job"),
        make.workload("gpu-a-02", gpus=1, name="elsewhere"),
        make.pod(node=node, name="dcgm-exporter", owner_kind="DaemonSet", gpu_requests=gpus),
        make.pod(node=node, namespace="kube-system", name="static-gpu", owner_kind="Node", gpu_requests=gpus),
        dataclasses.replace(mirror, annotations={ANNOTATION_MIRROR: "0f3c"}),
    ]

    moved = gpu_pods_moved(pods, node, wait_for=lambda labels: labels.get("gpuops.io/must-finish") == "true")

    assert moved == PodsMoved(waited=("ml/must-finish",), evicted=("ml/bare", "ml/train"))
    assert gpu_pods_moved(pods, node) == PodsMoved(waited=(), evicted=("ml/bare", "ml/must-finish", "ml/train"))


# ------------------------------------------------------------------ the order of a rolling change


def test_with_no_floor_given_a_change_may_take_a_pools_last_ready_gpus(make):
    members = pool_of(make, count=1)

    assert waves_within_budget(members, pool=members, budget=MaxUnavailable(count=1)) == \
        RollingOrder(canary=NodeName("gpu-a-01"), waves=())


def test_a_canary_outside_the_change_is_refused_naming_it_as_a_change(make):
    members = pool_of(make, count=3)

    with pytest.raises(OrderRefused) as refused:
        waves_within_budget(members[:2], pool=members, budget=MaxUnavailable(count=1), canary="gpu-a-03")

    assert refused.value.code == "canary-not-in-scope"
    assert refused.value.reason == ("the pool's canary node gpu-a-03 is not among the nodes this change changes "
                                    "(gpu-a-01 and gpu-a-02)")
    assert str(refused.value) == refused.value.reason


@pytest.mark.parametrize(("floor", "waves"), [
    (8, (("gpu-a-02", "gpu-a-03", "gpu-a-04"),)),  # 32 - 24 leaves exactly 8
    (9, (("gpu-a-02", "gpu-a-03"), ("gpu-a-04",))),  # one GPU short: gpu-a-04 waits
])
def test_the_floor_cuts_a_rolling_wave_at_exactly_the_gpu_that_would_break_it(make, floor, waves):
    members = pool_of(make, count=4)

    order = waves_within_budget(members, pool=members, budget=MaxUnavailable(percent=100), min_ready_gpus=floor)

    assert order == RollingOrder(canary=NodeName("gpu-a-01"), waves=waves)


def test_a_node_a_change_gives_more_gpus_counts_them_from_the_wave_after_its_own(make):
    # gpu-a-01's 4 GPUs come back as 28 MIG slices: 20 Ready now, 44 after the canary.
    members = pool_of(make, count=3, n1={"gpus": 4})

    order = waves_within_budget(members, pool=members, budget=MaxUnavailable(count=1), min_ready_gpus=13,
                                ready_after={"gpu-a-01": 28})

    assert order == RollingOrder(canary=NodeName("gpu-a-01"), waves=((NodeName("gpu-a-02"),), (NodeName("gpu-a-03"),)))
    # Without the slices, gpu-a-02 alone would leave 12 of 20: refused before any wave.
    with pytest.raises(OrderRefused) as refused:
        waves_within_budget(members, pool=members, budget=MaxUnavailable(count=1), min_ready_gpus=13)
    assert refused.value.code == "min-ready-gpus"
    assert refused.value.reason == ("taking gpu-a-02 out (8 Ready GPUs) would leave the pool 12 of its 20 Ready GPUs, "
                                    "below its min_ready_gpus of 13: lower the floor or add capacity first")
