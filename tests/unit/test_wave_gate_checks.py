"""The freeze and capacity gates of workflows.engine.wave_gates, to what an operator can
check afterwards: the audit rows (action, before, after, detail), the thread's messages
with their dedupe keys, `runs.waiting`, the engine's log lines and the run's halt. The
setting is tests/unit/test_wave_gates.py's: a two-wave drain of gpu-01 and gpu-02 on
train-a over the in-memory cluster, on a clock the test moves.

- A freeze's notice and its end are audited as the run stood (`running` before and after),
  told once each (dedupe keys naming the run and the freeze) and logged by the replica.
- The end of a freeze clears what the run waits for; a freeze of another cluster's pool
  holds that cluster's runs and names the cluster; times are written in the display zone.
- A node whose steps are all done or skipped is not named as finishing, and does not keep a
  run frozen past its window from halting; a restarted engine does not tell a freeze's end
  twice, and an audit row that names no freeze by its number is not taken for one told.
  A freeze's end whose first commit failed (the database locked) is told at the next look.
- A wave that waits is audited at the run's current wave, its thread told with the run's
  state, its reason logged; a wave that fits after waiting logs so, once.
- What the capacity gate counts: another request's window on both sides, and that request
  even when a newer one of another pool is listed before it; another run's current wave
  (not its later waves) only on this wave's nodes and only while its steps there are
  unfinished; and the cordons this run takes over from the run it continues.
- A run halted before a wave names in its reason the nodes it leaves cordoned.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import zoneinfo
from typing import Any

import pytest

from storage import audit
from storage import requests as stored_requests
from storage.errors import DatabaseUnavailable
from storage.ids import RunId
from storage.step_params import TakesOverMark
from workflows.engine import halt_messages
from workflows.engine.context import RunInfo
from workflows.engine.loop import EngineSettings
from workflows.engine.runs import RunService
from workflows.engine.steps.cordoning import CordonMark
from workflows.kube.errors import Conflict
from workflows.kube.labels import ANNOTATION_CORDONED_BY
from workflows.pools import messages as gate_say
from workflows.pools.freezes import FreezeService
from workflows.pools.messages import wave_does_not_fit
from tests.unit import test_wave_gates as two_wave_drain
from tests.unit.test_wave_gates import (
    ADA,
    JOB,
    NOW,
    POOL,
    UTC,
    WINDOW_END,
    GatedDrain,
    frozen_text,
    lift_freeze,
    policy,
    set_by_hand,
    set_freeze,
    too_many,
    waits_for,
)

cluster = two_wave_drain.cluster  # the fixture: train-a's four nodes, gpu-01's job slow to go
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
OLD_RUN = RunId("run-0ld001")


class ZonedDrain(GatedDrain):
    """GatedDrain whose engines write times in Europe/Berlin (`display.timezone`)."""

    def restart(self) -> None:
        self.engine = self.engine_with(settings=EngineSettings(display_zone=BERLIN))


class Contested:
    """The in-memory cluster's API, where someone changes `node` before each uncordon of it
    lands: every uncordon is a Conflict (the step waits, running)."""

    def __init__(self, cluster, node: str) -> None:
        self._cluster, self._node = cluster, node

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    def uncordon_node(self, name: str, **patch: Any) -> Any:
        if name == self._node:
            raise Conflict(f"PATCH /api/v1/nodes/{name}: the object has been modified", status=409)
        return self._cluster.uncordon_node(name, **patch)


class ContestedDrain(GatedDrain):
    """GatedDrain whose engines meet a Conflict at every uncordon of gpu-02."""

    def restart(self) -> None:
        self.engine = self.engine_with(gateway=Contested(self.cluster, "gpu-02"))


class Locked:
    """The database as the engine reaches it, locked past the busy timeout at the next
    transaction it begins once `lock_next` is called (then answering again)."""

    def __init__(self, db) -> None:
        self._db, self._locked = db, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def lock_next(self) -> None:
        self._locked = True

    def transaction(self) -> Any:
        if self._locked:
            self._locked = False
            raise DatabaseUnavailable("database is locked")
        return self._db.transaction()


class LockedDrain(GatedDrain):
    """GatedDrain whose engines reach the database through `Locked`."""

    def restart(self) -> None:
        self.locked = getattr(self, "locked", None) or Locked(self.db)
        self.engine = self.engine_with(db=self.locked)


def rows(drain: GatedDrain, action: str) -> list[tuple[Any, Any, Any]]:
    """The run's `action` rows as (target, before, after)."""
    return [(e.target, e.before, e.after) for e in audit.for_run(drain.db, RunId(drain.run_id), actions=(action,))]


