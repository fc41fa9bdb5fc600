"""What a drain ask means before any policy gate: which node or pool its words name and
when it starts. This file pins:

- a word is read as a GPU node, a pool (`pool=<name>`, any case, only a pool) or neither;
  a configured pool with no nodes and a labelled pool missing from the configuration are
  still pools, refused for what they are (empty, unconfigured), not as unknown names;
- an ask that names nothing, or names an unknown node or pool (as the drain form sends it,
  without the grammar's screening), is refused with the closest names: at most three, and
  for `pool=` only pools, from the configuration and the cluster's labels alike;
- after the targets, `pool=<anything>` is always refused, and a word only loosely like a
  node name starts the reason;
- times are shown in the zone the person wrote, else the pool's, else UTC; a time at this
  very moment is not in the past; naive times are a programming error naming drains;
- `next-window` takes a window that starts right now, one exactly as long as the drain,
  and one exactly four weeks ahead (a window lengthened by the clock going back), but
  nothing later; a pool without windows, or whose windows are all too short, is refused
  naming the pool;
- a capacity refusal carries its check with the numbers it refused on.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from tests.unit import test_drain_plan as drains
from tests.unit.test_drain_plan import BERLIN, HOUR, POOLS, UTC, berlin, parse, refusal
from workflows.config import GpuopsConfig
from workflows.drain.plan import DrainAsk, DrainRefused, DrainRequestError, drain_spec, target_kind

# The drain plans' fleet and clock (pytest finds fixtures by their name here).
cluster = drains.cluster
now = drains.now

NEW_YORK = ZoneInfo("America/New_York")
# A configured pool no node is labelled into.
SPARE = {"spare-d": {"kind": "training", "windows": "always"}}
# Sundays 01:00-04:00 in Berlin: 3h, except on the night the clocks go back (25 October
# 2026), when the same wall-clock window lasts 4h.
LATE = {"late-d": {"kind": "training", "windows": [{"days": ["sun"], "start": "01:00", "end": "04:00",
                                                    "timezone": "Europe/Berlin"}]}}


def pools(**extra):
    return GpuopsConfig.model_validate({"pools": {**POOLS, **SPARE, **extra}}).pools


def spec(ask: DrainAsk, cluster, now, **extra):
    return drain_spec(ask, fleet=cluster.fleet, pools=pools(**extra), now=now)


def refused_ask(ask: DrainAsk, cluster, now, error=DrainRequestError):
    with pytest.raises(error) as refused:
        spec(ask, cluster, now)
    return refused.value


# ------------------------------------------------------------------ which node or pool


@pytest.mark.parametrize(
    ("word", "kind"),
    [
        ("gpu-a-01", "node"),
        ("train-a", "pool"),
        ("pool=train-a", "pool"),
        ("POOL=serve-b", "pool"),
        ("pool=gpu-a-01", None),  # pool= names only a pool
        ("spare-d", "pool"),  # configured, no nodes
        ("lab-c", "pool"),  # labelled, not configured
        ("unpooled", None),
        ("pool=unpooled", None),
        ("gpu-x-01", None),
    ],
)
def test_a_word_is_read_as_a_node_a_pool_or_neither(cluster, word, kind):
    assert target_kind(word, fleet=cluster.fleet, pools=pools()) == kind


@pytest.mark.parametrize(
    ("targets", "code", "says"),
    [
        ((), "missing-target", "Say which nodes or pool to drain."),
        (("gpu-a-0x",), "unknown-target",
         "There is no GPU node or pool named gpu-a-0x; did you mean gpu-a-04 or gpu-a-03 or gpu-a-02?"),
        # Node names are no suggestion for a pool.
        (("pool=gpu-a-0",), "unknown-target",
         "There is no pool named gpu-a-0; /gpu status lists the pools and nodes."),
        # A pool only the cluster's labels know is suggested too.
        (("pool=lab-d",), "unknown-target", "There is no pool named lab-d; did you mean lab-c?"),
        (("gpu-a-01", "Pool=train-b"), "unknown-target", "There is no pool named train-b; did you mean train-a?"),
        (("spare-d",), "empty-pool", "Pool spare-d has no GPU nodes right now, so there is nothing to drain."),
        (("pool=spare-d",), "empty-pool", "Pool spare-d has no GPU nodes right now, so there is nothing to drain."),
        (("lab-c",), "unconfigured-pool", "Pool lab-c is not in the gpuops configuration, so it has no drain "
                                          "policy; add it under pools: with its windows to drain it."),
    ],
)
def test_an_ask_from_the_form_naming_nothing_known_is_refused_with_the_closest_names(cluster, now, targets,
                                                                                      code, says):
    error = refused_ask(DrainAsk(targets=targets), cluster, now)

    assert (error.code, error.reason, str(error)) == (code, says, says)


def test_pool_equals_after_the_targets_is_refused_and_a_word_loosely_like_a_node_starts_the_reason(
        cluster, now):
    with pytest.raises(DrainRequestError) as refused:
        parse("gpu-a-01 pool=zzz for 1h", cluster, now)

    assert refused.value.code == "unknown-target"
    assert refused.value.reason == "There is no pool named zzz; /gpu status lists the pools and nodes."
    # "gpu-fan" is two thirds like gpu-a-01: not enough to be taken for a misspelt node.
    read = parse("gpu-a-01 gpu-fan swap", cluster, now)
    assert (read.nodes, read.reason) == (("gpu-a-01",), "gpu-fan swap")


# ------------------------------------------------------------------ when


@pytest.mark.parametrize(
    ("target", "zone", "says"),
    [
        ("gpu-a-01", None, "Sat 2026-11-28 02:00 CET is in the past (it is now Wed 2026-12-02 11:00 CET)"),
        ("gpu-a-01", NEW_YORK, "Fri 2026-11-27 20:00 EST is in the past (it is now Wed 2026-12-02 05:00 EST)"),
        ("gpu-b-01", None, "Sat 2026-11-28 01:00 UTC is in the past (it is now Wed 2026-12-02 10:00 UTC)"),
    ],
)
def test_times_are_shown_in_the_zone_the_person_wrote_else_the_pools_else_utc(cluster, now, target, zone, says):
    error = refused_ask(DrainAsk(targets=(target,), start_from="at", at=berlin("2026-11-28 02:00"), zone=zone,
                                 duration=HOUR), cluster, now)

    assert error.code == "past-time"
    assert error.reason == f"{says}; pick a later time, or next-window."


def test_a_drain_asked_for_this_very_moment_is_not_in_the_past(cluster, now):
    asked = spec(DrainAsk(targets=("gpu-b-01",), start_from="at", at=now, duration=HOUR), cluster, now)

    assert (asked.start, asked.end, asked.start_from) == (now, now + HOUR, "at")


def test_naive_times_are_a_programming_error_that_names_drains(cluster, now):
    naive = dt.datetime(2026, 12, 5, 2, 0)

    with pytest.raises(ValueError) as no_zone_now:
        spec(DrainAsk(targets=("gpu-a-01",)), cluster, naive)
    with pytest.raises(ValueError) as no_zone_at:
        spec(DrainAsk(targets=("gpu-a-01",), start_from="at", at=naive), cluster, now)
    with pytest.raises(ValueError) as no_time:
        spec(DrainAsk(targets=("gpu-a-01",), start_from="at"), cluster, now)

    assert str(no_zone_now.value) == "drains need an aware datetime, not 2026-12-05T02:00:00"
    assert str(no_zone_at.value) == "drains need an aware datetime, not 2026-12-05T02:00:00"
    assert str(no_time.value) == "a drain asked for `at` a time needs that time"


# ------------------------------------------------------------------ the next window


def test_next_window_takes_a_window_starting_right_now_that_is_exactly_as_long_as_the_drain(cluster):
    saturday = berlin("2026-12-05 02:00")

    asked = spec(DrainAsk(targets=("gpu-a-01",), start_from="next-window", duration=4 * HOUR), cluster, saturday)

    assert (asked.start, asked.end, asked.zone) == (saturday, berlin("2026-12-05 06:00"), BERLIN)


def test_next_window_looks_exactly_four_weeks_ahead_and_no_further(make):
    late = drains.Cluster(fleet=make.fleet([make.node("gpu-d-01", pool="late-d")]), pods_by_node={})
    # The window that opens at now: 3h, as are the next three Sundays; four weeks on the
    # clocks go back and the same window lasts 4h.
    now = dt.datetime(2026, 9, 26, 23, 0, tzinfo=UTC)
    ask = DrainAsk(targets=("gpu-d-01",), start_from="next-window", duration=4 * HOUR)

    asked = spec(ask, late, now, **LATE)
    with pytest.raises(DrainRefused) as refused:
        spec(ask, late, now - HOUR, **LATE)

    assert (asked.start, asked.end) == (dt.datetime(2026, 10, 24, 23, 0, tzinfo=UTC),
                                        dt.datetime(2026, 10, 25, 3, 0, tzinfo=UTC))
    assert (refused.value.code, refused.value.reason) == (
        "window-too-short", "windows: no window of pool late-d in the next 4 weeks is long enough for a 4h drain "
                            "(the longest is 3h); ask for less time with `for`.")


@pytest.mark.parametrize(
    ("target", "duration", "code", "says"),
    [
        ("gpu-n-01", None, "windows",
         'windows: pool no-win has no maintenance windows configured, so gpuops allows no drain there. Add '
         'windows to the pool in the configuration, e.g. windows: [{days: [sat], start: "02:00", end: "06:00", '
         "timezone: Europe/Berlin}], or write windows: always to allow drains at any time."),
        ("gpu-a-01", 5 * HOUR, "window-too-short",
         "windows: no window of pool train-a in the next 4 weeks is long enough for a 5h drain (the longest is "
         "4h); ask for less time with `for`."),
    ],
)
def test_next_window_on_a_pool_with_no_window_that_fits_is_refused_naming_the_pool(cluster, now, target,
                                                                                   duration, code, says):
    error = refused_ask(DrainAsk(targets=(target,), start_from="next-window", duration=duration), cluster, now,
                        error=DrainRefused)

    assert (error.code, error.reason, error.fits_at, error.check) == (code, says, None, None)


# ------------------------------------------------------------------ a capacity refusal


def test_a_capacity_refusal_carries_the_check_it_refused_on(cluster, now):
    refused = refusal("gpu-a-01 at sat 02:00 for 1h", cluster, now, cfg=drains.config(train_a={"min_ready_gpus": 30}))

    check = refused.check
    assert (check.pool, check.nodes, check.start, check.end) == (
        "train-a", ("gpu-a-01",), berlin("2026-12-05 02:00"), berlin("2026-12-05 03:00"))
    assert (check.ready_gpus_now, check.ready_gpus_during, check.min_ready_gpus) == (32, 24, 30)
    assert [r.rule for r in check.refusals] == ["min_ready_gpus"]
