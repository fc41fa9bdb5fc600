"""Handovers through `HandoverService` on a real SQLite file: posted once per shift change
however often the scheduler ticks or the bot restarts, late with a note after downtime,
acknowledged by the incoming shift, reminded and escalated once each; and the /gpu
handover commands over the same storage."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

from commands.catalog import dispatch
from commands.handover import ACK_ACTION, handover_message
from commands.services import Services
from storage import audit, codec
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import Database, open_database
from storage.steps import NewStep
from workflows.config import GpuopsConfig
from workflows.fleet.summary import Fleet
from workflows.handover.service import HandoverService, UnknownHandover
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave, plan_to_json

UTC = dt.timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
MINUTE = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)


def berlin(day: int, hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2025, 6, day, hour, minute, tzinfo=BERLIN).astimezone(UTC)


DAY_STARTS = berlin(7, 8)  # Saturday 08:00 CEST
CONFIG = GpuopsConfig.model_validate({
    "pools": {"train-a": {"kind": "training"}},
    "access": {"users": {"U0ALICE": ["viewer"], "U0BOB": ["viewer"], "U0CAROL": ["viewer"],
                         "U0OTTO": ["operator"]},
               "names": {"U0ALICE": "Alice", "U0BOB": "Bob", "U0CAROL": "Carol", "U0OTTO": "Otto"}},
    "rotations": [{
        "name": "gpu-oncall", "team": "GPU platform", "channel": "C0GPU", "timezone": "Europe/Berlin",
        "shifts": [{"name": "day", "starts": "0 8 * * *", "members": ["U0ALICE", "group:S0DAY"]},
                   {"name": "night", "starts": "0 20 * * *", "members": ["U0BOB"]}],
        "ack_timeout": "30m", "escalate_after": "15m", "escalation": "group:S0LEADS",
    }],
})
alice, bob, carol, otto = (CONFIG.actor(u) for u in ("U0ALICE", "U0BOB", "U0CAROL", "U0OTTO"))


class StaticFleet:
    """A fleet source that always answers with the same fleet, counting reads."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self.reads = 0

    def fleet(self, now: dt.datetime) -> Fleet:
        self.reads += 1
        return self._fleet


@pytest.fixture
def source(make) -> StaticFleet:
    return StaticFleet(make.fleet([make.node("gpu-01"), make.node("gpu-02", unschedulable=True)],
                                  make.operands("gpu-01") + make.operands("gpu-02")))


class Scheduler:
    """What the bot's leader replica does every minute, reading the (frozen) clock; a
    restart opens a new connection and service on the same file."""

    def __init__(self, db_path: Path, source: StaticFleet, frozen) -> None:
        self.db_path = db_path
        self.source = source
        self.frozen = frozen
        self.db = open_database(db_path)
        self.posted: list = []

    @property
    def service(self) -> HandoverService:
        return HandoverService(self.db, CONFIG)

    def tick(self) -> None:
        now = dt.datetime.now(UTC)
        self.posted += self.service.post_due(self.source, now=now)
        self.service.send_reminders(now)

    def run_until(self, until: dt.datetime, *, every: dt.timedelta = MINUTE) -> None:
        while dt.datetime.now(UTC) < until:
            self.tick()
            self.frozen.tick(every)

    def restart(self) -> None:
        self.db.close()
        self.db = open_database(self.db_path)

    def close(self) -> None:
        self.db.close()


@pytest.fixture
def scheduler(db_path: Path, source: StaticFleet) -> Iterator[Scheduler]:
    with freeze_time(DAY_STARTS - 10 * MINUTE) as frozen:
        running = Scheduler(db_path, source, frozen)
        yield running
        running.close()


def stored_handovers(db: Database) -> list[tuple[str, dt.datetime]]:
    return [(r["rotation"], codec.time_from_text(r["shift_start"]))
            for r in db.query("SELECT rotation, shift_start FROM handovers ORDER BY shift_start")]


def messages(db: Database) -> list[tuple[str, str, str | None, dict]]:
    return [(r["kind"], r["channel"], r["thread_ts"], codec.json_from_text(r["payload"]))
            for r in db.query("SELECT * FROM outbox ORDER BY id")]


