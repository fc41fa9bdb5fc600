"""The leader's scheduler with plain jobs: every job runs once as it starts, a job that
raises is logged and runs again without stopping the others, and nothing runs on a
replica that does not lead or after the scheduler stopped."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from bot.scheduler import HOUR, Job, LeaderScheduler

FAST = dt.timedelta(milliseconds=20)


def counting(name: str, every: dt.timedelta, seen: list[str]) -> Job:
    return Job(name, every, lambda now: seen.append(name))


def failing(name: str, every: dt.timedelta) -> Job:
    def work(now: dt.datetime) -> None:
        raise RuntimeError("the database is locked")

    return Job(name, every, work)


def test_every_job_runs_once_as_the_scheduler_starts():
    seen: list[str] = []
    scheduler = LeaderScheduler([counting("handovers", HOUR, seen), counting("expiry", HOUR, seen)]).start()
    try:
        runs = scheduler.runs.wait_for(lambda rs: len(rs) == 2)
    finally:
        scheduler.stop()
    assert sorted(seen) == ["expiry", "handovers"]
    assert {r.outcome for r in runs} == {"done"}


def test_a_job_that_raises_does_not_stop_the_others_and_runs_again_at_its_next_time(caplog):
    seen: list[str] = []
    scheduler = LeaderScheduler([failing("handovers", FAST), counting("expiry", FAST, seen)])
    with caplog.at_level(logging.ERROR, logger="gpuops.bot.scheduler"):
        scheduler.start()
        try:
            scheduler.runs.wait_for(lambda rs: sum(r.job == "handovers" for r in rs) >= 3
                                    and sum(r.job == "expiry" for r in rs) >= 3)
        finally:
            scheduler.stop()

    def while_running(job: str) -> list:
        # NB: a run that fires while stop() is under way is skipped ("the scheduler is
        # stopped"), a race on a loaded machine that says nothing about the job.
        return [r for r in scheduler.runs.all(job) if r.error != "the scheduler is stopped"]

    failed = while_running("handovers")
    assert {r.outcome for r in failed} == {"failed"} and "database is locked" in (failed[0].error or "")
    assert {r.outcome for r in while_running("expiry")} == {"done"} and len(seen) >= 3
    assert any("handovers failed" in r.getMessage() for r in caplog.records)


def test_a_replica_that_does_not_lead_runs_no_job():
    seen: list[str] = []
    leading = False
    scheduler = LeaderScheduler([counting("expiry", HOUR, seen)], gate=lambda: leading)

    assert scheduler.run("expiry").outcome == "skipped"
    leading = True
    assert scheduler.run("expiry").outcome == "done"
    assert seen == ["expiry"]


def test_a_stopped_scheduler_runs_nothing_more():
    seen: list[str] = []
    scheduler = LeaderScheduler([counting("expiry", HOUR, seen)]).start()
    scheduler.runs.wait_for(lambda rs: len(rs) == 1)
    scheduler.stop()

    assert scheduler.run("expiry").outcome == "skipped"
    assert seen == ["expiry"] and not scheduler.running


def test_the_clock_the_jobs_see_is_the_schedulers():
    at = dt.datetime(2025, 6, 7, 6, 0, tzinfo=dt.timezone.utc)
    times: list[dt.datetime] = []
    scheduler = LeaderScheduler([Job("expiry", HOUR, times.append)], clock=lambda: at)

    scheduler.run_all()

    assert times == [at]


def test_two_jobs_cannot_share_a_name():
    with pytest.raises(ValueError, match="unique"):
        LeaderScheduler([Job("expiry", HOUR, print), Job("expiry", HOUR, print)])


def test_a_job_that_says_when_it_is_due_runs_again_then_not_at_its_hourly_interval():
    seen: list[dt.datetime] = []

    def work(now: dt.datetime) -> dt.datetime | None:
        seen.append(now)
        return now + dt.timedelta(milliseconds=200) if len(seen) == 1 else None

    scheduler = LeaderScheduler([Job("window-starts", HOUR, work)]).start()
    try:
        scheduler.runs.wait_for(lambda rs: len(rs) == 2)
        assert seen[1] - seen[0] >= dt.timedelta(milliseconds=200)
    finally:
        scheduler.stop()
    assert len(scheduler.runs.all()) == 2  # the second asked for nothing more


def test_a_poked_job_runs_now_not_at_its_next_hourly_time():
    seen: list[str] = []
    scheduler = LeaderScheduler([counting("window-starts", HOUR, seen)])
    scheduler.poke("window-starts")  # not running yet: nothing happens
    scheduler.start()
    try:
        scheduler.runs.wait_for(lambda rs: len(rs) == 1)
        scheduler.poke("window-starts")
        scheduler.runs.wait_for(lambda rs: len(rs) == 2)
    finally:
        scheduler.stop()
    assert seen == ["window-starts", "window-starts"]
