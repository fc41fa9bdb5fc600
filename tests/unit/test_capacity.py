"""Capacity gates over plain fleet values: how many nodes of a pool may be out at once
(nodes already cordoned or NotReady included), the Ready-GPU floor, and overlapping
requests counted together."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest

from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.pools.capacity import (
    ConcurrentWork,
    MaxUnavailable,
    check_drain,
    check_wave,
    concurrent_work,
    pool_nodes,
)

UTC = dt.timezone.utc
SAT_0200 = dt.datetime(2026, 12, 5, 1, 0, tzinfo=UTC)  # 02:00 Europe/Berlin
SAT_0600 = dt.datetime(2026, 12, 5, 5, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)


def names(*numbers: int) -> list[NodeName]:
    return [NodeName(f"gpu-a-{n:02d}") for n in numbers]


def pool_of(make, count: int = 4, **changes_by_number):
    """Nodes gpu-a-01.. of pool train-a, 8 GPUs each; `changes_by_number` maps a node
    number (as "n3") to builder arguments."""
    nodes = [make.node(f"gpu-a-{n:02d}", **changes_by_number.get(f"n{n}", {}))
             for n in range(1, count + 1)]
    return pool_nodes(make.fleet(nodes), "train-a")


def check(members, nodes, *, max_unavailable="1", min_ready_gpus=0, concurrent=(),
          start=SAT_0200, end=SAT_0600):
    return check_drain(pool="train-a", pool_nodes=members, nodes=nodes, start=start, end=end,
                       max_unavailable=MaxUnavailable.parse(max_unavailable),
                       min_ready_gpus=min_ready_gpus, concurrent=concurrent)


# ------------------------------------------------------------------ the budget


@pytest.mark.parametrize(
    ("written", "pool_size", "allowed"),
    [
        (2, 10, 2),
        ("3", 10, 3),
        ("25%", 8, 2),
        ("25%", 9, 2),  # 2.25 rounds down
        ("25%", 3, 1),  # 0.75 rounds down to 0, but a percent above 0 allows at least 1
        ("10%", 1, 1),
        ("0%", 50, 0),  # 0% freezes the pool
        (0, 50, 0),
        ("100%", 7, 7),
    ],
)
def test_max_unavailable_is_a_count_or_a_percent_rounded_down_but_at_least_one(written, pool_size, allowed):
    assert MaxUnavailable.parse(written).allowed(pool_size) == allowed


@pytest.mark.parametrize("written", ["x%", "150%", -1, "two", 1.5, None, True])
def test_a_max_unavailable_that_is_neither_count_nor_percent_is_refused(written):
    with pytest.raises(ValueError, match='a count of nodes .* or a percent'):
        MaxUnavailable.parse(written)


def test_a_drain_within_the_budget_passes(make):
    result = check(pool_of(make), names(1), max_unavailable="1")

    assert result.ok
    assert (result.unavailable_during, result.allowed_unavailable) == (1, 1)


def test_a_human_cordoned_node_in_the_pool_counts_against_max_unavailable(make):
    members = pool_of(make, n4={"unschedulable": True})

    result = check(members, names(1), max_unavailable="1")

    assert not result.ok
    assert [r.rule for r in result.refusals] == ["max_unavailable"]
    assert result.already_unavailable == ("gpu-a-04",)
    assert result.refusals[0].reason == (
        "max_unavailable: draining gpu-a-01 would leave 2 of 4 nodes in pool train-a unavailable "
        "(1 already cordoned or not Ready: gpu-a-04), but the pool allows 1 at once "
        "(max_unavailable 1). This node cannot be out at this time.")


def test_draining_a_node_that_is_already_cordoned_costs_nothing_more(make):
    members = pool_of(make, n4={"unschedulable": True})

    result = check(members, names(4), max_unavailable="1")

    assert result.ok and result.unavailable_during == 1


def test_not_ready_and_unknown_nodes_count_as_unavailable(make):
    members = pool_of(make, n3={"ready": False}, n4={"ready": None})

    result = check(members, names(1), max_unavailable="50%")

    assert result.already_unavailable == ("gpu-a-03", "gpu-a-04")
    assert (result.unavailable_during, result.allowed_unavailable) == (3, 2)
    assert not result.ok


def test_a_refusal_says_how_many_of_the_nodes_would_fit_at_once(make):
    result = check(pool_of(make, count=6), names(1, 2, 3, 4), max_unavailable="2")

    assert result.most_at_once == 2
    assert result.refusals[0].reason.endswith("Drain at most 2 of these nodes at once.")
    assert "would leave 4 of 6 nodes in pool train-a unavailable" in result.refusals[0].reason


def test_a_node_the_inventory_does_not_know_counts_as_unavailable(make):
    result = check(pool_of(make), [NodeName("gpu-a-99")], max_unavailable="1")

    assert result.unavailable_during == 1
    assert not check(pool_of(make), [NodeName("gpu-a-99"), *names(1)], max_unavailable="1").ok


# ------------------------------------------------------------------ the GPU floor


def test_a_drain_that_breaks_min_ready_gpus_is_refused_with_the_numbers(make):
    result = check(pool_of(make, count=3), names(1), max_unavailable="3", min_ready_gpus=20)

    assert [r.rule for r in result.refusals] == ["min_ready_gpus"]
    assert (result.ready_gpus_now, result.ready_gpus_during) == (24, 16)
    assert result.refusals[0].reason == (
        "min_ready_gpus: draining gpu-a-01 would leave 16 Ready GPUs in pool train-a (of 24 now), "
        "below its floor of 20 (min_ready_gpus). This node cannot be out at this time.")


def test_the_floor_counts_only_gpus_on_ready_schedulable_nodes(make):
    members = pool_of(make, count=3, n3={"unschedulable": True},
                      n2={"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "6"}})

    result = check(members, names(1), max_unavailable="3", min_ready_gpus=6)

    # gpu-a-03 is cordoned (0), gpu-a-02 advertises 6 of 8: 14 Ready now, 6 during.
    assert (result.ready_gpus_now, result.ready_gpus_during) == (14, 6)
    assert result.ok


def test_the_floor_limits_how_many_nodes_may_go_at_once(make):
    result = check(pool_of(make, count=4), names(1, 2, 3), max_unavailable="4", min_ready_gpus=16)

    assert result.most_at_once == 2
    assert "would leave 8 Ready GPUs" in result.refusals[0].reason
    assert result.refusals[0].reason.endswith("Drain at most 2 of these nodes at once.")


# ------------------------------------------------------------------ overlapping requests


def other(label: str, *waves: list[NodeName], start=SAT_0200, end=SAT_0600) -> ConcurrentWork:
    return ConcurrentWork(label=label, start=start, end=end, waves=tuple(tuple(w) for w in waves))


def test_two_overlapping_drains_together_exceeding_max_unavailable_are_refused(make):
    approved = other("req-1111", names(1, 2))

    result = check(pool_of(make), names(3), max_unavailable="2", concurrent=[approved],
                   start=SAT_0200 + HOUR, end=SAT_0200 + 2 * HOUR)

    assert not result.ok
    assert result.unavailable_during == 3
    assert "up to 2 held by overlapping request req-1111" in result.refusals[0].reason


def test_drains_that_only_touch_in_time_do_not_add_up(make):
    earlier = other("req-1111", names(1, 2), start=SAT_0200 - 2 * HOUR, end=SAT_0200)

    assert check(pool_of(make), names(3), max_unavailable="2", concurrent=[earlier]).ok


def test_another_request_holds_one_wave_at_a_time_so_its_largest_wave_counts(make):
    one_by_one = other("req-1111", names(1), names(2))

    result = check(pool_of(make), names(3), max_unavailable="2", concurrent=[one_by_one])

    assert result.ok and result.unavailable_during == 2


def test_requests_that_overlap_the_drain_but_not_each_other_are_not_added_together(make):
    morning = other("req-1111", names(1), start=SAT_0200, end=SAT_0200 + 2 * HOUR)
    later = other("req-2222", names(2), start=SAT_0200 + 2 * HOUR, end=SAT_0600)

    result = check(pool_of(make), names(3), max_unavailable="2", concurrent=[morning, later])

    assert result.ok and result.unavailable_during == 2


def test_overlapping_requests_together_may_not_break_the_floor(make):
    approved = other("req-1111", names(1))

    result = check(pool_of(make, count=3), names(2), max_unavailable="3", min_ready_gpus=16,
                   concurrent=[approved])

    assert [r.rule for r in result.refusals] == ["min_ready_gpus"]
    assert "while req-1111 also holds nodes would leave 8 Ready GPUs" in result.refusals[0].reason


def test_a_request_without_an_end_holds_its_nodes_forever(make):
    open_ended = other("req-1111", names(1), start=SAT_0200 - 24 * HOUR, end=None)

    result = check(pool_of(make), names(2), max_unavailable="1", concurrent=[open_ended],
                   start=SAT_0200 + 30 * 24 * HOUR, end=None)

    assert not result.ok


@dataclass(frozen=True)
class OpenRequest:
    id: str
    pool: str
    state: str
    window_start: dt.datetime | None
    window_end: dt.datetime | None
    plan: Plan


def drain_plan(pool: str, *waves: list[NodeName]) -> Plan:
    return Plan(kind="drain", pool=pool, created_for="U0ADA", summary=PlanSummary(),
                waves=tuple(Wave(i, tuple(w), tuple(NodeStep("cordon", n) for n in w))
                            for i, w in enumerate(waves)))


def test_only_approved_scheduled_and_running_requests_on_the_pool_count():
    def request(id_, state, pool="train-a"):
        return OpenRequest(id_, pool, state, SAT_0200, SAT_0600, drain_plan(pool, names(1), names(2)))

    found = concurrent_work(
        [request("req-a", "approved"), request("req-b", "scheduled"), request("req-c", "running"),
         request("req-d", "pending"), request("req-e", "approved", pool="serve-b"),
         request("req-f", "running")],
        pool="train-a", exclude="req-f")

    assert [w.label for w in found] == ["req-a", "req-b", "req-c"]
    assert found[0].waves == (("gpu-a-01",), ("gpu-a-02",))
    assert (found[0].start, found[0].end) == (SAT_0200, SAT_0600)


# ------------------------------------------------------------------ before a wave


def wave_check(members, nodes, *, now=SAT_0200, end=SAT_0600, allowed_now=True, busy=None, max_unavailable="2",
               min_ready_gpus=0, concurrent=(), taken_over=frozenset()):
    return check_wave(pool="train-a", wave=1, nodes=nodes, pool_nodes=members, now=now, window_end=end,
                      allowed_now=allowed_now, max_unavailable=MaxUnavailable.parse(max_unavailable),
                      min_ready_gpus=min_ready_gpus, concurrent=concurrent, busy=busy, taken_over=taken_over)


def test_a_rollbacks_wave_never_waits_on_the_cordons_it_takes_over_from_the_run_it_undoes(make):
    # The halted run left gpu-a-03 and gpu-a-04 cordoned; the rollback takes both over.
    members = pool_of(make, n3={"unschedulable": True}, n4={"unschedulable": True})
    assert wave_check(members, names(1), max_unavailable="1").rule == "max_unavailable"

    gate = wave_check(members, names(1), max_unavailable="1", min_ready_gpus=24,
                      taken_over={NodeName("gpu-a-03"), NodeName("gpu-a-04")})

    assert gate.fits, gate.reason
    # Another cordon (a person's) still counts, taken over or not for the others.
    members = pool_of(make, n2={"unschedulable": True}, n4={"unschedulable": True})
    held = wave_check(members, names(1), max_unavailable="1", taken_over={NodeName("gpu-a-04")})
    assert held.rule == "max_unavailable" and "gpu-a-02" in (held.reason or "")
    assert "gpu-a-04" not in (held.reason or "")


def test_a_wave_that_fitted_when_approved_waits_once_a_person_cordons_another_node(make):
    assert wave_check(pool_of(make), names(1, 2)).fits
    members = pool_of(make, n4={"unschedulable": True})

    gate = wave_check(members, names(1, 2))

    assert not gate.fits and not gate.over and gate.rule == "max_unavailable"
    assert gate.reason is not None and gate.reason.startswith("Wave 2 waits")
    assert "would leave 3 of 4 nodes" in gate.reason and "gpu-a-04" in gate.reason
    assert "halts at the window's end" in gate.reason


def test_a_wave_waits_for_the_gpu_floor_outside_the_pools_windows_and_for_nodes_another_run_holds(make):
    assert wave_check(pool_of(make), names(1, 2), min_ready_gpus=24).rule == "min_ready_gpus"
    outside = wave_check(pool_of(make), names(1), allowed_now=False)
    assert (outside.rule, outside.over) == ("window", False) and "outside its windows" in (outside.reason or "")
    taken = wave_check(pool_of(make), names(1, 2), busy={NodeName("gpu-a-02"): "run-9f1e", NodeName("gpu-a-03"): "run-1"})
    assert taken.rule == "busy" and taken.reason == "Wave 2 waits: another unfinished run holds gpu-a-02 (in run-9f1e)"


def test_a_wave_still_waiting_when_the_window_ends_is_over(make):
    gate = wave_check(pool_of(make), names(1), now=SAT_0600)
    assert gate.over and gate.reason == "Wave 2 could not start before the window ended at 2026-12-05 05:00 UTC"
    # An open-ended drain (no end) is never over by time.
    assert wave_check(pool_of(make), names(1), now=SAT_0600 + HOUR * 100, end=None).fits