def audit_actions(db: Database) -> list[tuple[str, str]]:
    return [(e.action, e.actor) for e in reversed(audit.recent(db, 100))]


# ------------------------------------------------------------------ posting


def test_a_shift_change_is_posted_once_however_often_the_scheduler_ticks(scheduler):
    scheduler.run_until(DAY_STARTS + 2 * HOUR)

    assert [(v.shift, v.shift_start, v.late) for v in scheduler.posted] == [("day", DAY_STARTS, False)]
    assert stored_handovers(scheduler.db) == [("gpu-oncall", DAY_STARTS)]
    ((kind, channel, thread, payload),) = [m for m in messages(scheduler.db) if m[3]["event"] == "handover.posted"]
    assert (kind, channel, thread) == ("post", "C0GPU", None)
    assert payload["handover_id"] == scheduler.posted[0].id
    assert payload["text"] == "Handover to the day shift of gpu-oncall, Sat 07 Jun 08:00 CEST: 1 need action"
    assert ("handover.posted", "gpuops") in audit_actions(scheduler.db)
    assert scheduler.source.reads == 1  # the fleet is read only when something is due


def test_a_restart_between_two_shift_changes_neither_loses_nor_duplicates_a_post(scheduler):
    scheduler.run_until(DAY_STARTS + 3 * HOUR)
    scheduler.restart()
    scheduler.run_until(DAY_STARTS + 11 * HOUR, every=7 * MINUTE)
    scheduler.restart()
    scheduler.run_until(DAY_STARTS + 12 * HOUR + 3 * MINUTE)

    assert stored_handovers(scheduler.db) == [("gpu-oncall", DAY_STARTS), ("gpu-oncall", berlin(7, 20))]
    assert [(v.shift, v.late) for v in scheduler.posted] == [("day", False), ("night", False)]
    posts = [m for m in messages(scheduler.db) if m[3]["event"] == "handover.posted"]
    assert len(posts) == 2
    assert [a for a in audit_actions(scheduler.db) if a[0] == "handover.posted"] == [("handover.posted", "gpuops")] * 2


def test_posting_the_same_shift_again_returns_the_stored_handover_and_writes_nothing(db, source):
    service = HandoverService(db, CONFIG)
    rotation = service.rotation()
    shift = rotation.incoming_shift(DAY_STARTS)
    checklist = service.checklist(rotation, shift, fleet=source.fleet(DAY_STARTS), now=DAY_STARTS)

    first = service.post("gpu-oncall", DAY_STARTS, checklist, late=False, now=DAY_STARTS)
    again = service.post("gpu-oncall", DAY_STARTS, checklist, late=True, now=DAY_STARTS + HOUR)

    assert again.id == first.id and not again.late
    assert len(messages(db)) == 1
    assert audit_actions(db) == [("handover.posted", "gpuops")]


def test_a_change_missed_while_the_bot_was_down_is_posted_late_with_a_note(scheduler):
    scheduler.run_until(DAY_STARTS - 5 * MINUTE)  # up before the day shift ... then down
    scheduler.frozen.move_to(DAY_STARTS + 47 * MINUTE)
    scheduler.restart()
    scheduler.run_until(DAY_STARTS + HOUR)

    (view,) = scheduler.posted
    assert (view.shift, view.late, view.missed) == ("day", True, 0)
    reply = handover_message(view, CONFIG)
    assert ("Posted late: gpuops was not running at the shift change (Sat 07 Jun 08:00 CEST, 47m before "
            "this post).") in reply.summary
    (posted,) = [e for e in audit.recent(scheduler.db, 10) if e.action == "handover.posted"]
    assert posted.detail["late"] is True


def test_after_several_missed_changes_only_the_latest_is_posted_saying_how_many(scheduler, source):
    service = scheduler.service
    rotation = service.rotation()
    thursday = rotation.incoming_shift(berlin(5, 8))
    service.post(rotation, thursday.start, service.checklist(rotation, thursday, fleet=source.fleet(berlin(5, 8)),
                                                             now=berlin(5, 8)), late=False, now=berlin(5, 8))

    scheduler.frozen.move_to(berlin(7, 9, 30))
    scheduler.tick()
    scheduler.tick()

    assert [(v.shift, v.shift_start, v.late, v.missed) for v in scheduler.posted] == [
        ("day", DAY_STARTS, True, 3)]
    summary = handover_message(scheduler.posted[0], CONFIG).summary
    assert "3 earlier handovers were missed and not posted." in summary


