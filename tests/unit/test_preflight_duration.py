"""Pre-flight: how long a run takes at its pool's pace (waves x the slowest node's
expected steps, from the pool's last runs when there are any, else from the plan's
timeouts) and whether that fits its window."""

from __future__ import annotations

import datetime as dt

from storage import requests, runs, steps
from storage.database import open_database
from storage.steps import NewStep
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.preflight.duration import duration_note, duration_notes, estimate, past_steps, refusing_note
from workflows.config import GpuopsConfig
from workflows.preflight.facts import PastStep, PlanFacts
from workflows.requests.service import RequestService

START = dt.datetime(2026, 12, 12, 1, 0, tzinfo=dt.timezone.utc)
MIN = dt.timedelta(minutes=1)


def _node_steps(node: str, *, canary: bool = False) -> list[NodeStep]:
    n = NodeName(node)
    found = [NodeStep("cordon", n, {"was_cordoned": False}),
             NodeStep("evict", n, {"scope": "gpu", "pdb_timeout_s": 1800}),
             NodeStep("driver", n, {"version": "580.105.08", "timeout_s": 600}),
             NodeStep("validate", n, {"timeout_s": 600}),
             NodeStep("uncordon", n, {"leave_cordoned": False})]
    if canary:
        found += [NodeStep("hold", n, {"seconds": 600}),
                  NodeStep("driver-version", n, {"object": "ClusterPolicy", "name": "cp", "version": "1",
                                                 "set_back": True, "on_failure": True, "timeout_s": 3600})]
    return found


def _plan(groups: list[list[str]], *, window: dt.timedelta | None = dt.timedelta(hours=4)) -> Plan:
    waves = tuple(Wave(i, tuple(NodeName(n) for n in nodes),
                       tuple(s for n in nodes for s in _node_steps(n, canary=i == 0)))
                  for i, nodes in enumerate(groups))
    summary = PlanSummary(window_start=START, window_end=START + window if window else None)
    return Plan(kind="upgrade", pool="serving-a", waves=waves, summary=summary, created_for="U0ALICE")


def _past(node: str, **minutes: float) -> list[PastStep]:
    return [PastStep(node=node, kind=kind, took=m * MIN) for kind, m in minutes.items()]


def test_without_past_runs_the_run_takes_at_most_its_timeouts_and_the_soak_and_says_so():
    plan = _plan([["n1"], ["n2"], ["n3"]], window=dt.timedelta(hours=8))

    found = estimate(plan, [])

    # Canary: 30m + 10m + 10m + the 10m soak; the set-back runs only on failure.
    assert found.waves == (60 * MIN, 50 * MIN, 50 * MIN)
    assert (found.source, found.slowest, found.fits) == ("timeouts", "n1", True)
    assert duration_note(plan, found) == (
        "The run takes at most 2h40m at the configured timeouts (3 waves, the slowest node n1 1h; no past run of "
        "serving-a to learn its pace from); it fits the window (8h, 5h20m to spare)")


def test_past_runs_set_the_pace_per_node_first_and_the_pools_median_otherwise():
    plan = _plan([["n1"], ["n2"], ["n3"]])
    past = (_past("n1", evict=2, driver=6, validate=3) + _past("n2", evict=4, driver=8, validate=3)
            + _past("n3", evict=20, driver=9, validate=5) + _past("n9", cordon=1, uncordon=1))

    found = estimate(plan, past)

    # n3 is slow on its own record; the soak of the canary stays what the plan holds for.
    assert found.waves == (2 * MIN + 6 * MIN + 3 * MIN + 1 * MIN + 1 * MIN + 10 * MIN,
                           1 * MIN + 4 * MIN + 8 * MIN + 3 * MIN + 1 * MIN,
                           1 * MIN + 20 * MIN + 9 * MIN + 5 * MIN + 1 * MIN)
    assert (found.source, found.slowest, found.slowest_takes) == ("runs", "n3", 36 * MIN)
    assert duration_note(plan, found).startswith(
        "The run takes about 1h16m at the pace of serving-a's last runs (3 waves, the slowest node n3 36m)")


def test_a_step_kind_no_past_run_finished_is_timed_by_its_timeout_and_named():
    plan = _plan([["n1"], ["n2"]])

    found = estimate(plan, _past("n1", evict=2, validate=3))

    assert (found.source, found.unseen) == ("mixed", ("driver",))
    assert "(driver at their configured timeouts: none finished in those runs)" in duration_note(plan, found)


