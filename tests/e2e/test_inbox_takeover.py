"""A replica that acknowledged a command and died before answering it loses nothing: the
ack kept the command in the database's inbox, and once the dead replica's heartbeat is old
the other replica takes it over and answers it once, on the command's response_url.

Two replicas over one database file: each a runtime with its own name and a bot over the
fake Slack. Replica A is a Bolt app whose work never runs after its ack (its process died
there); replica B's heartbeat (bot.heartbeat) finds what A left and runs it again, with
the time it looks given (A never beats again, so B sees it silent past the dead-after)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from slack_bolt import App, BoltRequest

from bot.heartbeat import HeartbeatSettings, ReplicaHeartbeat
from bot.identity import SlackDirectory
from bot.slack_api import SlackApi, web_client
from bot.slack_app import SlackBot, build_app
from bot.wiring import Runtime, runtime_from_fleet_source
from commands.catalog import dispatch
from storage import inbox
from testenv.fakeslack import FakeSlackWebApi, signing
from tests.e2e.harness import CHANNEL, SECRET, StaticFleet, answer_of, build_demo_fleet
from tests.e2e.test_drain_flow import drain_config

UTC = dt.timezone.utc
SETTINGS = HeartbeatSettings()
DRAIN = "drain training-a-001 at sat 03:00 for 2h firmware"


class _DiedAfterTheAck(Executor):
    """The work the ack handed on never runs: the replica's process died right after the ack."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        return Future()


@dataclass
class Replicas:
    slack: FakeSlackWebApi
    a: Runtime  # acknowledges, then dies
    app_a: App
    b: Runtime  # the survivor
    bot_b: SlackBot

    def command(self, text: str, *, user: str = "U0ALICE", trigger: str) -> tuple[str, str]:
        """`/gpu text` sent to replica A, which acknowledges it; its response_url and inbox key."""
        url = self.slack.response_url(channel=CHANNEL, user=user)
        body = signing.slash_command_body(text=text, user_id=user, channel_id=CHANNEL, response_url=url,
                                          trigger_id=trigger)
        headers = {**signing.sign(body, secret=SECRET, timestamp=int(dt.datetime.now(UTC).timestamp())),
                   "Content-Type": signing.FORM}
        answer = self.app_a.dispatch(BoltRequest(body=body.decode(), headers=headers))
        assert answer.status == 200, answer.body
        return url, f"/gpu:{user}:{trigger}"

    def survivor_looks(self, *, after: dt.timedelta) -> list[inbox.Delivery]:
        """Replica B beats and takes over what A left, `after` from now; waits for the runs."""
        heartbeat = ReplicaHeartbeat(self.b.database, name=self.b.replica, redo=self.bot_b.redo, settings=SETTINGS)
        try:
            return heartbeat.once(dt.datetime.now(UTC) + after)
        finally:
            heartbeat.stop()  # joins the runs taken over


@pytest.fixture
def replicas(slack: FakeSlackWebApi, tmp_path: Path) -> Iterator[Replicas]:
    config = drain_config()
    fleet = StaticFleet(build_demo_fleet(nodes=9, unhealthy=0, config=config))
    database = tmp_path / "gpuops.db"
    a, b = (runtime_from_fleet_source(config, fleet, database) for _ in range(2))
    a.replica, b.replica = "gpuops-a/dead", "gpuops-b/1"
    client = web_client(slack.bot_token, base_url=slack.base_url)
    app_a, _ = build_app(a, client=client, signing_secret=SECRET)
    app_a.listener_runner.lazy_listener_runner.executor = _DiedAfterTheAck()  # type: ignore[attr-defined]
    bot_b = SlackBot(b, SlackApi(client), directory=SlackDirectory(SlackApi(client), config))
    beat_of_a = ReplicaHeartbeat(a.database, name=a.replica, redo=None)
    beat_of_a.once(dt.datetime.now(UTC))  # A's last beat before it died
    beat_of_a.stop()
    try:
        yield Replicas(slack=slack, a=a, app_a=app_a, b=b, bot_b=bot_b)
    finally:
        a.close(), b.close()


def test_a_command_acknowledged_by_a_replica_that_died_is_answered_once_by_the_other(replicas):
    url, key = replicas.command("status", trigger="1001.1")
    assert replicas.slack.response_posts(url) == []  # A acknowledged it and never answered

    # Within the dead-after, A may only be slow: B leaves it alone.
    assert replicas.survivor_looks(after=dt.timedelta(seconds=SETTINGS.dead_after / 2)) == []
    (taken,) = replicas.survivor_looks(after=dt.timedelta(seconds=SETTINGS.dead_after + 1))

    assert taken.key == key
    assert "GPU fleet status" in answer_of(replicas.slack, url)
    assert replicas.survivor_looks(after=dt.timedelta(seconds=SETTINGS.dead_after + 5)) == []
    assert len(replicas.slack.response_posts(url)) == 1
    answered = inbox.get(replicas.b.database.get(), key=key)
    assert answered is not None and (answered.state, answered.claimed_by) == ("answered", "gpuops-b/1")


def test_a_drain_asked_of_a_replica_that_died_after_filing_it_is_answered_with_that_request_not_filed_again(
        replicas):
    url, key = replicas.command(DRAIN, trigger="1002.1")
    # A's work ran as far as filing the request, then the process died before answering.
    filed = dispatch(DRAIN, actor=replicas.a.config.actor("U0ALICE"), services=replicas.a.services(delivery=key),
                     now=dt.datetime.now(UTC), channel=CHANNEL)
    assert filed.ok, filed.summary
    first = re.search(r"req-[0-9a-z]+", filed.title)
    assert first is not None

    replicas.survivor_looks(after=dt.timedelta(seconds=SETTINGS.dead_after + 1))

    answer = answer_of(replicas.slack, url)
    assert re.findall(r"req-[0-9a-z]+", answer)[:1] == [first.group(0)], answer
    rows = replicas.b.database.get().query("SELECT id FROM requests")
    assert [r["id"] for r in rows] == [first.group(0)]
    assert len(replicas.slack.response_posts(url)) == 1


def test_a_command_acknowledged_longer_ago_than_its_response_url_lives_is_abandoned_not_run(replicas, caplog):
    url, key = replicas.command("status", trigger="1003.1")

    assert replicas.survivor_looks(after=dt.timedelta(minutes=31)) == []

    assert replicas.slack.response_posts(url) == []
    abandoned = inbox.get(replicas.b.database.get(), key=key)
    assert abandoned is not None and abandoned.state == "abandoned"
    assert [r.message for r in caplog.records if key in r.message and "not run again" in r.message]
    assert replicas.survivor_looks(after=dt.timedelta(minutes=32)) == []
    assert len([r for r in caplog.records if key in r.message and "not run again" in r.message]) == 1