# ------------------------------------------------------------------ acknowledging


@pytest.fixture
def posted(db, source) -> tuple[HandoverService, int]:
    service = HandoverService(db, CONFIG)
    (view,) = service.post_due(source, now=DAY_STARTS + MINUTE)
    return service, view.id


def test_an_ack_from_the_incoming_shift_counts_and_updates_the_message(db, posted):
    service, handover_id = posted
    assert service.record_message(handover_id, ts="1717.000100", now=DAY_STARTS + 2 * MINUTE)

    outcome = service.acknowledge(alice, handover_id, now=DAY_STARTS + 10 * MINUTE)

    assert (outcome.counted, outcome.first) == (True, True)
    assert outcome.text == "Acknowledged: Alice takes over as the day shift."
    assert (outcome.handover.acked_by_name, outcome.handover.acked_at) == ("Alice", DAY_STARTS + 10 * MINUTE)
    (update,) = [m for m in messages(db) if m[0] == "update"]
    assert update[3]["event"] == "handover.acknowledged" and update[3]["ts"] == "1717.000100"
    assert ("handover.acknowledged", "U0ALICE") in audit_actions(db)
    reply = handover_message(service.get(handover_id), CONFIG)
    assert reply.intents == ()
    assert reply.footer.startswith("Acknowledged by Alice at Sat 07 Jun 08:10 CEST")


def test_a_member_of_the_shifts_user_group_counts(posted):
    service, handover_id = posted

    outcome = service.acknowledge(carol, handover_id, now=DAY_STARTS + 5 * MINUTE, actor_groups=("S0DAY",))

    assert outcome.counted and outcome.first


def test_an_ack_from_outside_the_incoming_shift_is_recorded_but_does_not_count(db, posted):
    service, handover_id = posted

    outcome = service.acknowledge(bob, handover_id, now=DAY_STARTS + 5 * MINUTE)

    assert (outcome.counted, outcome.first) == (False, False)
    assert outcome.text.startswith("Recorded, but it does not count: Bob is not on the incoming day shift")
    assert not outcome.handover.acknowledged
    assert [(a.user, a.counted) for a in outcome.handover.acks] == [("U0BOB", False)]
    assert [m for m in messages(db) if m[0] == "update"] == []
    assert ("handover.ack-recorded", "U0BOB") in audit_actions(db)
    reply = handover_message(service.get(handover_id), CONFIG)
    assert reply.intents[0].action == ACK_ACTION  # still waiting for the day shift


def test_a_second_ack_from_the_shift_is_recorded_without_updating_the_message_again(db, posted):
    service, handover_id = posted
    service.record_message(handover_id, ts="1717.000100", now=DAY_STARTS + 2 * MINUTE)
    service.acknowledge(alice, handover_id, now=DAY_STARTS + 5 * MINUTE)

    second = service.acknowledge(carol, handover_id, now=DAY_STARTS + 6 * MINUTE, actor_groups=("S0DAY",))

    assert (second.counted, second.first) == (True, False)
    assert second.text == "Recorded Carol's acknowledgement too; Alice already acknowledged at Sat 07 Jun 08:05 CEST."
    assert second.handover.acked_by == "U0ALICE"
    assert second.handover.counted_acks == 2
    assert len([m for m in messages(db) if m[0] == "update"]) == 1


def test_an_ack_before_the_message_reached_slack_updates_it_once_its_ts_is_known(db, posted):
    service, handover_id = posted
    service.acknowledge(alice, handover_id, now=DAY_STARTS + 2 * MINUTE)
    assert [m for m in messages(db) if m[0] == "update"] == []

    assert service.record_message(handover_id, ts="1717.000200", now=DAY_STARTS + 3 * MINUTE)
    assert not service.record_message(handover_id, ts="1717.000200", now=DAY_STARTS + 4 * MINUTE)

    (update,) = [m for m in messages(db) if m[0] == "update"]
    assert update[3]["ts"] == "1717.000200"