def test_a_run_longer_than_its_window_says_how_many_waves_start_inside_it_and_where_it_halts():
    plan = _plan([[f"n{i}"] for i in range(1, 9)])  # 8 waves of about 50m at the timeouts

    found = estimate(plan, [])

    assert not found.fits and found.waves_started == 5
    assert duration_note(plan, found).endswith(
        "it does not fit the window (4h): 5 waves of 8 start inside it, and the run halts before wave 6 (ask for "
        "a longer window, fewer nodes, or a larger max_unavailable)")
    # Every wave starting inside the window, the last ending after it: said as such.
    assert estimate(_plan([["n1"], ["n2"], ["n3"], ["n4"], ["n5"]]), []).waves_started == 5
    assert "every wave starts inside it, the last ends after it" in duration_note(
        _plan([["n1"], ["n2"], ["n3"], ["n4"], ["n5"]]), estimate(_plan([["n1"], ["n2"], ["n3"], ["n4"], ["n5"]]), []))


def test_a_wave_larger_than_the_engines_parallel_nodes_takes_one_slowest_node_per_round():
    plan = _plan([["n1"], ["n2", "n3", "n4"]], window=None)

    assert estimate(plan, [], parallel=2).waves[1] == 2 * 50 * MIN
    assert estimate(plan, []).waves[1] == 50 * MIN
    assert duration_note(plan, estimate(plan, [])).endswith("the pool's windows are always open: no end to fit")


def test_the_pools_last_runs_are_read_from_the_database_without_dry_runs_or_other_pools(tmp_path):
    with open_database(tmp_path / "gpuops.db") as db:
        def ran(pool: str, *, took: dt.timedelta, dry_run: bool = False, at: dt.datetime = START) -> None:
            request = requests.create(
                db, kind="upgrade", pool=pool, targets=["n1"], window_start=None, window_end=None, reason="r",
                requester="U0A", requester_name="a", plan={}, plan_hash="h", approvals_required=0,
                expires_at=at + dt.timedelta(days=1), at=at)
            requests.transition(db, id=request.id, expected="pending", new="done", at=at)
            run = runs.create(db, request_id=request.id, dry_run=dry_run, at=at)
            assert run is not None
            (step,) = steps.add(db, run_id=run.id, steps=[NewStep(wave=0, node="n1", seq=0, kind="evict")])
            steps.transition(db, id=step.id, expected="pending", new="running", at=at)
            steps.transition(db, id=step.id, expected="running", new="done", at=at + took)
            runs.transition(db, id=run.id, expected="pending", new="running", at=at)
            runs.transition(db, id=run.id, expected="running", new="succeeded", at=at + took)

        ran("serving-a", took=4 * MIN)
        ran("serving-a", took=9 * MIN, dry_run=True)
        ran("training-a", took=60 * MIN)

        assert past_steps(db, pool="serving-a") == [PastStep(node="n1", kind="evict", took=4 * MIN)]
        assert past_steps(db, pool="inference-mig") == []


def test_a_run_that_starts_once_approved_says_by_when_it_must_start_to_end_inside_its_window():
    plan = _plan([["n1"], ["n2"]])
    plan = Plan(kind=plan.kind, pool=plan.pool, waves=plan.waves, created_for=plan.created_for,
                summary=PlanSummary(window_end=START + dt.timedelta(hours=4)))  # no start: once approved

    found = estimate(plan, [])

    # Nothing read from the clock: a dry run now and its request later say the same.
    assert duration_note(plan, found).endswith(
        "it starts once approved, and ends inside its window (which ends 2026-12-12 05:00 UTC) if it starts by "
        "2026-12-12 03:10 UTC")


def test_the_request_services_pace_carries_the_engines_nodes_at_once_so_a_big_wave_is_timed_in_rounds(tmp_path):

    config = GpuopsConfig.model_validate({"pools": {"serving-a": {"kind": "serving"}},
                                          "engine": {"max_parallel_nodes": 2}})
    plan = _plan([["n1"], ["n2", "n3", "n4"]], window=None)
    with open_database(tmp_path / "gpuops.db") as db:
        pace = RequestService(db, config).pool_pace("serving-a")
    assert pace.parallel == 2
    (timing,) = duration_notes(plan, PlanFacts(fleet=None, policy=None, past=pace.steps, parallel=pace.parallel))
    # The canary n1 alone (50m and its 10m soak), then n2 and n3 together and n4 after them:
    # two rounds of 50m (all three at once would be one, 1h50m in all).
    assert timing.sentence.startswith("The run takes at most 2h40m"), timing.sentence


