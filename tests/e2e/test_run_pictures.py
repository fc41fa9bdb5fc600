"""A finished run's thread gets its timeline: the notifier posts the run's last word, then
uploads the picture into the same thread through the upload API the fake Slack enforces
(files.getUploadURLExternal, the bytes, files.completeUploadExternal). An upload Slack
refuses leaves the text as it was, sent once. Real SQLite, the run and its steps stored as
the engine leaves them, freezegun for time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from freezegun import freeze_time

from bot.notifier import Notifier, OutboxSlack
from bot.slack_api import web_client
from bot.wiring import Runtime
from storage import outbox
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.ids import RequestId
from storage.steps import NewStep
from testenv.fakeslack import FakeSlackWebApi
from tests.e2e.harness import CHANNEL, submit_upgrade

UTC = dt.timezone.utc
START = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
KINDS = ("cordon", "evict", "driver", "validate", "uncordon")


@pytest.fixture
def notifier(slack: FakeSlackWebApi, runtime: Runtime) -> Iterator[Notifier]:
    notifier = Notifier(runtime, OutboxSlack.like(web_client(slack.bot_token, base_url=slack.base_url)))
    yield notifier
    notifier.stop()


def deliver_all(notifier: Notifier) -> None:
    for _ in range(20):
        if notifier.deliver_due() == 0:
            return
    raise AssertionError("the outbox never ran dry")


def finished_run(runtime: Runtime, *, halt: bool) -> tuple[str, str]:
    """An upgrade of two nodes in two waves, run to its end (or halted at the second
    node's driver) as the engine stores it, and its last word queued: (request, root ts)."""
    db = runtime.database.get()
    view = submit_upgrade(runtime, now=START - dt.timedelta(hours=1))
    request = stored_requests.get(db, id=RequestId(view.id))
    assert request is not None
    run = stored_runs.create(db, request_id=request.id, dry_run=False, at=START)
    stored_runs.transition(db, id=run.id, expected="pending", new="running", at=START)
    steps = stored_steps.add(db, run_id=run.id, steps=[
        NewStep(wave=wave, node=node, seq=seq, kind=kind)  # type: ignore[arg-type]
        for wave, node in enumerate(("serving-a-000", "serving-a-003")) for seq, kind in enumerate(KINDS)])
    at = START
    for step in steps:
        at += dt.timedelta(minutes=1)
        stored_steps.transition(db, id=step.id, expected="pending", new="running", at=at)
        at += dt.timedelta(minutes=2)
        if halt and step.node == "serving-a-003" and step.kind == "driver":
            stored_steps.transition(db, id=step.id, expected="running", new="failed", at=at, error="no driver pod")
            break
        stored_steps.transition(db, id=step.id, expected="running", new="done", at=at)
    at += dt.timedelta(minutes=1)
    state = "failed" if halt else "succeeded"
    stored_runs.transition(db, id=run.id, expected="running", new=state, at=at,
                           halted_reason="the driver never came up" if halt else None)
    outbox.enqueue(db, channel=CHANNEL, kind="post", at=at, dedupe_key=f"{run.id}/{state}",
                   payload={"event": f"run.{state}", "request_id": request.id, "run_id": run.id,
                            "pool": request.pool, "kind": request.kind, "state": state,
                            "text": f"{run.id} {'halted' if halt else 'finished'}", "dry_run": False})
    return request.id, run.id


@freeze_time(START + dt.timedelta(hours=1))
def test_a_run_that_finished_gets_its_timeline_in_the_requests_thread_after_its_last_word(
        slack, runtime, notifier):
    request_id, run_id = finished_run(runtime, halt=False)

    deliver_all(notifier)

    root, last_word = slack.calls("chat.postMessage")
    assert run_id in last_word.args["text"] and last_word.args["thread_ts"] == root.response["ts"]
    (picture,) = slack.workspace.files()
    assert picture.completed and picture.channel == CHANNEL and picture.thread_ts == root.response["ts"]
    assert picture.filename == f"{run_id}-timeline.png" and run_id in (picture.title or "")
    assert picture.content is not None and picture.content[:8] == b"\x89PNG\r\n\x1a\n"
    assert 10_000 < len(picture.content) < 500_000
    upload_calls = [c.method for c in slack.calls() if c.method.startswith("files.")]
    assert upload_calls == ["files.getUploadURLExternal", "files.completeUploadExternal"]


@freeze_time(START + dt.timedelta(hours=1))
def test_a_halted_run_gets_its_timeline_too(slack, runtime, notifier):
    _, run_id = finished_run(runtime, halt=True)

    deliver_all(notifier)

    (picture,) = slack.workspace.files()
    assert picture.completed and picture.filename == f"{run_id}-timeline.png"


@freeze_time(START + dt.timedelta(hours=1))
def test_an_upload_slack_refuses_leaves_the_runs_last_word_in_the_thread_sent_once(slack, runtime, notifier):
    _, run_id = finished_run(runtime, halt=False)
    slack.fail_next("files.completeUploadExternal", "access_denied", status=200)

    deliver_all(notifier)
    deliver_all(notifier)

    assert slack.last("files.completeUploadExternal").error == "access_denied"
    texts = [c.args["text"] for c in slack.calls("chat.postMessage")]
    assert sum(run_id in t for t in texts) == 1
    assert not [f for f in slack.workspace.files() if f.completed]
    rows = runtime.database.get().query("SELECT state FROM outbox")
    assert {r["state"] for r in rows} == {"sent"}


@freeze_time(START + dt.timedelta(hours=1))
def test_messages_in_the_thread_that_do_not_end_a_run_carry_no_picture(slack, runtime, notifier):
    view = submit_upgrade(runtime)

    deliver_all(notifier)

    assert view.id in slack.last("chat.postMessage").args["text"]
    assert slack.workspace.files() == []


@freeze_time(START + dt.timedelta(hours=1))
def test_a_run_aborted_before_any_step_began_gets_its_text_and_no_empty_picture(slack, runtime, notifier):
    db = runtime.database.get()
    view = submit_upgrade(runtime, now=START - dt.timedelta(hours=1))
    run = stored_runs.create(db, request_id=RequestId(view.id), dry_run=False, at=START)
    stored_steps.add(db, run_id=run.id, steps=[NewStep(wave=0, node="serving-a-000", seq=0, kind="cordon")])  # type: ignore[arg-type]
    stored_runs.transition(db, id=run.id, expected="pending", new="aborted", at=START, halted_reason="aborted")
    outbox.enqueue(db, channel=CHANNEL, kind="post", at=START, dedupe_key=f"{run.id}/abort",
                   payload={"event": "run.abort", "request_id": view.id, "run_id": run.id, "state": "aborted",
                            "text": f"{run.id} aborted"})

    deliver_all(notifier)

    assert run.id in slack.last("chat.postMessage").args["text"]
    assert slack.workspace.files() == []