def test_acknowledging_a_handover_that_does_not_exist_says_so(posted):
    service, _ = posted

    with pytest.raises(UnknownHandover, match="No handover has id 999"):
        service.acknowledge(alice, 999, now=DAY_STARTS)


# ------------------------------------------------------------------ reminders and escalation


def test_an_unacknowledged_handover_is_reminded_then_escalated_once_each(db, posted):
    service, handover_id = posted
    service.record_message(handover_id, ts="1717.000100", now=DAY_STARTS + MINUTE)
    fired = []
    now = DAY_STARTS + MINUTE
    while now < DAY_STARTS + 3 * HOUR:
        fired += [(action, at) for (_, action), at in zip(service.send_reminders(now), [now] * 9)]
        now += MINUTE

    assert fired == [("remind", DAY_STARTS + 31 * MINUTE), ("escalate", DAY_STARTS + 46 * MINUTE)]
    chase = [m for m in messages(db) if m[3]["event"] in ("handover.reminder", "handover.escalation")]
    assert [(m[2], m[3]["event"], m[3]["mentions"]) for m in chase] == [
        ("1717.000100", "handover.reminder", {"users": ["U0ALICE"], "groups": ["S0DAY"]}),
        ("1717.000100", "handover.escalation", {"users": [], "groups": ["S0LEADS"]}),
    ]
    assert chase[0][3]["text"].startswith("Reminder: nobody on the day shift has acknowledged this handover after 30m")
    assert [a for a in audit_actions(db) if a[0] in ("handover.reminded", "handover.escalated")] == [
        ("handover.reminded", "gpuops"), ("handover.escalated", "gpuops")]
    view = service.get(handover_id)
    assert (view.reminded_at, view.escalated_at) == (DAY_STARTS + 31 * MINUTE, DAY_STARTS + 46 * MINUTE)


def test_reminders_due_only_reads_and_an_ack_stops_the_chase(db, posted):
    service, handover_id = posted
    late = DAY_STARTS + 40 * MINUTE

    assert [a for _, a in service.reminders_due(late)] == ["remind"]
    assert [a for _, a in service.reminders_due(late)] == ["remind"]
    service.acknowledge(alice, handover_id, now=late)

    assert service.reminders_due(late) == []
    assert service.send_reminders(late + HOUR) == []


def test_a_rotation_without_an_escalation_target_only_reminds(db, source):
    plain = CONFIG.model_copy(update={"rotations": (CONFIG.rotations[0].model_copy(update={"escalation": None}),)})
    service = HandoverService(db, plain)
    service.post_due(source, now=DAY_STARTS + MINUTE)

    fired = [a for t in range(0, 300, 5) for _, a in service.send_reminders(DAY_STARTS + t * MINUTE)]

    assert fired == ["remind"]


def test_only_the_latest_handover_of_a_rotation_is_chased(db, source):
    service = HandoverService(db, CONFIG)
    service.post_due(source, now=DAY_STARTS + MINUTE)
    service.post_due(source, now=berlin(7, 20, 1))

    due = service.reminders_due(berlin(7, 21))

    assert [(v.shift, a) for v, a in due] == [("night", "remind")]


# ------------------------------------------------------------------ what storage adds to the checklist


def a_plan(kind: str, node: str) -> dict:
    wave = Wave(0, (NodeName(node),), (NodeStep("cordon", NodeName(node)),))
    return plan_to_json(Plan(kind=kind, pool="train-a", waves=(wave,), summary=PlanSummary(),  # type: ignore[arg-type]
                             created_for="U0OTTO"))