def posted(drain: GatedDrain, event: str) -> list[tuple[str | None, dict[str, Any]]]:
    """The thread's `event` messages as (dedupe key, payload)."""
    found = [(r["dedupe_key"], json.loads(r["payload"]))
             for r in drain.db.query("SELECT dedupe_key, payload FROM outbox ORDER BY id")]
    return [(key, payload) for key, payload in found if payload["event"] == event]


def payload(drain: GatedDrain, event: str, text: str) -> dict[str, Any]:
    run = drain.run()
    request = drain.looked_at()[1].request
    return {"event": event, "request_id": request.id, "run_id": run.id, "pool": POOL, "kind": "drain",
            "state": "running", "text": text, "dry_run": False}


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpuops.engine"]


def with_states(steps: list[Any], node: str, states: dict[str, str]) -> list[Any]:
    """`steps` with `node`'s steps in the states given by kind."""
    return [dataclasses.replace(s, state=states[s.kind]) if s.node == node else s for s in steps]


LEFT_OUT = {"cordon": "done", "evict": "skipped", "validate": "skipped", "uncordon": "done"}


# ------------------------------------------------------------------ change freezes


def test_a_freeze_and_its_end_are_audited_told_once_each_and_logged_as_the_run_stood(db, cluster, caplog):
    caplog.set_level(logging.INFO, logger="gpuops.engine")
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    freeze = set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(minutes=1))

    told = frozen_text(drain, freeze, in_flight=["gpu-01"])
    assert rows(drain, "run.frozen") == [(POOL, "running", "running")]
    assert posted(drain, "run.frozen") == [(f"{drain.run_id}/frozen/{freeze.id}",
                                            payload(drain, "run.frozen", told))]
    assert logged(caplog).count(f"engine-0: {told}") == 1

    lift_freeze(db, now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(seconds=10))
    unfrozen = gate_say.run_unfrozen(run_id=drain.run_id, target=POOL)
    assert rows(drain, "run.unfrozen") == [(POOL, "running", "running")]
    assert posted(drain, "run.unfrozen") == [(f"{drain.run_id}/unfrozen/{freeze.id}",
                                              payload(drain, "run.unfrozen", unfrozen))]
    assert logged(caplog).count(f"engine-0: {unfrozen}") == 1


