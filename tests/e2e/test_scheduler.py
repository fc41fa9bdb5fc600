"""The leader's scheduled jobs over a real SQLite file and the fake Slack, on a frozen
clock: the demo rotation's handover reaches Slack once per shift change however the bot
restarts around it; pending requests expire; approved requests start their run when
their window begins; old delivery keys are forgotten; and one failing job leaves the
others running."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from freezegun import freeze_time

from bot.notifier import Notifier, OutboxSlack
from bot.scheduler import LeaderScheduler, leader_jobs
from bot.slack_api import web_client
from bot.wiring import Runtime, runtime_from_fleet_source
from storage import audit, idempotency
from testenv.fakeslack import FakeSlackWebApi
from tests.e2e.harness import CHANNEL, StaticFleet, a_plan, buttons_of, submit_upgrade, text_of
from workflows.config import GpuopsConfig

UTC = dt.timezone.utc
MINUTE = dt.timedelta(minutes=1)
# The demo rotation (deploy/config.example.yaml) changes shift at 08:00 and 20:00 in
# Berlin: 06:00 and 18:00 UTC in June.
DAY_SHIFT = dt.datetime(2025, 6, 7, 6, 0, tzinfo=UTC)
NIGHT_SHIFT = dt.datetime(2025, 6, 7, 18, 0, tzinfo=UTC)


class Leader:
    """What the lease holder runs, driven tick by tick on the frozen clock: every job
    once (as the timer would each minute), then the notifier until the outbox is dry."""

    def __init__(self, config: GpuopsConfig, fleet: StaticFleet, path: Path, slack: FakeSlackWebApi) -> None:
        self.runtime: Runtime = runtime_from_fleet_source(config, fleet, path)
        self.scheduler = LeaderScheduler(leader_jobs(self.runtime))
        self.notifier = Notifier(self.runtime, OutboxSlack.like(web_client(slack.bot_token, base_url=slack.base_url)))

    def tick(self) -> None:
        runs = self.scheduler.run_all()
        assert all(r.outcome == "done" for r in runs), runs
        while self.notifier.deliver_due():
            pass

    def run_until(self, until: dt.datetime, frozen, *, every: dt.timedelta = MINUTE) -> None:
        while dt.datetime.now(UTC) < until:
            self.tick()
            frozen.tick(every)

    def close(self) -> None:
        self.scheduler.stop()
        self.runtime.close()


@pytest.fixture
def leader(config, fleet_source, db_path, slack) -> Iterator[Leader]:
    leader = Leader(config, fleet_source, db_path, slack)
    yield leader
    leader.close()


def handover_posts(slack: FakeSlackWebApi) -> list:
    """Top-level posts carrying the Acknowledge button: the checklists themselves."""
    return [c for c in slack.calls("chat.postMessage")
            if c.ok and not c.args.get("thread_ts") and "Acknowledge" in buttons_of(c.args.get("blocks"))]


def test_the_handover_reaches_slack_once_per_shift_change_when_the_bot_restarts_right_after_posting(
        config, fleet_source, db_path, slack):
    with freeze_time(DAY_SHIFT - 3 * MINUTE) as frozen:
        first = Leader(config, fleet_source, db_path, slack)
        first.run_until(DAY_SHIFT + MINUTE, frozen)
        assert len(handover_posts(slack)) == 1
        first.close()

        restarted = Leader(config, fleet_source, db_path, slack)
        try:
            restarted.run_until(DAY_SHIFT + 10 * MINUTE, frozen)
            assert len(handover_posts(slack)) == 1
            restarted.run_until(NIGHT_SHIFT + 2 * MINUTE, frozen, every=10 * MINUTE)
        finally:
            restarted.close()

    day, night = handover_posts(slack)
    assert "day" in day.args["text"].lower() and "night" in night.args["text"].lower()


def test_a_shift_change_missed_while_the_bot_was_down_is_posted_once_late(config, fleet_source, db_path, slack):
    with freeze_time(DAY_SHIFT - 3 * MINUTE) as frozen:
        first = Leader(config, fleet_source, db_path, slack)
        first.run_until(DAY_SHIFT - MINUTE, frozen)
        first.close()
        assert handover_posts(slack) == []

        frozen.tick(20 * MINUTE)  # down across 08:00
        restarted = Leader(config, fleet_source, db_path, slack)
        try:
            restarted.run_until(DAY_SHIFT + 30 * MINUTE, frozen)
        finally:
            restarted.close()

    (late,) = handover_posts(slack)
    assert "late" in late.args["text"].lower()


def test_each_handover_post_and_the_log_carry_the_audit_chain_head(leader, slack, caplog):
    caplog.set_level(logging.INFO, logger="gpuops.bot.scheduler")
    with freeze_time(DAY_SHIFT - MINUTE) as frozen:
        submit_upgrade(leader.runtime, now=DAY_SHIFT - MINUTE)
        head = audit.head_of(leader.runtime.database.get()).text
        leader.run_until(DAY_SHIFT + MINUTE, frozen)

    (post,) = handover_posts(slack)
    assert f"Audit chain head {head} (`gpuops audit verify --expected {head}`" in text_of(post.args["blocks"])
    assert any(f"audit chain head {head}" in r.getMessage() for r in caplog.records)


def test_pending_requests_expire_on_the_tick_and_their_thread_hears_of_it(leader, slack):
    with freeze_time("2025-06-02 09:00:00", tz_offset=0) as frozen:
        view = submit_upgrade(leader.runtime)
        leader.tick()
        frozen.tick(dt.timedelta(hours=24))
        leader.tick()

    assert leader.runtime.services().requests.get(view.id).state == "expired"
    reply = slack.last("chat.postMessage")
    assert reply.args.get("thread_ts") and "expired" in reply.args["text"]


def test_an_approved_request_starts_its_run_when_its_window_begins_and_only_once(leader):
    runtime = leader.runtime
    with freeze_time("2025-06-02 09:00:00", tz_offset=0) as frozen:
        start = dt.datetime(2025, 6, 2, 10, 0, tzinfo=UTC)
        services = runtime.services()
        view = services.requests.submit(
            runtime.config.actor("U0ALICE"), kind="upgrade", pool="training-a",
            targets=["training-a-000"], plan=a_plan("training-a"), window_start=start,
            window_end=start + dt.timedelta(hours=4), reason="580.105.08 in the window", channel=CHANNEL,
            now=dt.datetime.now(UTC))
        services.requests.approve(runtime.config.actor("U0BOB"), view.id, plan_hash=view.plan_hash,
                                  now=dt.datetime.now(UTC))

        leader.run_until(start - MINUTE, frozen, every=10 * MINUTE)
        assert runtime.services().runs.for_request(view.id) == []

        leader.run_until(start + 5 * MINUTE, frozen)

    (run,) = runtime.services().runs.for_request(view.id)
    assert run.state == "pending" and not run.run.dry_run
    assert runtime.services().requests.get(view.id).state == "running"


def test_an_approved_request_whose_window_has_passed_is_marked_missed_and_not_started(leader, slack):
    runtime = leader.runtime
    with freeze_time("2025-06-02 09:00:00", tz_offset=0) as frozen:
        start = dt.datetime(2025, 6, 2, 9, 30, tzinfo=UTC)
        services = runtime.services()
        view = services.requests.submit(
            runtime.config.actor("U0ALICE"), kind="upgrade", pool="training-a",
            targets=["training-a-000"], plan=a_plan("training-a"), window_start=start,
            window_end=start + dt.timedelta(hours=1), reason="a short window", channel=CHANNEL,
            now=dt.datetime.now(UTC))
        services.requests.approve(runtime.config.actor("U0BOB"), view.id, plan_hash=view.plan_hash,
                                  now=dt.datetime.now(UTC))
        frozen.tick(dt.timedelta(hours=2))  # no leader while the window was open

        leader.tick()
        leader.tick()  # a later tick does not start it late either

    assert runtime.services().runs.for_request(view.id) == []
    assert runtime.services().requests.get(view.id).state == "missed"
    told = [c.args["text"] for c in slack.calls("chat.postMessage") if c.ok and c.args.get("thread_ts")]
    assert len([t for t in told if "was not started" in t]) == 1, told


def test_delivery_keys_older_than_a_week_are_forgotten(leader):
    db = leader.runtime.database.get()
    with freeze_time("2025-06-02 09:00:00", tz_offset=0) as frozen:
        idempotency.remember(db, key="envelope-old", scope="slack-retry", at=dt.datetime.now(UTC))
        frozen.tick(dt.timedelta(days=6))
        idempotency.remember(db, key="envelope-recent", scope="slack-retry", at=dt.datetime.now(UTC))
        frozen.tick(dt.timedelta(days=1, hours=1))

        assert leader.scheduler.run("idempotency").outcome == "done"

    assert idempotency.recall(db, key="envelope-old", scope="slack-retry") is None
    assert idempotency.recall(db, key="envelope-recent", scope="slack-retry") is not None


class BrokenFleet:
    def fleet(self, now: dt.datetime):
        raise ConnectionError("the watch cache is not synced")


def test_a_failing_job_does_not_stop_the_other_jobs(config, db_path, slack):
    runtime = runtime_from_fleet_source(config, BrokenFleet(), db_path)
    scheduler = LeaderScheduler(leader_jobs(runtime))
    try:
        with freeze_time(DAY_SHIFT - MINUTE) as frozen:
            view = submit_upgrade(runtime)
            scheduler.run_all()
            frozen.tick(dt.timedelta(hours=25))  # a handover is due, and the request has expired
            runs = {r.job: r.outcome for r in scheduler.run_all()}
        assert runs == {"handovers": "failed", "expiry": "done", "window-starts": "done", "stale-marks": "done",
                        "idempotency": "done", "outbox": "done", "capacity": "failed"}
        assert runtime.services().requests.get(view.id).state == "expired"
    finally:
        runtime.close()


def test_the_real_timer_runs_every_job_as_the_scheduler_starts(runtime):
    scheduler = LeaderScheduler(leader_jobs(runtime)).start()
    try:
        runs = scheduler.runs.wait_for(lambda rs: len(rs) == 7)
    finally:
        scheduler.stop()
    assert {(r.job, r.outcome) for r in runs} == {
        ("handovers", "done"), ("expiry", "done"), ("window-starts", "done"), ("stale-marks", "done"),
        ("idempotency", "done"), ("outbox", "done"), ("capacity", "done")}