def test_runs_in_flight_and_the_last_drain_come_from_storage(db, source):
    done = stored_requests.create(db, kind="drain", pool="train-a", targets=["gpu-01"], window_start=None,
                                  window_end=None, reason="x", requester="U0OTTO", requester_name="Otto",
                                  plan=a_plan("drain", "gpu-01"), plan_hash="a" * 64, approvals_required=0,
                                  expires_at=DAY_STARTS, at=DAY_STARTS - 30 * HOUR)
    stored_requests.transition(db, id=done.id, expected="pending", new="done", at=DAY_STARTS - 20 * HOUR)
    finished = stored_runs.create(db, request_id=done.id, dry_run=False, at=DAY_STARTS - 29 * HOUR)
    for s in stored_steps.add(db, run_id=finished.id, steps=[NewStep(0, "gpu-01", 0, "cordon"),
                                                              NewStep(0, "gpu-01", 1, "drain")]):
        stored_steps.transition(db, id=s.id, expected="pending", new="done", at=DAY_STARTS - 28 * HOUR)
    stored_runs.transition(db, id=finished.id, expected="pending", new="succeeded", at=DAY_STARTS - 28 * HOUR)
    busy = stored_requests.create(db, kind="upgrade", pool="train-a", targets=["gpu-02"], window_start=None,
                                  window_end=None, reason="y", requester="U0OTTO", requester_name="Otto",
                                  plan=a_plan("upgrade", "gpu-02"), plan_hash="b" * 64, approvals_required=0,
                                  expires_at=DAY_STARTS, at=DAY_STARTS - 2 * HOUR)
    stored_requests.transition(db, id=busy.id, expected="pending", new="running", at=DAY_STARTS - HOUR)
    run = stored_runs.create(db, request_id=busy.id, dry_run=False, at=DAY_STARTS - HOUR)
    stored_runs.transition(db, id=run.id, expected="pending", new="running", at=DAY_STARTS - HOUR)
    cordon, driver = stored_steps.add(db, run_id=run.id, steps=[NewStep(0, "gpu-02", 0, "cordon"),
                                                                 NewStep(0, "gpu-02", 1, "driver")])
    stored_steps.transition(db, id=cordon.id, expected="pending", new="done", at=DAY_STARTS - 50 * MINUTE)
    stored_steps.transition(db, id=driver.id, expected="pending", new="running", at=DAY_STARTS - 40 * MINUTE)

    service = HandoverService(db, CONFIG)
    (view,) = service.post_due(source, now=DAY_STARTS + MINUTE)
    checklist = view.checklist

    assert [d.text for d in checklist.last_drains] == [
        "last drained Fri 06 Jun 04:00 CEST (1d 4h ago): 1 node by %s (drain, succeeded)" % done.id]
    (in_flight,) = checklist.in_flight
    assert in_flight.text == (f"{run.id}: upgrade of train-a for {busy.id}: wave 1, driver on gpu-02 running "
                              "for 41m; 1/2 steps done")


# ------------------------------------------------------------------ the commands


def test_gpu_handover_shows_the_current_checklist_with_the_stored_handovers_button(db, posted, source):
    services = Services(config=CONFIG, fleet=source, database=db)
    _, handover_id = posted

    reply = dispatch("/gpu handover", actor=carol, services=services, now=DAY_STARTS + HOUR)

    assert reply.ok and reply.title == "Handover to the day shift · GPU platform"
    assert reply.sections[0].title == "Needs action"
    assert "gpu-02 is cordoned by hand" in reply.sections[0].notices[0].text
    assert [(i.action, i.value) for i in reply.intents] == [(ACK_ACTION, str(handover_id))]
    assert reply.visibility == "in_channel"


def test_gpu_handover_names_an_unknown_rotation_and_the_known_ones(db, source):
    services = Services(config=CONFIG, fleet=source, database=db)

    reply = dispatch("/gpu handover sre", actor=carol, services=services, now=DAY_STARTS)

    assert not reply.ok
    assert reply.summary == "No rotation named 'sre' (rotations: gpu-oncall)."


