"""A drain's plan says how long its run takes at the pool's pace, the hold included:
how long a wave takes to drain its nodes and to bring them back, until when they are held
(the window's end, or until someone says `/gpu drain done`), and whether its waves start
inside the window. The budgets a drain meets are named once, by the drain's own notes."""

from __future__ import annotations

import datetime as dt

from tests.unit import test_drain_commands as commands
from tests.unit import test_drain_plan as drains
from tests.unit.test_drain_plan import build_cluster, config, plan
from tests.unit.test_preflight_pace_commands import _a_past_run as a_past_run
from workflows.drain.plan import extended_plan
from workflows.preflight.facts import Pace, PastStep

# The drain plans' fleet and clock (pytest finds fixtures by their name here).
cluster = drains.cluster
now = drains.now

MIN = dt.timedelta(minutes=1)


def _timing(drain):
    (note,) = [n for n in drain.plan.summary.preflight if n.check == "duration"]
    return note


def test_a_timed_drain_says_by_when_its_nodes_are_drained_and_that_they_are_held_until_its_end(cluster, now):
    # Saturday 02:00 in Berlin (01:00 UTC) for 2h; gpu-a-04 runs nothing wait_for waits for.
    timing = _timing(plan("gpu-a-04 at sat 02:00 for 2h", cluster, now))

    assert (timing.code, timing.severity) == ("fits-window", "info")
    assert timing.sentence == (
        "A wave takes at most 30m to drain its nodes, and 10m after the hold to validate and uncordon them, at the "
        "configured timeouts (1 wave, the slowest node gpu-a-04; no past run of train-a to learn its pace from); "
        "its nodes are drained by 2026-12-05 01:30 UTC and held until the window ends (2026-12-05 03:00 UTC), then "
        "validated and uncordoned")


def test_a_drain_whose_jobs_may_outlast_it_warns_that_its_nodes_are_held_for_no_time(cluster, now):
    # gpu-a-01 runs a pod the pool's wait_for waits up to 6h for, longer than the 2h asked for.
    timing = _timing(plan("gpu-a-01 at sat 02:00 for 2h", cluster, now))

    assert (timing.code, timing.severity) == ("outgrows-window", "warning")
    assert timing.sentence.startswith("A wave takes at most 6h30m to drain its nodes")
    assert timing.sentence.endswith(
        "draining its nodes may take until 2026-12-05 07:30 UTC, after its window ends (2026-12-05 03:00 UTC): "
        "they are held for no time at all (ask for a longer drain)")


def test_a_drain_in_two_waves_held_until_its_window_ends_warns_that_the_second_wave_will_not_start(cluster, now):
    drain = plan("train-a at sat 02:00", cluster, now)
    timing = _timing(drain)

    assert len(drain.plan.waves) == 2
    assert (timing.code, timing.severity) == ("outgrows-window", "warning")
    assert ("the first wave's nodes are held until the window ends (2026-12-05 05:00 UTC), so unless someone says "
            "`/gpu drain done` before then, only 1 wave of 2 starts inside it and the run halts before wave 2"
            ) in timing.sentence


def test_a_drain_that_starts_once_approved_says_by_when_it_must_start(cluster, now):
    # serve-b's windows are always open: `for 2h` from now, approved whenever.
    timing = _timing(plan("gpu-b-01 for 2h", cluster, now))

    assert (timing.code, timing.severity) == ("starts-once-approved", "info")
    assert timing.sentence.endswith(
        "it starts once approved, and its nodes are drained before its window ends (2026-12-02 12:00 UTC) if it "
        "starts by 2026-12-02 11:30 UTC")


def test_an_open_ended_drain_says_it_ends_only_when_someone_says_drain_done_and_its_limit(cluster, now):
    plain = _timing(plan("gpu-b-01 disk swap", cluster, now))
    limited = _timing(plan("gpu-b-01 disk swap", cluster, now, cfg=config(serve_b={"open_drain_max": "3d"})))

    assert (plain.code, plain.severity) == ("held-until-done", "info")
    assert plain.sentence.endswith("its nodes stay drained until someone says `/gpu drain done`: the run ends only then")
    assert limited.sentence.endswith(
        "its nodes stay drained until someone says `/gpu drain done`, or for at most 3d (the pool's open_drain_max): "
        "the run ends only then")


def test_a_drain_is_timed_at_its_pools_pace_when_the_pool_has_run(make, now):
    cluster = build_cluster(make)
    past = [PastStep(node="gpu-a-04", kind="evict", took=4 * MIN), PastStep(node="gpu-a-03", kind="evict", took=8 * MIN),
            PastStep(node="gpu-a-04", kind="validate", took=3 * MIN)]
    asked: list[str] = []

    def pace(pool: str) -> Pace:
        asked.append(pool)
        return Pace(steps=past, parallel=2)

    spec = drains.parse("gpu-a-04 at sat 02:00 for 2h", cluster, now)
    drain = drains.plan_drain(spec, fleet=cluster.fleet, pods_by_node=cluster.pods_by_node,
                              policy=config().pools["train-a"], open_requests=(), now=now, requested_by="U0ADA",
                              past_runs=pace)

    assert asked == ["train-a"]
    assert _timing(drain).sentence.startswith(
        "A wave takes about 4m to drain its nodes, and 3m after the hold to validate and uncordon them, at the pace "
        "of train-a's last runs (1 wave, the slowest node gpu-a-04); its nodes are drained by 2026-12-05 01:04 UTC")


def test_a_drains_budget_is_named_once_by_its_own_notes_and_not_again_by_the_pre_flight(cluster, now):
    drain = plan("gpu-a-02 at sat 02:00", cluster, now)

    assert [n.check for n in drain.plan.summary.preflight] == ["duration", "gates"]
    said = [*drain.plan.summary.notes, *(n.sentence for n in drain.plan.summary.preflight)]
    assert sum("serve/api-pdb" in line for line in said) == 1


def test_drain_asked_for_with_the_command_is_timed_at_the_pace_of_the_pools_last_runs(make, tmp_path, now):
    services = commands.build(make, tmp_path, commands.config())
    asked = "/gpu drain gpu-a-03 at sat 03:00 for 2h NIC swap"
    first = commands.section(commands.run(services, "U0ALICE", asked, now), "Pre-flight").bullets
    assert first[0].startswith("A wave takes at most 30m to drain its nodes, and 10m after the hold")

    a_past_run(services.database, pool="train-a", at=now - dt.timedelta(days=7),
               took={"cordon": 0, "evict": 6, "validate": 2, "uncordon": 0})
    again = commands.section(commands.run(services, "U0ALICE", asked, now), "Pre-flight").bullets

    assert again[0].startswith(
        "A wave takes about 6m to drain its nodes, and 2m after the hold to validate and uncordon them, at the pace "
        "of train-a's last runs (1 wave, the slowest node gpu-a-03)")
    services.database.close()  # type: ignore[union-attr]


def test_a_running_drain_held_longer_drops_the_timing_that_named_its_old_end(cluster, now):
    drain = plan("gpu-a-04 at sat 02:00 for 2h", cluster, now)
    later = drain.plan.summary.window_end + dt.timedelta(hours=1)

    held_longer = extended_plan(drain.plan, later)

    assert [n.check for n in drain.plan.summary.preflight] == ["duration", "gates"]
    assert [n.check for n in held_longer.summary.preflight] == ["gates"]
    assert (held_longer.summary.window_end, held_longer.summary.notes) == (later, drain.plan.summary.notes)