def test_the_end_of_a_freeze_clears_what_the_run_waits_for(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    gates = drain.gates()
    freeze = set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    assert gates.frozen_now(*drain.looked_at()) == freeze
    assert drain.waiting() == waits_for(freeze)

    lift_freeze(db, now=drain.clock.now)
    assert gates.frozen_now(*drain.looked_at()) is None
    assert drain.waiting() is None


def test_a_freeze_of_another_clusters_pool_holds_that_clusters_run_and_names_the_cluster(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    east = FreezeService(db, pools=[POOL], names={"U0ADA": "Ada"}, cluster="east").set(
        ADA, target=POOL, until=NOW + dt.timedelta(hours=1), reason="incident 4711", let_running_finish=False,
        now=drain.clock.now).freeze
    run, info, steps = drain.looked_at()
    on_east = RunInfo(request=dataclasses.replace(info.request, cluster="east"), plan=info.plan)

    assert drain.gates().frozen_now(run, on_east, steps) == east
    assert drain.waiting() == gate_say.run_waits_for_freeze(target=POOL, by="Ada", until=east.until,
                                                            reason="incident 4711", zone=UTC, cluster="east")
    assert drain.gates().frozen_now(run, info, steps) is None  # the one-cluster run: not east's


def test_a_freeze_is_told_and_kept_in_the_display_zone(db, cluster):
    drain = ZonedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    freeze = set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(minutes=1))

    assert drain.thread("run.frozen") == [gate_say.run_frozen(
        run_id=drain.run_id, target=POOL, by="Ada", until=freeze.until, reason=freeze.reason, in_flight=["gpu-01"],
        zone=BERLIN)]
    assert drain.waiting() == gate_say.run_waits_for_freeze(target=POOL, by="Ada", until=freeze.until,
                                                            reason=freeze.reason, zone=BERLIN)


def test_a_node_whose_steps_are_done_or_skipped_is_not_named_as_finishing(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    freeze = set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    run, info, steps = drain.looked_at()
    drain.gates().frozen_now(run, info, with_states(steps, "gpu-01", LEFT_OUT))  # gpu-01 was left out

    assert drain.thread("run.frozen") == [frozen_text(drain, freeze, in_flight=[])]


def test_a_run_frozen_past_its_window_halts_when_its_nodes_are_done_or_skipped_and_stops_what_is_left(db, cluster):
    drain = ZonedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    freeze = set_freeze(db, until=NOW + dt.timedelta(hours=3), now=drain.clock.now)
    drain.tick(dt.timedelta(hours=2))  # the window's end
    run, info, steps = drain.looked_at()
    # The gate is told gpu-01 was left out; its eviction, still running, is stopped.
    drain.gates().halt_if_window_ended(run, info, freeze, with_states(steps, "gpu-01", LEFT_OUT), wave=1)

    reason = gate_say.run_window_ended_while_frozen(run_id=drain.run_id, target=POOL,
                                                    window_end=NOW + dt.timedelta(hours=2), zone=BERLIN)
    said = halt_messages.halted_before_wave(reason, left_cordoned=("gpu-01",))
    assert drain.run().state == "failed" and drain.run().halted_reason == said
    assert drain.halt() == {"wave": 1, "reason": reason, "code": "window-ended-while-frozen",
                            "left_cordoned": ["gpu-01"], "text": said}
    assert [(s.node, s.kind, s.state, s.error) for s in drain.looked_at()[2] if s.state != "skipped"] == [
        ("gpu-01", "cordon", "done", None), ("gpu-01", "evict", "failed", reason)]


def test_a_restarted_engine_does_not_tell_the_end_of_a_freeze_again(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    set_by_hand(cluster, "gpu-03")  # the second wave will wait: the run stays unfinished
    lift_freeze(db, now=drain.clock.now)
    cluster.terminate(JOB)
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    assert drain.waiting() == too_many(1, "gpu-02", already=("gpu-03",))
    assert len(drain.audited("run.unfrozen")) == 1

    drain.restart()
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    assert len(drain.audited("run.unfrozen")) == 1
    assert drain.waiting() == too_many(1, "gpu-02", already=("gpu-03",))


def test_an_audit_row_that_names_no_freeze_by_its_number_is_not_taken_for_one_told(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    freeze = set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    run, info, _ = drain.looked_at()
    with db.transaction():  # a row in another shape (another version's): the freeze not an integer
        audit.append(db, actor=audit.GPUOPS_ACTOR, k8s_identity=None, action="run.frozen", target=POOL,
                     at=drain.clock.now, request_id=info.request.id, run_id=run.id, before="running",
                     after="running", detail={"freeze": float(freeze.id)})
    drain.restart()  # it reads the audit back
    drain.until(drain.clock.now + dt.timedelta(seconds=10))

    assert drain.thread("run.frozen") == [frozen_text(drain, freeze, in_flight=["gpu-01"])]


def test_the_end_of_a_freeze_is_told_even_when_the_database_was_locked_at_the_first_try(db, cluster):
    drain = LockedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    set_by_hand(cluster, "gpu-03")  # the second wave will wait: the run stays unfinished
    set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    cluster.terminate(JOB)
    drain.drive(lambda: drain.step("gpu-01", "uncordon") == "done")
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    lift_freeze(db, now=drain.clock.now)

    drain.locked.lock_next()
    with pytest.raises(DatabaseUnavailable):  # the engine's loop logs it and passes again
        drain.engine.run_pass()
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    assert drain.thread("run.unfrozen") == [gate_say.run_unfrozen(run_id=drain.run_id, target=POOL)]
    assert drain.waiting() == too_many(1, "gpu-02", already=("gpu-03",))


# ------------------------------------------------------------------ the capacity gate before each wave


def test_a_wave_that_waits_is_audited_at_the_current_wave_told_and_logged_and_logs_when_it_fits(db, cluster,
                                                                                               caplog):
    caplog.set_level(logging.INFO, logger="gpuops.engine")
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    set_by_hand(cluster, "gpu-03")
    cluster.terminate(JOB)
    drain.until(drain.clock.now + dt.timedelta(minutes=1))

    full = too_many(1, "gpu-02", already=("gpu-03",))
    assert rows(drain, "run.waiting") == [(POOL, 0, 0)]
    assert posted(drain, "run.waiting") == [(f"{drain.run_id}/wave/1/waits/max_unavailable",
                                             payload(drain, "run.waiting", full))]
    assert logged(caplog).count(f"engine-0: run {drain.run_id}: {full}") == 1

    set_by_hand(cluster, "gpu-03", unschedulable=False)
    drain.drive(drain.finished)
    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert [m for m in logged(caplog) if m.endswith("fits now")] == [f"engine-0: run {drain.run_id}: wave 2 fits now"]


def test_a_wave_of_a_pool_no_longer_configured_is_audited_under_the_window_rule(db, cluster):
    drain = GatedDrain(db, cluster, pools={"train-b": policy()[POOL]})
    drain.until(NOW + dt.timedelta(minutes=1))
    gone = gate_say.pool_gone(0, POOL)
    assert drain.audited("run.waiting") == [{"wave": 0, "rule": "window", "text": gone}]
    assert [key for key, _ in posted(drain, "run.waiting")] == [f"{drain.run_id}/wave/0/waits/window"]


def test_a_wave_still_waiting_at_the_windows_end_halts_with_its_end_in_the_display_zone(db, cluster):
    cluster.terminate(JOB)
    drain = ZonedDrain(db, cluster, words="gpu-01 gpu-02 for 20m firmware")
    set_by_hand(cluster, "gpu-03")
    drain.until(NOW + dt.timedelta(minutes=21))

    reason = gate_say.wave_window_over(0, NOW + dt.timedelta(minutes=20), zone=BERLIN)
    said = halt_messages.halted_before_wave(reason, left_cordoned=())
    assert drain.run().state == "failed" and drain.run().halted_reason == said
    assert drain.halt() == {"wave": 0, "reason": reason, "code": "window-ended", "left_cordoned": [], "text": said}


def test_another_request_whose_window_has_not_begun_does_not_count_against_the_budget(db, cluster):
    cluster.terminate(JOB)
    drain = GatedDrain(db, cluster)
    drain.request("gpu-03 at 15:00 for 1h firmware")
    drain.drive(lambda: drain.step("gpu-01", "cordon") == "done")
    assert drain.thread("run.waiting") == []


def test_another_request_whose_window_has_ended_does_not_count_against_the_budget(db, cluster):
    cluster.terminate(JOB)
    drain = GatedDrain(db, cluster)
    drain.request("gpu-03 for 10m firmware")
    drain.tick(dt.timedelta(minutes=11))
    drain.drive(lambda: drain.step("gpu-01", "cordon") == "done")
    assert drain.thread("run.waiting") == []


def test_another_request_on_the_pool_counts_even_when_a_newer_one_on_another_pool_is_listed_first(db, cluster):
    cluster.terminate(JOB)
    drain = GatedDrain(db, cluster)
    drain.tick(dt.timedelta(seconds=1))
    other = drain.request("gpu-03 for 2h firmware")  # approved, its run not started
    drain.tick(dt.timedelta(seconds=1))
    elsewhere = stored_requests.create(
        db, kind="drain", pool="infer-b", targets=["infer-01"], window_start=drain.clock.now, window_end=WINDOW_END,
        reason="firmware", requester="U0ADA", requester_name="Ada", plan={"waves": []}, plan_hash="h",
        approvals_required=1, expires_at=WINDOW_END, at=drain.clock.now)
    stored_requests.transition(db, id=elsewhere.id, expected="pending", new="approved", at=drain.clock.now)

    assert not drain.gates().wave_may_start(*drain.looked_at(), 0)
    assert drain.waiting() == too_many(0, "gpu-01", already=(), concurrent=(other,))


class Other:
    """Another run on the pool, driven while this drain's run is paused (it holds nothing)."""

    def __init__(self, drain: GatedDrain, make, words: str, node: str) -> None:
        self.drain = drain
        RunService(drain.db).pause(ADA, drain.run_id, now=drain.clock.now)
        self.job = f"uid-job-{node}"
        drain.cluster.add_pod(make.workload(node, gpus=8, name=f"job-{node}"), uid=self.job)
        drain.cluster.slow.add(self.job)
        self.run_id = drain.submit(words)
        drain.drive(lambda: self.step(node, "evict") == "running")

    def step(self, node: str, kind: str) -> str:
        return next(s.state for s in RunService(self.drain.db).get(self.run_id).steps
                    if (s.node, s.kind) == (node, kind))

    def pause(self) -> None:
        RunService(self.drain.db).pause(ADA, self.run_id, now=self.drain.clock.now)


def assert_second_wave_waits_for(drain: GatedDrain, other: Other) -> None:
    """The drain's second wave (gpu-02) may not start while `other` holds gpu-02: audited
    as busy, naming that run."""
    assert not drain.gates().wave_may_start(*drain.looked_at(), 1)
    assert drain.audited("run.waiting") == [{"wave": 1, "rule": "busy",
                                             "text": gate_say.wave_nodes_busy(1, {"gpu-02": other.run_id})}]


def test_another_runs_node_outside_this_wave_does_not_keep_it_waiting(db, cluster, make):
    drain = GatedDrain(db, cluster, pools=policy(max_unavailable=2))
    Other(drain, make, "gpu-03 for 2h firmware", "gpu-03")  # its gpu-03 under way

    assert drain.gates().wave_may_start(*drain.looked_at(), 0)
    assert drain.waiting() is None


def test_another_runs_node_with_steps_still_pending_keeps_the_wave_waiting(db, cluster, make):
    drain = GatedDrain(db, cluster, pools=policy(max_unavailable=3))
    other = Other(drain, make, "gpu-02 for 2h firmware", "gpu-02")
    other.pause()  # its eviction finishes; nothing new starts
    cluster.terminate(other.job)
    drain.drive(lambda: other.step("gpu-02", "evict") == "done")
    assert other.step("gpu-02", "validate") == "pending"

    assert_second_wave_waits_for(drain, other)


def test_another_runs_node_whose_last_step_is_still_running_keeps_the_wave_waiting(db, cluster, make):
    drain = ContestedDrain(db, cluster, pools=policy(max_unavailable=2))
    other = Other(drain, make, "gpu-02 for 2h firmware", "gpu-02")
    cluster.terminate(other.job)
    drain.drive(lambda: other.step("gpu-02", "validate") == "done")
    drain.until(drain.clock.now + dt.timedelta(seconds=30))
    assert other.step("gpu-02", "uncordon") == "running"

    assert_second_wave_waits_for(drain, other)


def test_another_runs_node_done_while_that_run_stays_in_its_wave_no_longer_holds_it(db, cluster, make):
    drain = GatedDrain(db, cluster, pools=policy(max_unavailable=2))
    other = Other(drain, make, "gpu-02 gpu-04 for 2h firmware", "gpu-02")
    set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)  # it stops after gpu-02
    cluster.terminate(other.job)
    drain.drive(lambda: other.step("gpu-02", "uncordon") == "done")
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    assert other.step("gpu-04", "cordon") == "pending"

    assert drain.gates().wave_may_start(*drain.looked_at(), 1)
    assert drain.audited("run.waiting") == []


def test_a_node_only_a_later_wave_of_another_run_names_does_not_keep_the_wave_waiting(db, cluster, make):
    drain = GatedDrain(db, cluster, pools=policy(max_unavailable=3))
    other = Other(drain, make, "gpu-01 gpu-02 for 2h firmware", "gpu-01")  # gpu-01 under way, gpu-02 after it
    assert other.step("gpu-02", "cordon") == "pending"

    assert drain.gates().wave_may_start(*drain.looked_at(), 1)
    assert drain.audited("run.waiting") == []


def test_a_node_not_ready_for_an_hour_counts_as_out(db, cluster):
    drain = GatedDrain(db, cluster)
    cluster.nodes["gpu-03"] = dataclasses.replace(cluster.node("gpu-03"), ready=False,
                                                  ready_changed_at=NOW - dt.timedelta(hours=1))
    drain.until(NOW + dt.timedelta(minutes=1))
    assert drain.waiting() == too_many(0, "gpu-01", already=("gpu-03",))


def test_the_cordons_this_run_takes_over_count_as_in_service(db, cluster):
    drain = GatedDrain(db, cluster)
    # Since approval, the run this one continues (run-0ld001) has cordoned gpu-02.
    mark = CordonMark(run=OLD_RUN, by="gpuops", prior_unschedulable=False, at="2025-06-07T11:00:00Z").to_text()
    cluster.nodes["gpu-02"] = dataclasses.replace(cluster.node("gpu-02"), unschedulable=True,
                                                  annotations={ANNOTATION_CORDONED_BY: mark})
    run, info, steps = drain.looked_at()
    takes_over = [dataclasses.replace(s, detail={**s.detail, "params": TakesOverMark(takes_over=OLD_RUN).written_into(
        s.detail.get("params", {}))}) if (s.node, s.kind) == ("gpu-02", "cordon") else s for s in steps]

    assert drain.gates().wave_may_start(run, info, takes_over, 0)
    assert not drain.gates().wave_may_start(run, info, steps, 0)  # without the mark: gpu-02 is out
    assert drain.waiting() == wave_does_not_fit(0, gate_say.too_many_unavailable(
        pool=POOL, nodes=("gpu-01",), pool_size=4, already=("gpu-02",), concurrent=(), concurrent_nodes=0,
        most_at_once=0, unavailable=2, allowed=1, max_unavailable="1"))