def test_gpu_handover_history_lists_past_handovers_with_their_acknowledgements(db, source):
    service = HandoverService(db, CONFIG)
    (day,) = service.post_due(source, now=DAY_STARTS + MINUTE)
    service.acknowledge(bob, day.id, now=DAY_STARTS + 3 * MINUTE)
    service.acknowledge(alice, day.id, now=DAY_STARTS + 4 * MINUTE)
    service.post_due(source, now=berlin(7, 20, 30))
    services = Services(config=CONFIG, fleet=source, database=db)

    reply = dispatch("/gpu handover history gpu-oncall 5", actor=carol, services=services, now=berlin(7, 21))

    assert reply.title == "Handovers of gpu-oncall"
    assert reply.summary == "Last 2: 1 acknowledged, 1 posted late"
    assert reply.sections[0].table.rows == (
        ("Sat 07 Jun 20:00 CEST", "night", "late (not in Slack yet)", "nobody yet", "-", "0 counted"),
        ("Sat 07 Jun 08:00 CEST", "day", "on time (not in Slack yet)", "Alice", "Sat 07 Jun 08:04 CEST",
         "1 counted, 1 not on shift"),
    )


def test_the_handover_commands_need_the_viewer_role(db, source):
    services = Services(config=CONFIG, fleet=source, database=db)
    stranger = CONFIG.actor("U0NOBODY")

    reply = dispatch("/gpu handover history", actor=stranger, services=services, now=DAY_STARTS)

    assert not reply.ok and "needs the viewer role" in reply.summary


def _failed_run(db: Database, *, kind: str, node: str, step_kind: str, at: dt.datetime, reason: str,
                result: dict | None = None) -> tuple[str, str]:
    """A request whose run halted at `step_kind` on `node` at `at`, as the engine stores it."""
    request = stored_requests.create(db, kind=kind, pool="train-a", targets=[node], window_start=None,
                                     window_end=None, reason="x", requester="U0OTTO", requester_name="Otto",
                                     plan=a_plan(kind, node), plan_hash="c" * 64, approvals_required=0,
                                     expires_at=at, at=at - HOUR)
    stored_requests.transition(db, id=request.id, expected="pending", new="running", at=at - HOUR)
    run = stored_runs.create(db, request_id=request.id, dry_run=False, at=at - HOUR)
    stored_runs.transition(db, id=run.id, expected="pending", new="running", at=at - HOUR)
    cordon, failing = stored_steps.add(db, run_id=run.id, steps=[NewStep(0, node, 0, "cordon"),
                                                                  NewStep(0, node, 1, step_kind)])
    stored_steps.transition(db, id=cordon.id, expected="pending", new="done", at=at - HOUR)
    stored_steps.transition(db, id=failing.id, expected="pending", new="running", at=at - HOUR)
    stored_steps.transition(db, id=failing.id, expected="running", new="failed", at=at, error=reason,
                            detail={"result": result or {}})
    stored_runs.transition(db, id=run.id, expected="running", new="failed", at=at, halted_reason=reason)
    audit.append(db, actor=audit.GPUOPS_ACTOR, k8s_identity=None, action="run.failed", target="train-a", at=at,
                 request_id=request.id, run_id=run.id, before="running", after="failed",
                 detail={"node": node, "kind": step_kind, "reason": reason, "left_cordoned": [node]})
    return run.id, request.id


def test_the_handover_lists_the_runs_that_failed_since_the_previous_one_named_by_what_went_wrong(db, source):
    canary, canary_request = _failed_run(db, kind="upgrade", node="gpu-02", step_kind="gpu-check",
                                         at=DAY_STARTS - 2 * HOUR, reason="the check pod on gpu-02 failed")
    blocked, _ = _failed_run(db, kind="drain", node="gpu-02", step_kind="evict", at=DAY_STARTS - HOUR,
                             reason="gpu-02: eviction of a/b is blocked", result={"blocked": {"a/b": "no"}})
    _failed_run(db, kind="drain", node="gpu-02", step_kind="validate", at=DAY_STARTS - 13 * HOUR,
                reason="before the night shift's start")  # the shift before the outgoing one: not listed

    (view,) = HandoverService(db, CONFIG).post_due(source, now=DAY_STARTS + MINUTE)

    texts = [i.text for i in view.checklist.failures]
    assert [i.subject for i in view.checklist.failures] == [canary, blocked]
    assert texts[0].startswith(f"{canary}: upgrade of train-a for {canary_request} halted: its canary failed on "
                               "gpu-02 (")
    assert "Still cordoned: gpu-02. Otto (who asked) or an operator of train-a acts: roll it back" in texts[0]
    assert "halted: a PodDisruptionBudget blocked the drain of gpu-02" in texts[1]
