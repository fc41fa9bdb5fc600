"""Service health between waves (WaveGates.service_health_held and the watch it keeps,
workflows.engine.wave_gates), as the real engine meets it on the two- (or three-) wave
drain of tests/unit/test_wave_gates.py, with Prometheus a local HTTP stand-in. What a
person notices is asserted whole: the audit rows (action, target, before, after, detail),
the thread's posts (payload and dedupe key), the engine's log lines, `runs.waiting`, the
halt, and when the next wave starts.

- The watch after a wave is audited (`run.health`, before and after the wave it follows),
  posted once to the thread (a max bound as "at most", a min bound as "at least"), and
  logged; its verdict (`run.health.held`, from that wave to the next) likewise.
- From the first look the run's waiting line says how long is left.
- The watch begins when the wave ended, read from the audit by its own action and wave: an
  earlier row of the same wave (the capacity wait before it) is not taken for it.
- The thread counts the waves that have work: a plan's empty wave is not one of them.
- Every wave after the first is watched anew for its whole `for`, told again, with nothing
  of the last watch kept (not its held queries, not its next read, even when the wall
  clock steps back).
- A query that held does not stop the others being read: a later breach still halts.
- A run halted on health says nothing more (not that its next wave would wait).
- A halt names the nodes the run leaves cordoned, and the step it stopped fails with the
  halt's words; a reader that gives neither a value nor a reason halts the run too.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from typing import Any

import pytest

from storage import audit
from storage.ids import RunId
from tests.hostile_sources import vector
from tests.unit import test_wave_gates as gated_drain  # its planner, wrapped in one test
from tests.unit.test_wave_gates import (  # noqa: F401 (cluster and prometheus: the fixtures)
    ANALYSIS, ERRORS, JOB, LATENCY, NOW, POOL, GatedDrain, LocalPrometheus, cluster, health_drain, one, policy,
    prometheus, set_by_hand, started_at, too_many, watching)
from workflows.engine import halt_messages
from workflows.engine import health_messages as health_say
from workflows.engine.runs import RunService
from workflows.plans import Wave
from workflows.signals.analysis import QueryReading

THREE = "gpu-01 gpu-02 gpu-03 for 2h firmware"  # three waves, one node each


def told_watch(*, after: int, waves: int, analysis: list[dict[str, Any]] = ANALYSIS) -> str:
    """What the thread is told when the watch after wave `after` (1-based) begins."""
    checks = [(q.name, health_say.bound_words(max_value=q.max, min_value=q.min), q.for_)
              for q in policy(analysis=analysis)[POOL].analysis]
    return health_say.watching(after=after, waves=waves, checks=checks, dry_run=False)


def audit_rows(drain: GatedDrain, *actions: str) -> list[tuple[str, str, Any, Any, Any]]:
    """The run's audit rows of `actions`, whole but for their time and hashes."""
    return [(e.action, e.target, e.before, e.after, e.detail)
            for e in audit.for_run(drain.db, RunId(drain.run_id), actions=actions)]


