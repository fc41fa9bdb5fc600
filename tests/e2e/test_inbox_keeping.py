"""The ack never waits on the database: a command whose inbox row cannot be written in
time (another writer holds SQLite's lock, as a long transaction or a PostgreSQL that went
away would hold it) is acknowledged anyway and answered, and its row, written late, is
closed once the answer went out, so no survivor would run it again.

A real Bolt app over the fake Slack and a real database file; the lock is held by a second
connection, as another process's writer would."""

from __future__ import annotations

import datetime as dt
import logging
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from slack_bolt import App, BoltRequest

from bot.slack_api import web_client
from bot.slack_app import SlackBot, build_app
from bot.wiring import Runtime, runtime_from_fleet_source
from storage import inbox, sqlite_backend
from testenv.fakeslack import FakeSlackWebApi, signing
from testenv.install import wait_until
from tests.e2e.harness import CHANNEL, SECRET, StaticFleet, answer_of, build_demo_fleet
from tests.e2e.test_drain_flow import drain_config

UTC = dt.timezone.utc


@dataclass
class Bot:
    slack: FakeSlackWebApi
    runtime: Runtime
    app: App
    bot: SlackBot
    path: Path

    def command(self, text: str, *, trigger: str) -> tuple[threading.Thread, str, str]:
        """`/gpu text` sent on a thread of its own (the ack may block); its response_url and key."""
        url = self.slack.response_url(channel=CHANNEL, user="U0ALICE")
        body = signing.slash_command_body(text=text, user_id="U0ALICE", channel_id=CHANNEL, response_url=url,
                                          trigger_id=trigger)
        headers = {**signing.sign(body, secret=SECRET, timestamp=int(dt.datetime.now(UTC).timestamp())),
                   "Content-Type": signing.FORM}
        statuses: list[int] = []
        sent = threading.Thread(target=lambda: statuses.append(
            self.app.dispatch(BoltRequest(body=body.decode(), headers=headers)).status))
        sent.start()
        sent.statuses = statuses  # type: ignore[attr-defined]
        return sent, url, f"/gpu:U0ALICE:{trigger}"

    def writer_holds_the_lock(self) -> sqlite3.Connection:
        other = sqlite3.connect(self.path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        return other


@pytest.fixture
def bot(slack: FakeSlackWebApi, tmp_path: Path) -> Iterator[Bot]:
    config = drain_config()
    fleet = StaticFleet(build_demo_fleet(nodes=9, unhealthy=0, config=config))
    path = tmp_path / "gpuops.db"
    runtime = runtime_from_fleet_source(config, fleet, path)
    runtime.replica = "gpuops-a/1"
    app, slack_bot = build_app(runtime, client=web_client(slack.bot_token, base_url=slack.base_url),
                               signing_secret=SECRET)
    try:
        yield Bot(slack=slack, runtime=runtime, app=app, bot=slack_bot, path=path)
    finally:
        runtime.close()


def test_a_command_whose_inbox_row_waits_on_a_writer_is_acknowledged_and_its_late_row_closed(bot, monkeypatch):
    # The row's insert would wait a minute for the lock: far past Slack's 3 s.
    monkeypatch.setattr(sqlite_backend, "BUSY_TIMEOUT", dt.timedelta(seconds=60))
    other = bot.writer_holds_the_lock()
    try:
        sent, url, key = bot.command("status", trigger="2001.1")
        sent.join(timeout=20)
        assert not sent.is_alive(), "the ack waited for the database"
        assert sent.statuses == [200]  # type: ignore[attr-defined]
    finally:
        other.execute("ROLLBACK")
        other.close()

    assert "GPU fleet status" in answer_of(bot.slack, url)

    def closed() -> bool:
        row = inbox.get(bot.runtime.database.get(), key=key)
        return row is not None and row.state == "answered"

    wait_until(closed, timeout=30, what="the late inbox row to be marked answered")
    assert len(bot.slack.response_posts(url)) == 1


def test_while_the_inbox_cannot_be_written_commands_are_answered_and_the_log_says_so_once(bot, caplog):
    caplog.set_level(logging.INFO, logger="gpuops.bot.slack")
    # The database refuses the inbox's rows (as a full disk or a revoked grant would).
    other = sqlite3.connect(bot.path, isolation_level=None)
    other.execute("CREATE TRIGGER refuse BEFORE INSERT ON inbox BEGIN SELECT RAISE(ABORT, 'no room'); END")
    try:
        first, url1, key1 = bot.command("status", trigger="2002.1")
        first.join(timeout=20)
        second, url2, key2 = bot.command("status", trigger="2002.2")
        second.join(timeout=20)
        assert "GPU fleet status" in answer_of(bot.slack, url1)
        assert "GPU fleet status" in answer_of(bot.slack, url2)
    finally:
        other.execute("DROP TRIGGER refuse")
        other.close()

    warnings = [r.getMessage() for r in caplog.records if "cannot keep" in r.getMessage()]
    assert len(warnings) == 1 and key1 in warnings[0] and "no room" in warnings[0], warnings
    db = bot.runtime.database.get()
    assert inbox.get(db, key=key1) is None and inbox.get(db, key=key2) is None

    third, url3, key3 = bot.command("status", trigger="2002.3")
    third.join(timeout=20)
    assert "GPU fleet status" in answer_of(bot.slack, url3)
    assert [r for r in caplog.records if "kept in the inbox before their ack again" in r.getMessage()]
    wait_until(lambda: (row := inbox.get(db, key=key3)) is not None and row.state == "answered", timeout=30,
               what="the third command's row to be answered")


def test_a_kept_delivery_whose_work_never_ran_is_forgotten_after_half_an_hour(bot):
    """Its response_url is dead by then; holding its key for the life of the process would
    be a slow leak. A key whose work comes within the half hour still runs."""
    now = [dt.datetime(2026, 12, 6, 12, 0, tzinfo=UTC)]
    bot.bot.clock = lambda: now[0]
    command = {"command": "/gpu", "text": "status", "user_id": "U0ALICE"}
    bot.bot._keep("command", "/gpu:U0ALICE:3001.1", command)  # its work never runs
    now[0] += dt.timedelta(minutes=29)
    bot.bot._keep("command", "/gpu:U0ALICE:3001.2", command)
    assert bot.bot._first("command", "/gpu:U0ALICE:3001.2")
    now[0] += dt.timedelta(minutes=2)
    bot.bot._keep("command", "/gpu:U0ALICE:3001.3", command)
    assert list(bot.bot._kept) == ["/gpu:U0ALICE:3001.3"]
    assert not bot.bot._first("command", "/gpu:U0ALICE:3001.1")
