"""The notifier posts the outbox to a fake Slack from a real SQLite database: a request's
first message opens its thread with the card and later ones reply in it; a handover is
posted and acknowledged in place; reminders mention the shift; rate limits wait as Slack
asks; a channel the bot cannot post to costs that message only; and nothing marked sent
is posted again."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator

import pytest
from freezegun import freeze_time

from bot.notifier import Notifier, OutboxSlack
from bot.slack_api import web_client
from bot.wiring import Runtime
from storage import outbox
from storage import requests as stored_requests
from storage.ids import RequestId
from testenv.fakeslack import FakeSlackWebApi
from tests.e2e.harness import CHANNEL, a_plan, buttons_of, submit_upgrade, text_of
from workflows.handover.service import HandoverService

UTC = dt.timezone.utc
# Saturday 7 June 2025, 06:00 UTC = 08:00 in Berlin: the demo rotation's day shift starts.
DAY_SHIFT = dt.datetime(2025, 6, 7, 6, 0, tzinfo=UTC)


@pytest.fixture
def notifier(slack: FakeSlackWebApi, runtime: Runtime) -> Iterator[Notifier]:
    notifier = Notifier(runtime, OutboxSlack.like(web_client(slack.bot_token, base_url=slack.base_url)))
    yield notifier
    notifier.stop()


def outbox_rows(runtime: Runtime) -> list[outbox.OutboxMessage]:
    rows = runtime.database.get().query("SELECT id FROM outbox ORDER BY id")
    return [outbox.get(runtime.database.get(), id=r["id"]) for r in rows]  # type: ignore[misc]


def thread_of(runtime: Runtime, request_id: str) -> str | None:
    request = stored_requests.get(runtime.database.get(), id=RequestId(request_id))
    assert request is not None
    return request.thread_ts


def approve(runtime: Runtime, request_id: str, by: str, *, now: dt.datetime | None = None) -> None:
    view = runtime.services().requests.get(request_id)
    runtime.services().requests.approve(runtime.config.actor(by), request_id, plan_hash=view.plan_hash,
                                        now=now or dt.datetime.now(UTC))


def deliver_all(notifier: Notifier) -> None:
    """Passes until nothing more is due (each pass takes one message per thread)."""
    for _ in range(20):
        if notifier.deliver_due() == 0:
            return
    raise AssertionError("the outbox never ran dry")


# ------------------------------------------------------------------ requests


def test_a_new_request_opens_its_thread_in_the_channel_with_the_card_and_remembers_the_thread(
        slack, runtime, notifier):
    view = submit_upgrade(runtime)

    deliver_all(notifier)

    post = slack.last("chat.postMessage")
    assert post.ok and post.args["channel"] == CHANNEL and not post.args.get("thread_ts")
    assert view.id in post.args["text"] and "alice" in post.args["text"]
    assert {"Approve", "Deny"} <= set(buttons_of(post.args["blocks"]))
    assert thread_of(runtime, view.id) == post.response["ts"]
    (message,) = outbox_rows(runtime)
    assert message.state == "sent" and message.message_ts == post.response["ts"]


def test_the_next_message_of_a_request_replies_in_its_thread_and_refreshes_the_card(slack, runtime, notifier):
    view = submit_upgrade(runtime)
    deliver_all(notifier)
    root = thread_of(runtime, view.id)

    approve(runtime, view.id, "U0BOB")
    deliver_all(notifier)

    reply = slack.last("chat.postMessage")
    assert reply.ok and reply.args["channel"] == CHANNEL and reply.args["thread_ts"] == root
    assert "bob" in reply.args["text"] and "1" in reply.args["text"]
    update = slack.last("chat.update")
    assert update.args["ts"] == root and "bob" in text_of(update.args["blocks"])
    assert len(slack.workspace.messages(CHANNEL)) == 2


def test_messages_queued_before_the_thread_existed_reply_in_it_in_order(slack, runtime, notifier):
    view = submit_upgrade(runtime)
    approve(runtime, view.id, "U0BOB")
    approve(runtime, view.id, "U0CAROL")

    deliver_all(notifier)

    root, *replies = slack.calls("chat.postMessage")
    assert not root.args.get("thread_ts")
    assert [r.args.get("thread_ts") for r in replies] == [root.response["ts"]] * 2
    assert ["bob" in replies[0].args["text"], "carol" in replies[1].args["text"]] == [True, True]
    # The card at the top no longer offers Approve once the request is approved.
    card = slack.workspace.message(CHANNEL, root.response["ts"])
    assert "Approve" not in buttons_of(card.blocks)


def test_a_step_update_refreshes_the_card_in_place_and_an_update_that_changes_nothing_is_not_sent(
        slack, runtime, notifier):
    view = submit_upgrade(runtime)
    deliver_all(notifier)
    root = thread_of(runtime, view.id)
    db = runtime.database.get()
    approve(runtime, view.id, "U0BOB")
    deliver_all(notifier)
    updates_before = len(slack.calls("chat.update"))

    for n in (1, 2):
        outbox.enqueue(db, channel=CHANNEL, thread_ts=root, kind="update", at=dt.datetime.now(UTC),
                       dedupe_key=f"{view.id}/step/{n}",
                       payload={"event": "step.running", "request_id": view.id, "state": "running",
                                "text": f"step {n} runs"})
    deliver_all(notifier)

    assert len(slack.calls("chat.update")) == updates_before  # the card reads the same as before
    assert len(slack.workspace.messages(CHANNEL)) == 2  # no reply per step
    assert all(m.state == "sent" for m in outbox_rows(runtime))


def test_user_text_in_a_request_can_neither_mention_nor_broadcast(slack, runtime, notifier):
    services = runtime.services()
    services.requests.submit(
        runtime.config.actor("U0ALICE"), kind="upgrade", pool="serving-a", targets=["serving-a-000"],
        plan=a_plan(), window_start=None, window_end=None, reason="<!channel> ping <@U0BOB> & <https://x|y>",
        channel=CHANNEL, now=dt.datetime.now(UTC))

    deliver_all(notifier)

    post = slack.last("chat.postMessage")
    assert "<!channel>" not in post.args["text"] and "<@U0BOB>" not in post.args["text"]
    assert "&lt;!channel&gt;" in post.args["text"] and "&amp;" in post.args["text"]
    assert "<!channel>" not in text_of(post.args["blocks"])


# ------------------------------------------------------------------ handovers


def post_day_handover(runtime: Runtime) -> int:
    service = HandoverService(runtime.database.get(), runtime.config)
    service.post_due(runtime.fleet, now=DAY_SHIFT - dt.timedelta(minutes=1))  # starts watching
    (posted,) = service.post_due(runtime.fleet, now=DAY_SHIFT + dt.timedelta(seconds=30))
    return posted.id


def test_a_handover_is_posted_to_the_rotation_channel_its_ts_recorded_and_an_ack_updates_that_message(
        slack, runtime, notifier):
    handover_id = post_day_handover(runtime)

    deliver_all(notifier)

    post = slack.last("chat.postMessage")
    assert post.ok and post.args["channel"] == "C0OPS" and "Acknowledge" in buttons_of(post.args["blocks"])
    service = HandoverService(runtime.database.get(), runtime.config)
    assert service.get(handover_id).ts == post.response["ts"]

    service.acknowledge(runtime.config.actor("U0BOB"), handover_id, now=DAY_SHIFT + dt.timedelta(minutes=5))
    deliver_all(notifier)

    update = slack.last("chat.update")
    assert update.ok and update.args["ts"] == post.response["ts"] and update.args["channel"] == "C0OPS"
    message = slack.workspace.message("C0OPS", post.response["ts"])
    assert "Acknowledge" not in buttons_of(message.blocks) and "bob" in text_of(message.blocks)
    assert len(slack.calls("chat.postMessage")) == 1


def test_an_ack_that_comes_before_the_post_updates_the_message_once_it_is_posted(slack, runtime, notifier):
    handover_id = post_day_handover(runtime)
    service = HandoverService(runtime.database.get(), runtime.config)
    service.acknowledge(runtime.config.actor("U0ALICE"), handover_id, now=DAY_SHIFT + dt.timedelta(minutes=1))

    deliver_all(notifier)

    post, update = slack.last("chat.postMessage"), slack.last("chat.update")
    assert update.args["ts"] == post.response["ts"]
    assert "Acknowledge" not in buttons_of(slack.workspace.message("C0OPS", post.response["ts"]).blocks)


def test_reminders_and_escalations_reply_in_the_handover_thread_starting_with_their_mentions(
        slack, runtime, notifier):
    handover_id = post_day_handover(runtime)
    deliver_all(notifier)
    root = HandoverService(runtime.database.get(), runtime.config).get(handover_id).ts
    service = HandoverService(runtime.database.get(), runtime.config)

    service.send_reminders(DAY_SHIFT + dt.timedelta(minutes=31))
    deliver_all(notifier)
    service.send_reminders(DAY_SHIFT + dt.timedelta(minutes=62))
    deliver_all(notifier)

    _post, reminder, escalation = slack.calls("chat.postMessage")
    assert reminder.args["thread_ts"] == root and escalation.args["thread_ts"] == root
    assert reminder.args["text"].startswith("<@U0ALICE> <@U0BOB> ")
    assert escalation.args["text"].startswith("<@U0ERIN> ")


# ------------------------------------------------------------------ when Slack says no


def test_a_rate_limited_message_waits_for_retry_after_and_is_then_posted(slack, runtime, notifier):
    with freeze_time("2025-06-02 09:00:00", tz_offset=0) as frozen:
        view = submit_upgrade(runtime)
        slack.rate_limit("chat.postMessage", retry_after=30)

        assert notifier.deliver_due() == 1
        (message,) = outbox_rows(runtime)
        assert message.state == "pending" and message.last_error == "ratelimited"
        assert message.next_attempt_at == dt.datetime(2025, 6, 2, 9, 0, 30, tzinfo=UTC)

        frozen.tick(dt.timedelta(seconds=29))
        assert notifier.deliver_due() == 0
        assert len(slack.calls("chat.postMessage")) == 1

        frozen.tick(dt.timedelta(seconds=1))
        deliver_all(notifier)

    first, second = slack.calls("chat.postMessage")
    assert first.status == 429 and second.ok
    assert thread_of(runtime, view.id) == second.response["ts"]
    assert outbox_rows(runtime)[0].state == "sent"


def two_conversations_due(runtime: Runtime, notifier: Notifier) -> None:
    """A reply due in one request's thread and a new request due at the channel's top."""
    first = submit_upgrade(runtime)
    deliver_all(notifier)
    approve(runtime, first.id, "U0BOB")
    submit_upgrade(runtime)


def test_a_rate_limit_pauses_the_rest_of_the_pass_instead_of_pressing_on(slack, runtime, notifier):
    with freeze_time("2025-06-02 09:00:00", tz_offset=0) as frozen:
        two_conversations_due(runtime, notifier)
        posts_before = len(slack.calls("chat.postMessage"))
        slack.rate_limit("chat.postMessage", retry_after=30)

        assert notifier.deliver_due() == 2

        assert len(slack.calls("chat.postMessage")) == posts_before + 1  # the second was not tried
        waiting = [m for m in outbox_rows(runtime) if m.state == "pending"]
        assert [m.next_attempt_at for m in waiting] == [dt.datetime(2025, 6, 2, 9, 0, 30, tzinfo=UTC)] * 2
        frozen.tick(dt.timedelta(seconds=30))
        deliver_all(notifier)

    assert all(m.state == "sent" for m in outbox_rows(runtime))


def test_a_replica_that_loses_the_lease_mid_pass_hands_the_rest_back_at_once(slack, runtime):
    client = OutboxSlack.like(web_client(slack.bot_token, base_url=slack.base_url))
    two_conversations_due(runtime, Notifier(runtime, client))
    posts_before = len(slack.calls("chat.postMessage"))
    answers = iter([True, True, False])  # the pass starts, the first message goes, then the lease is gone

    assert Notifier(runtime, client, gate=lambda: next(answers, False)).deliver_due() == 2

    assert len(slack.calls("chat.postMessage")) == posts_before + 1
    (handed_back,) = [m for m in outbox_rows(runtime) if m.state == "pending"]
    assert handed_back.claimed_until is None and "lease" in (handed_back.last_error or "")


def test_a_server_error_is_retried_with_backoff(slack, runtime, notifier):
    with freeze_time("2025-06-02 09:00:00", tz_offset=0) as frozen:
        submit_upgrade(runtime)
        slack.fail_next("chat.postMessage", "internal_error", status=200)

        notifier.deliver_due()
        (message,) = outbox_rows(runtime)
        assert message.state == "pending" and message.next_attempt_at > dt.datetime.now(UTC)

        frozen.tick(dt.timedelta(seconds=2))
        deliver_all(notifier)

    assert [c.ok for c in slack.calls("chat.postMessage")] == [False, True]
    assert outbox_rows(runtime)[0].state == "sent"


@pytest.mark.parametrize("channel, error", [("C0GONE", "channel_not_found"), ("C0ELSEWHERE", "not_in_channel")])
def test_a_channel_the_bot_cannot_post_to_gives_that_message_up_and_the_notifier_keeps_going(
        slack, runtime, notifier, caplog, channel, error):
    services = runtime.services()
    services.requests.submit(
        runtime.config.actor("U0ALICE"), kind="upgrade", pool="serving-a", targets=["serving-a-000"],
        plan=a_plan(), window_start=None, window_end=None, reason="wrong channel", channel=channel,
        now=dt.datetime.now(UTC))
    fine = submit_upgrade(runtime)

    with caplog.at_level(logging.ERROR, logger="gpuops.bot.notifier"):
        deliver_all(notifier)

    lost, delivered = outbox_rows(runtime)
    assert lost.state == "failed" and lost.last_error == error
    assert delivered.state == "sent" and thread_of(runtime, fine.id) is not None
    assert any(error in r.getMessage() and "given up" in r.getMessage() for r in caplog.records)


def test_a_message_marked_sent_is_never_posted_again_by_a_restarted_notifier(slack, runtime, notifier):
    view = submit_upgrade(runtime)
    approve(runtime, view.id, "U0BOB")
    deliver_all(notifier)
    notifier.stop()
    posted = len(slack.calls("chat.postMessage"))

    restarted = Notifier(runtime, OutboxSlack.like(web_client(slack.bot_token, base_url=slack.base_url)))
    assert restarted.deliver_due() == 0

    # Even a claim that ran out long ago does not bring a sent message back.
    with freeze_time(dt.datetime.now(UTC) + dt.timedelta(hours=1)):
        assert restarted.deliver_due() == 0
    assert len(slack.calls("chat.postMessage")) == posted == 2


def test_a_replica_that_lost_the_lease_delivers_nothing(slack, runtime):
    submit_upgrade(runtime)
    client = OutboxSlack.like(web_client(slack.bot_token, base_url=slack.base_url))

    assert Notifier(runtime, client, gate=lambda: False).deliver_due() == 0

    assert slack.calls("chat.postMessage") == []
    assert outbox_rows(runtime)[0].attempts == 0


# ------------------------------------------------------------------ the thread


def test_the_running_notifier_delivers_as_soon_as_it_is_told_something_was_queued(slack, runtime):
    # The timer is an hour: only notify() can make this delivery happen within the wait.
    notifier = Notifier(runtime, OutboxSlack.like(web_client(slack.bot_token, base_url=slack.base_url)),
                        retry_every=3600)
    notifier.start()
    try:
        notifier.wait_until_idle()  # nothing due: it sleeps until woken
        view = submit_upgrade(runtime)
        notifier.notify()
        post = slack.wait_for("chat.postMessage")
        notifier.deliveries.wait_for(lambda ds: any(d.outcome == "sent" for d in ds))
    finally:
        notifier.stop()
    assert post.ok and thread_of(runtime, view.id) == post.response["ts"]