def posts(drain: GatedDrain, *events: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The thread's queued posts of `events`: kind, dedupe key and payload."""
    rows = drain.db.query("SELECT kind, dedupe_key, payload FROM outbox ORDER BY id")
    return [(r["kind"], r["dedupe_key"], p) for r in rows if (p := json.loads(r["payload"]))["event"] in events]


def events(drain: GatedDrain) -> list[str]:
    """Every event the run's thread was sent, in order."""
    return [json.loads(r["payload"])["event"] for r in drain.db.query("SELECT payload FROM outbox ORDER BY id")]


def three_waves(db, cluster, prometheus: LocalPrometheus) -> GatedDrain:  # noqa: F811
    """The drain of gpu-01, gpu-02 and gpu-03 under ANALYSIS, its first wave done."""
    cluster.terminate(JOB)
    drain = GatedDrain(db, cluster, pools=policy(analysis=ANALYSIS), health=prometheus.health, words=THREE)
    drain.drive(lambda: drain.step("gpu-01", "uncordon") == "done")
    return drain


def payload(drain: GatedDrain, event: str, text: str) -> dict[str, Any]:
    return {"event": event, "request_id": drain.run().request_id, "run_id": drain.run_id, "pool": POOL,
            "kind": "drain", "state": "running", "text": text, "dry_run": False}


# ------------------------------------------------------------------ what the watch says and keeps


def test_the_watch_and_its_verdict_are_audited_posted_and_logged(db, cluster, prometheus, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="gpuops.engine")
    drain, done = health_drain(db, cluster, prometheus)
    assert drain.waiting() == health_say.waiting(after=1, left=dt.timedelta(minutes=10))  # from the first look
    drain.until(done + dt.timedelta(seconds=35))  # the last pass read the queries
    assert drain.waiting() == health_say.waiting(after=1, left=dt.timedelta(minutes=9, seconds=30))
    drain.drive(lambda: drain.started("gpu-02"))

    held = health_say.held(after=1, values=[("checkout-errors", 0.01), ("p99-latency", 0.2)])
    assert audit_rows(drain, "run.health", "run.health.held") == [
        ("run.health", POOL, 0, 0, {"wave": 0, "queries": ["checkout-errors", "p99-latency"], "text": watching(),
                                    "replica": "engine-0", "dry_run": False}),
        ("run.health.held", POOL, 0, 1, {"wave": 0, "values": {"checkout-errors": 0.01, "p99-latency": 0.2},
                                         "text": held, "replica": "engine-0", "dry_run": False})]
    assert posts(drain, "run.health", "run.health.held") == [
        ("post", f"{drain.run_id}/wave/0/health", payload(drain, "run.health", watching())),
        ("post", f"{drain.run_id}/wave/0/health/held", payload(drain, "run.health.held", held))]
    said = [r.getMessage() for r in caplog.records if r.name == "gpuops.engine"]
    assert f"engine-0: run {drain.run_id}: {watching()}" in said
    assert f"engine-0: run {drain.run_id}: {held}" in said


def test_a_min_bound_is_told_as_the_floor_the_query_must_stay_at(db, cluster, prometheus):  # noqa: F811
    success = [{"name": "checkout-success", "query": ERRORS, "min": 0.99, "for": "10m"}]
    prometheus.answers[ERRORS] = one(0.995)
    drain, done = health_drain(db, cluster, prometheus, analysis=success)

    floor = health_say.watching(after=1, waves=2, checks=[
        ("checkout-success", health_say.bound_words(max_value=None, min_value=0.99), dt.timedelta(minutes=10))],
        dry_run=False)
    assert "checkout-success at least 0.99 for 10m" in floor
    assert drain.thread("run.health") == [floor]


def test_the_watch_begins_when_the_wave_ended_not_at_an_earlier_row_of_that_wave(db, cluster, prometheus):  # noqa: F811
    cluster.terminate(JOB)
    drain = GatedDrain(db, cluster, pools=policy(analysis=ANALYSIS), health=prometheus.health)
    set_by_hand(cluster, "gpu-03")  # the first wave waits (audited as that wave's wait) ...
    drain.until(NOW + dt.timedelta(minutes=3))
    assert drain.audited("run.waiting") == [{"wave": 0, "rule": "max_unavailable",
                                             "text": too_many(0, "gpu-01", already=("gpu-03",))}]
    set_by_hand(cluster, "gpu-03", unschedulable=False)  # ... then goes
    drain.drive(lambda: drain.step("gpu-01", "uncordon") == "done")
    done = drain.ended("gpu-01", "uncordon")
    drain.drive(lambda: drain.started("gpu-02"))

    assert drain.thread("run.health") == [watching()]
    assert started_at(drain, "gpu-02") == done + dt.timedelta(minutes=10)


def test_every_later_wave_is_watched_anew_for_its_whole_for_and_told_again(db, cluster, prometheus):  # noqa: F811
    drain = three_waves(db, cluster, prometheus)
    drain.drive(lambda: drain.step("gpu-02", "uncordon") == "done")
    second = drain.ended("gpu-02", "uncordon")
    reads = prometheus.reads(ERRORS), prometheus.reads(LATENCY)
    assert drain.waiting() == health_say.waiting(after=2, left=dt.timedelta(minutes=10))
    drain.drive(lambda: drain.started("gpu-03"))

    assert drain.thread("run.health") == [told_watch(after=1, waves=3), told_watch(after=2, waves=3)]
    assert started_at(drain, "gpu-03") == second + dt.timedelta(minutes=10)  # not a moment less
    # After the first read: every 30s, each until its own `for` passed.
    assert (prometheus.reads(ERRORS) - reads[0], prometheus.reads(LATENCY) - reads[1]) == (20, 10)
    held = health_say.held(after=2, values=[("checkout-errors", 0.01), ("p99-latency", 0.2)])
    assert drain.audited("run.health.held")[1] == {"wave": 1, "values": {"checkout-errors": 0.01,
                                                                         "p99-latency": 0.2}, "text": held}
    drain.drive(drain.finished)
    assert drain.run().state == "succeeded", drain.run().halted_reason


def test_the_thread_counts_only_the_waves_that_have_work(db, cluster, prometheus, monkeypatch):  # noqa: F811
    planned = gated_drain.plan_drain

    def with_an_empty_second_wave(*args: Any, **kwargs: Any) -> Any:
        """The drain's plan with a wave of no node after its first (the rest renumbered)."""
        result = planned(*args, **kwargs)
        first, *rest = result.plan.waves
        waves = (first, Wave(1, (), ()), *(dataclasses.replace(w, index=w.index + 1) for w in rest))
        return dataclasses.replace(result, plan=dataclasses.replace(result.plan, waves=waves))

    monkeypatch.setattr(gated_drain, "plan_drain", with_an_empty_second_wave)
    drain = three_waves(db, cluster, prometheus)
    assert [w.nodes for w in drain.looked_at()[1].plan.waves] == [("gpu-01",), (), ("gpu-02",), ("gpu-03",)]
    drain.drive(lambda: drain.started("gpu-03"))

    assert drain.thread("run.health") == [told_watch(after=1, waves=3), told_watch(after=2, waves=3)]
    assert drain.thread("run.health.held") == [
        health_say.held(after=n, values=[("checkout-errors", 0.01), ("p99-latency", 0.2)]) for n in (1, 2)]
    assert drain.audited("run.health")[1]["wave"] == 2  # the plan's own number, in the audit


def test_a_wall_clock_stepping_back_between_waves_does_not_delay_the_first_read(db, cluster, prometheus,  # noqa: F811
                                                                                make):
    cluster.add_pod(make.workload("gpu-02", gpus=8, name="job-02"), uid="uid-job-02")
    cluster.slow.add("uid-job-02")  # the second wave takes a while
    drain = three_waves(db, cluster, prometheus)
    drain.drive(lambda: drain.step("gpu-02", "evict") == "running")
    drain.clock.now -= dt.timedelta(minutes=2)  # NTP corrects the wall clock while gpu-02 is out
    prometheus.answers[ERRORS] = one(0.125)
    cluster.terminate("uid-job-02")
    drain.drive(lambda: drain.step("gpu-02", "uncordon") == "done")

    reason = health_say.failed(after=2, name="checkout-errors", query=ERRORS, value=0.125, max_value=0.05,
                               min_value=None)
    assert drain.run().state == "failed"  # in the pass the wave ended: read at once
    assert drain.run().halted_reason == halt_messages.halted_before_wave(reason, left_cordoned=())
    assert not drain.started("gpu-03")


def test_a_query_that_held_does_not_stop_the_others_being_read(db, cluster, prometheus):  # noqa: F811
    shortest_first = [ANALYSIS[1], ANALYSIS[0]]  # p99-latency (5m) holds first
    drain, done = health_drain(db, cluster, prometheus, analysis=shortest_first)
    drain.until(done + dt.timedelta(minutes=7))
    prometheus.answers[ERRORS] = one(0.125)
    drain.drive(drain.finished, passes=8)

    reason = health_say.failed(after=1, name="checkout-errors", query=ERRORS, value=0.125, max_value=0.05,
                               min_value=None)
    assert drain.run().halted_reason == halt_messages.halted_before_wave(reason, left_cordoned=())
    assert drain.halt()["code"] == "service-unhealthy"


# ------------------------------------------------------------------ a halt on health


@pytest.mark.parametrize(("body", "code"), [(one(0.125), "service-unhealthy"), (vector([]), "service-health-unread")])
def test_a_run_halted_on_health_says_nothing_of_its_next_waves_room(db, cluster, prometheus, body, code):  # noqa: F811
    drain, done = health_drain(db, cluster, prometheus)
    set_by_hand(cluster, "gpu-03")  # the next wave would not fit either
    drain.until(done + dt.timedelta(minutes=1))
    prometheus.answers[ERRORS] = body
    drain.drive(drain.finished, passes=8)

    assert drain.halt()["code"] == code
    assert events(drain)[-2:] == ["run.health", "run.failed"]
    assert drain.audited("run.waiting") == [] and drain.waiting() is None
    assert not drain.started("gpu-02")


def test_a_health_halt_names_the_node_left_cordoned_and_fails_its_step_so(db, cluster, prometheus):  # noqa: F811
    # Asked directly while gpu-01 is still out (its job slow to go): what the halt leaves.
    drain = GatedDrain(db, cluster, pools=policy(analysis=ANALYSIS), health=prometheus.health)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    prometheus.answers[ERRORS] = one(0.125)
    assert drain.gates().service_health_held(*drain.looked_at(), after=0, before=1) is False

    reason = health_say.failed(after=1, name="checkout-errors", query=ERRORS, value=0.125, max_value=0.05,
                               min_value=None)
    said = halt_messages.halted_before_wave(reason, left_cordoned=("gpu-01",))
    assert drain.run().state == "failed" and drain.run().halted_reason == said
    assert drain.halt() == {"wave": 1, "reason": reason, "code": "service-unhealthy", "query": "checkout-errors",
                            "promql": ERRORS, "value": 0.125, "left_cordoned": ["gpu-01"], "text": said}
    evict = next(s for s in RunService(db).get(drain.run_id).steps if (s.node, s.kind) == ("gpu-01", "evict"))
    assert (evict.state, evict.error) == ("failed", reason)


class SaysNothing:
    """A health reader that answers with neither a value nor why it has none."""

    def read(self, query: str) -> QueryReading:
        return QueryReading()


def test_a_reader_that_gives_neither_a_value_nor_a_reason_halts_the_run(db, cluster):  # noqa: F811
    cluster.terminate(JOB)
    drain = GatedDrain(db, cluster, pools=policy(analysis=ANALYSIS), health=SaysNothing())  # type: ignore[arg-type]
    drain.drive(drain.finished)

    reason = health_say.unread(after=1, name="checkout-errors", query=ERRORS, reason="")
    said = halt_messages.halted_before_wave(reason, left_cordoned=())
    assert drain.run().halted_reason == said
    assert drain.halt() == {"wave": 1, "reason": reason, "code": "service-health-unread", "query": "checkout-errors",
                            "promql": ERRORS, "unread": None, "left_cordoned": [], "text": said}
