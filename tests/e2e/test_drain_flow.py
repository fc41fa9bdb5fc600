"""A drain window from request to run: alice asks with `/gpu drain`, bob approves the
plan, and the leader's window-start job starts the run when the window begins; a window
that passed while no replica led is marked missed and alice is told in the thread.
Real SQLite, the real scheduler jobs, a fleet from plain values, freezegun for time."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from freezegun import freeze_time

from bot.scheduler import LeaderScheduler, leader_jobs
from bot.wiring import Runtime, runtime_from_fleet_source
from commands.catalog import dispatch
from commands.reply import Reply
from tests.e2e.harness import CHANNEL, ROOT, StaticFleet, build_demo_fleet
from workflows.config import GpuopsConfig

UTC = dt.timezone.utc
MINUTE = dt.timedelta(minutes=1)
# Wednesday; training-a drains on weekend nights (Berlin), one approval.
WEDNESDAY = "2026-12-02 10:00:00"
SAT_0300_BERLIN = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)


def drain_config() -> GpuopsConfig:
    raw = yaml.safe_load((ROOT / "deploy" / "config.example.yaml").read_text())
    raw["pools"]["training-a"]["windows"] = [
        {"days": ["sat", "sun"], "start": "02:00", "end": "06:00", "timezone": "Europe/Berlin"}]
    raw["pools"]["training-a"]["approvals"] = {"drain": 1}
    return GpuopsConfig.model_validate(raw)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    config = drain_config()
    runtime = runtime_from_fleet_source(config, StaticFleet(build_demo_fleet(nodes=9, unhealthy=0, config=config)),
                                        tmp_path / "state" / "gpuops.db")
    yield runtime
    runtime.close()


def gpu(runtime: Runtime, who: str, text: str) -> Reply:
    return dispatch(text, actor=runtime.config.actor(who), services=runtime.services(),
                    now=dt.datetime.now(UTC), channel=CHANNEL)


def ask_and_approve(runtime: Runtime) -> str:
    asked = gpu(runtime, "U0ALICE", "/gpu drain training-a-001 at sat 03:00 for 2h firmware")
    assert asked.ok, asked.summary
    request = runtime.services().requests.get(asked.title.split()[1])  # type: ignore[union-attr]
    assert request.state == "pending" and request.window_start == SAT_0300_BERLIN
    approved = gpu(runtime, "U0BOB", f"/gpu approve {request.id} {request.short_hash}")
    assert approved.ok and approved.summary.startswith("approved"), approved.summary  # type: ignore[union-attr]
    return request.id


def thread_texts(runtime: Runtime, request_id: str) -> list[str]:
    rows = runtime.database.get().query("SELECT payload FROM outbox ORDER BY id")
    payloads = [json.loads(r["payload"]) for r in rows]
    return [p["text"] for p in payloads if p.get("request_id") == request_id]


def test_an_approved_drain_starts_its_run_when_its_window_begins_and_not_before(runtime):
    scheduler = LeaderScheduler(leader_jobs(runtime))
    with freeze_time(WEDNESDAY, tz_offset=0) as frozen:
        request_id = ask_and_approve(runtime)

        frozen.move_to(SAT_0300_BERLIN - MINUTE)
        assert scheduler.run("window-starts").outcome == "done"
        assert runtime.services().runs.for_request(request_id) == []  # type: ignore[union-attr]

        frozen.move_to(SAT_0300_BERLIN)
        assert scheduler.run("window-starts").outcome == "done"

    (run,) = runtime.services().runs.for_request(request_id)  # type: ignore[union-attr]
    assert run.state == "pending" and [s.kind for s in run.steps] == [
        "cordon", "evict", "hold", "validate", "uncordon"]
    assert runtime.services().requests.get(request_id).state == "running"  # type: ignore[union-attr]


def test_a_drain_window_that_passed_while_the_bot_was_down_is_marked_missed_and_the_requester_told(runtime):
    scheduler = LeaderScheduler(leader_jobs(runtime))
    with freeze_time(WEDNESDAY, tz_offset=0) as frozen:
        request_id = ask_and_approve(runtime)

        frozen.move_to(SAT_0300_BERLIN + 20 * MINUTE)  # no replica led at the window start
        assert scheduler.run("window-starts").outcome == "done"
        frozen.tick(MINUTE)
        assert scheduler.run("window-starts").outcome == "done"

    assert runtime.services().runs.for_request(request_id) == []  # type: ignore[union-attr]
    assert runtime.services().requests.get(request_id).state == "missed"  # type: ignore[union-attr]
    missed = [t for t in thread_texts(runtime, request_id) if "was not started" in t]
    assert len(missed) == 1 and missed[0].startswith("alice, ") and "Nothing was drained" in missed[0]


def test_a_drain_whose_window_began_moments_before_the_leader_looked_still_starts(runtime):
    scheduler = LeaderScheduler(leader_jobs(runtime))
    with freeze_time(WEDNESDAY, tz_offset=0) as frozen:
        request_id = ask_and_approve(runtime)

        frozen.move_to(SAT_0300_BERLIN + 2 * MINUTE)  # a leader change, within the grace
        assert scheduler.run("window-starts").outcome == "done"

    assert runtime.services().requests.get(request_id).state == "running"  # type: ignore[union-attr]
    assert len(runtime.services().runs.for_request(request_id)) == 1  # type: ignore[union-attr]
