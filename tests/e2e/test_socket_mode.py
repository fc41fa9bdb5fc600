"""Socket Mode: the same app over the fake Socket Mode server. Envelopes are acked at
once (an empty ack); answers arrive through the Web API and response_urls."""

from __future__ import annotations

import io

from bot.console import run_console
from testenv.fakeslack import signing
from tests.e2e.harness import CHANNEL, submit_upgrade, text_of


def test_a_slash_command_envelope_is_acked_and_answered_on_its_response_url(socket_bot, fake_socket_mode):
    url = socket_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    envelope = fake_socket_mode.send_envelope(
        "slash_commands", signing.slash_command_payload(text="findings serving-a", user_id="U0DAVE", response_url=url))

    assert fake_socket_mode.wait_for_ack(envelope) == {"envelope_id": envelope}
    post = socket_bot.slack.wait_for_response(url)
    assert post.ok and "Findings for serving-a" in text_of(post.body["blocks"])


def test_a_command_redelivered_with_retry_attempt_runs_once(socket_bot, fake_socket_mode):
    url = socket_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")
    payload = signing.slash_command_payload(text="status", user_id="U0DAVE", response_url=url)

    first = fake_socket_mode.send_envelope("slash_commands", payload)
    again = fake_socket_mode.send_envelope("slash_commands", payload, retry_attempt=1, retry_reason="timeout")

    fake_socket_mode.wait_for_ack(first)
    fake_socket_mode.wait_for_ack(again)
    deliveries = socket_bot.deliveries.wait_for(lambda ds: len(ds) == 2)
    assert sorted(d.outcome for d in deliveries) == ["answered", "duplicate"]
    assert len(socket_bot.slack.response_posts(url)) == 1


def test_approve_clicked_over_socket_mode_updates_the_request_message(socket_bot, fake_socket_mode):
    request = submit_upgrade(socket_bot.runtime)
    ts = socket_bot.post_card(request)
    url = socket_bot.slack.response_url(channel=CHANNEL, message_ts=ts, user="U0CAROL")

    envelope = fake_socket_mode.send_envelope("interactive", signing.block_actions_payload(
        action_id="gpuops.approve.0", value=f"{request.id}/{request.plan_hash}", user_id="U0CAROL",
        message_ts=ts, response_url=url))

    assert fake_socket_mode.wait_for_ack(envelope) == {"envelope_id": envelope}
    socket_bot.slack.wait_for("chat.update")
    assert "1 of 2 approvals" in text_of(socket_bot.slack.workspace.message(CHANNEL, ts).blocks)


def test_the_deny_form_without_a_reason_is_answered_with_a_field_error_in_the_ack(socket_bot, fake_socket_mode):
    request = submit_upgrade(socket_bot.runtime)
    envelope = fake_socket_mode.send_envelope("interactive", signing.view_submission_payload(
        callback_id="gpuops.deny", user_id="U0BOB", private_metadata=f'{{"value": "{request.id}"}}',
        values={"reason": {"reason": ""}}))

    ack = fake_socket_mode.wait_for_ack(envelope)

    assert ack["payload"]["response_action"] == "errors" and "reason" in ack["payload"]["errors"]


def test_opening_the_home_tab_over_socket_mode_publishes_it_once_per_event(socket_bot, fake_socket_mode):
    event = signing.app_home_opened_event("U0CAROL", event_id="Ev0HOME1")

    fake_socket_mode.wait_for_ack(fake_socket_mode.send_envelope("events_api", event))
    fake_socket_mode.wait_for_ack(fake_socket_mode.send_envelope("events_api", event, retry_attempt=1,
                                                                 retry_reason="timeout"))

    socket_bot.deliveries.wait_for(lambda ds: len(ds) == 2)
    assert len(socket_bot.slack.calls("views.publish")) == 1
    assert "GPU fleet status" in text_of(socket_bot.slack.workspace.home_view("U0CAROL")["blocks"])


def test_app_home_and_the_console_say_why_a_request_waits_in_the_same_words(socket_bot, fake_socket_mode):
    request = submit_upgrade(socket_bot.runtime)
    why = "Waits for 2 more approvals (0/2 so far) from bob, carol, erin or a member of S0SRE."

    out = io.StringIO()
    run_console([f"/gpu request {request.id}"], runtime=socket_bot.runtime, out=out, as_user="U0DAVE")
    assert f"Why it waits: {why}" in out.getvalue(), out.getvalue()

    event = signing.app_home_opened_event("U0DAVE", event_id="Ev0HOME2")
    fake_socket_mode.wait_for_ack(fake_socket_mode.send_envelope("events_api", event))
    socket_bot.deliveries.wait_for(lambda ds: len(ds) == 1)
    home = text_of(socket_bot.slack.workspace.home_view("U0DAVE")["blocks"])
    assert f"*{request.id}* · Driver upgrade on serving-a: {why}" in home, home