def _with_diag(plan: Plan, level: int, *, timeout_s: int) -> Plan:
    """`plan` with a diag check on each node after its validation."""
    waves = []
    for wave in plan.waves:
        found: list[NodeStep] = []
        for step in wave.steps:
            found.append(step)
            if step.kind == "validate":
                found.append(NodeStep("gpu-check", step.node, {"namespace": "gpuops", "image": "dcgm", "count": "all",
                                                               "diag": level, "resource": "nvidia.com/gpu",
                                                               "timeout_s": timeout_s}))
        waves.append(Wave(wave.index, wave.nodes, tuple(found)))
    return Plan(kind=plan.kind, pool=plan.pool, waves=tuple(waves), summary=plan.summary, created_for=plan.created_for)


def test_a_level_3_diag_check_counts_half_an_hour_a_node_even_where_past_quick_checks_took_seconds():
    plan = _with_diag(_plan([["n1"], ["n2"]], window=dt.timedelta(hours=8)), 3, timeout_s=3600)
    past = [p for n in ("n1", "n2") for p in _past(n, evict=1, driver=5, validate=2, cordon=0, uncordon=0)]
    past += [PastStep(node="n1", kind="gpu-check", took=dt.timedelta(seconds=5))]

    found = estimate(plan, past)

    # n1 (the canary): 1 + 5 + 2 + 30 (the diag, not the 5s nvidia-smi of the past) + the 10m soak.
    assert found.waves == (48 * MIN, 38 * MIN)


def test_a_plan_whose_diagnostics_outgrow_its_window_is_critical_and_refused_and_one_that_fits_is_not():
    tight = _with_diag(_plan([["n1"], ["n2"], ["n3"]], window=dt.timedelta(hours=2)), 3, timeout_s=3600)
    (timing,) = duration_notes(tight, PlanFacts(fleet=None, policy=None))  # type: ignore[arg-type]
    assert (timing.code, timing.severity) == ("diag-outgrows-window", "critical")
    assert "its DCGM diagnostics (the pool's gpu_check diag) make it outgrow the window, so it is refused" in (
        timing.sentence)
    assert refusing_note(tight.__class__(kind=tight.kind, pool=tight.pool, waves=tight.waves,
                                          summary=tight.summary.with_preflight(timing),
                                          created_for=tight.created_for)) == timing

    roomy = _with_diag(_plan([["n1"], ["n2"], ["n3"]], window=dt.timedelta(hours=8)), 3, timeout_s=3600)
    (timing,) = duration_notes(roomy, PlanFacts(fleet=None, policy=None))  # type: ignore[arg-type]
    assert (timing.code, timing.severity) == ("fits-window", "info")
    # Without diagnostics, a plan that outgrows its window is a warning, as before.
    (timing,) = duration_notes(_plan([["n1"], ["n2"], ["n3"]], window=dt.timedelta(hours=2)),
                               PlanFacts(fleet=None, policy=None))  # type: ignore[arg-type]
    assert (timing.code, timing.severity) == ("outgrows-window", "warning")


def test_the_service_health_watch_between_waves_counts_in_the_runs_time_and_its_window():
    from workflows.pools.config import PoolConfig

    watched = PoolConfig.model_validate({"kind": "serving", "analysis": [
        {"name": "errors", "query": "sum(rate(errors[1m]))", "max": 0.05, "for": "30m"},
        {"name": "latency", "query": "max(latency_p99)", "max": 0.5, "for": "10m"}]})
    plan = _plan([["n1"], ["n2"], ["n3"]], window=dt.timedelta(hours=3))  # 2h40m of steps at the timeouts

    (timing,) = duration_notes(plan, PlanFacts(fleet=None, policy=watched))  # type: ignore[arg-type]

    # The longest `for` after waves 1 and 2: 2h40m + 2 x 30m no longer fits 3h.
    assert (timing.code, timing.severity) == ("outgrows-window", "warning")
    assert timing.sentence.startswith("The run takes at most 3h40m at the configured timeouts")
    assert "including 1h of service-health watch (30m after each wave but the last)" in timing.sentence
    unwatched = PoolConfig.model_validate({"kind": "serving"})
    (timing,) = duration_notes(plan, PlanFacts(fleet=None, policy=unwatched))  # type: ignore[arg-type]
    assert timing.code == "fits-window" and "service-health" not in timing.sentence
