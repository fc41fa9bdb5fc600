"""HTTP mode: Slack POSTs signed requests to /slack/events; the bot acks at once and
answers afterwards through the fake Web API and response_urls."""

from __future__ import annotations

import json
import time

from bot.notifier import Notifier, OutboxSlack
from bot.slack_app import DELIVERY_WORKERS
from commands.reply import Reply
from storage import approvals as stored_approvals
from storage import requests as stored_requests
from testenv.fakeslack import signing
from tests.e2e.harness import CHANNEL, send, submit_upgrade, text_of


def slash(bot, text: str, *, user: str = "U0DAVE", channel: str = CHANNEL, trigger_id: str | None = None,
          **send_args):
    url = bot.slack.response_url(channel=channel, user=user)
    body = signing.slash_command_body(text=text, user_id=user, channel_id=channel, response_url=url,
                                      **({"trigger_id": trigger_id} if trigger_id else {}))
    return url, body, send(bot.url, body, **send_args)


def click(bot, *, action_id: str, value: str, user: str, message_ts: str, trigger_id: str | None = None,
          **send_args):
    url = bot.slack.response_url(channel=CHANNEL, message_ts=message_ts, user=user)
    body = signing.block_actions_body(action_id=action_id, value=value, user_id=user, message_ts=message_ts,
                                      channel_id=CHANNEL, response_url=url, block_id="intents",
                                      **({"trigger_id": trigger_id} if trigger_id else {}))
    return url, send(bot.url, body, **send_args)


def button(message, label: str) -> dict:
    return next(e for b in message.blocks if b["type"] == "actions" for e in b["elements"]
                if e["text"]["text"] == label)


def approved_by(bot, user: str):
    """A fresh upgrade request's card in the channel, approved by `user` (waited for)."""
    request = submit_upgrade(bot.runtime)
    ts = bot.post_card(request)
    approve = button(bot.slack.workspace.message(CHANNEL, ts), "Approve")
    click(bot, action_id=approve["action_id"], value=approve["value"], user=user, message_ts=ts)
    bot.deliveries.wait_for(lambda ds: len(ds) == 1)
    return request, ts, approve


# ------------------------------------------------------------------ commands


def test_a_signed_status_command_is_acked_empty_and_answered_on_its_response_url(http_bot):
    url, _, answer = slash(http_bot, "status")

    assert (answer.status, answer.body) == (200, "")
    post = http_bot.slack.wait_for_response(url)
    assert post.ok and post.body["response_type"] == "ephemeral"
    assert post.body["blocks"][0] == {"type": "header", "text": {"type": "plain_text", "text": "GPU fleet status",
                                                                 "emoji": True}}
    assert "7/9 GPU nodes" not in post.body["text"] and "9 GPU nodes Ready" in post.body["text"]
    assert "serving-a" in text_of(post.body["blocks"])


def test_the_ack_returns_while_the_command_is_still_working(http_bot, fleet_source):
    # How fast the ack comes is measured by `make bench` (tests/bench/test_ack_latency.py).
    fleet_source.hold()
    url, _, answer = slash(http_bot, "status")
    assert answer.status == 200 and fleet_source.reading.wait(5)
    assert http_bot.slack.response_posts(url) == []  # acked, the answer not sent yet
    fleet_source.released.set()
    assert http_bot.slack.wait_for_response(url).ok


def test_acks_keep_coming_while_every_worker_is_busy(http_bot, fleet_source):
    fleet_source.hold()
    sent = [slash(http_bot, "status") for _ in range(DELIVERY_WORKERS + 2)]

    # Every ack came back while every worker was still held on the fleet.
    assert all(answer.status == 200 for _, _, answer in sent)
    assert not any(http_bot.slack.response_posts(url) for url, _, _ in sent)
    fleet_source.released.set()
    http_bot.deliveries.wait_for(lambda ds: len(ds) == DELIVERY_WORKERS + 2)
    assert all(http_bot.slack.response_posts(url) for url, _, _ in sent)


def test_a_bad_signature_a_stale_timestamp_or_a_tampered_body_get_401_and_nothing_runs(http_bot):
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0ERIN")
    body = signing.slash_command_body(text="status", user_id="U0ERIN", response_url=url)
    tampered = body.replace(b"U0ERIN", b"U0DAVE")

    answers = [
        send(http_bot.url, body, secret="not-the-signing-secret-at-all"),
        send(http_bot.url, body, timestamp=int(time.time()) - 600),
        send(http_bot.url, tampered, sign_body=body),
        send(http_bot.url, signing.block_actions_body(action_id="gpuops.approve.0", value="req-000000"),
             secret="wrong-secret-wrong-secret"),
    ]

    assert [a.status for a in answers] == [401, 401, 401, 401]
    assert http_bot.slack.response_posts() == [] and http_bot.deliveries.all() == []


def test_a_command_slack_retries_with_x_slack_retry_num_runs_once(http_bot):
    url, body, first = slash(http_bot, "status", trigger_id="1111.T0GPUOPS.retried")

    retry = send(http_bot.url, body, headers={"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"})

    assert (first.status, retry.status) == (200, 200)
    deliveries = http_bot.deliveries.wait_for(lambda ds: len(ds) == 2)
    assert sorted(d.outcome for d in deliveries) == ["answered", "duplicate"]
    assert len(http_bot.slack.response_posts(url)) == 1


def test_an_unknown_command_answers_with_usage_and_the_closest_match(http_bot):
    url, _, _ = slash(http_bot, "stauts serving-a")

    post = http_bot.slack.wait_for_response(url)
    assert "Unknown command: stauts serving-a" in text_of(post.body["blocks"])
    assert "Did you mean `/gpu status`" in text_of(post.body["blocks"])


def test_help_for_one_command_shows_its_usage_examples_and_role(http_bot):
    url, _, _ = slash(http_bot, "help status")

    text = text_of(http_bot.slack.wait_for_response(url).body["blocks"])
    assert "Usage: /gpu status [pool]" in text and "`/gpu status serving-a`" in text
    assert "Needs the viewer role (you have it)." in text


def test_user_text_cannot_ping_the_channel_or_forge_links(http_bot):
    url, _, _ = slash(http_bot, "node <!channel>&<https://evil.example|serving-a-000>")

    text = text_of(http_bot.slack.wait_for_response(url).body["blocks"])
    assert "<!channel>" not in text and "<https://evil" not in text
    assert "&lt;!channel&gt;&amp;&lt;https://evil.example|serving-a-000&gt;" in text


def test_when_the_response_url_has_expired_the_answer_comes_as_a_direct_message(http_bot):
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")
    http_bot.slack.expire_response_url(url)
    send(http_bot.url, signing.slash_command_body(text="status", user_id="U0DAVE", response_url=url))

    posted = http_bot.slack.wait_for("chat.postMessage")
    assert posted.ok and posted.args["channel"] == http_bot.slack.last("conversations.open").response["channel"]["id"]
    assert "GPU fleet status" in posted.args["text"]


def test_a_user_without_a_role_is_told_so_and_sees_no_command_list(http_bot):
    http_bot.slack.workspace.add_user("U0MALLORY", name="mallory")
    url, _, _ = slash(http_bot, "help", user="U0MALLORY")

    text = text_of(http_bot.slack.wait_for_response(url).body["blocks"])
    assert "needs the viewer role; mallory has no role" in text and "/gpu status" not in text


# ------------------------------------------------------------------ buttons


def test_two_approvers_approve_by_button_and_the_request_message_is_updated_in_place(http_bot):
    request = submit_upgrade(http_bot.runtime)
    ts = http_bot.post_card(request)
    approve = button(http_bot.slack.workspace.message(CHANNEL, ts), "Approve")
    assert approve["value"] == f"{request.id}/{request.plan_hash}"

    bob_url, acked = click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0BOB",
                           message_ts=ts)
    assert (acked.status, acked.body) == (200, "")
    http_bot.slack.wait_for("chat.update")
    after_bob = http_bot.slack.workspace.message(CHANNEL, ts)
    assert "1 of 2 approvals" in text_of(after_bob.blocks) and "bob approved" in text_of(after_bob.blocks)
    assert "You approved" in http_bot.slack.wait_for_response(bob_url).body["text"]

    click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0CAROL", message_ts=ts)
    http_bot.deliveries.wait_for(lambda ds: len(ds) == 2)
    final = http_bot.slack.workspace.message(CHANNEL, ts)
    assert "approved · 2 of 2 approvals" in text_of(final.blocks)
    assert not [b for b in final.blocks if b["type"] == "actions"]  # nothing left to click
    assert http_bot.runtime.services().requests.get(request.id).state == "approved"


def test_an_admin_cannot_approve_their_own_request_two_person_rule(http_bot):
    request = submit_upgrade(http_bot.runtime, by="U0ERIN")
    ts = http_bot.post_card(request)
    approve = button(http_bot.slack.workspace.message(CHANNEL, ts), "Approve")

    url, _ = click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0ERIN", message_ts=ts)

    refusal = http_bot.slack.wait_for_response(url)
    assert refusal.body["response_type"] == "ephemeral" and refusal.body["replace_original"] is False
    assert "two-person rule" in refusal.body["text"]
    assert http_bot.runtime.services().requests.get(request.id).approvals_counted == 0


def test_a_viewer_clicking_approve_is_refused_by_the_domain_not_the_button(http_bot):
    request = submit_upgrade(http_bot.runtime)
    ts = http_bot.post_card(request)
    approve = button(http_bot.slack.workspace.message(CHANNEL, ts), "Approve")

    url, _ = click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0DAVE", message_ts=ts)

    assert "needs the approver role for pool serving-a" in http_bot.slack.wait_for_response(url).body["text"]
    assert http_bot.runtime.services().requests.get(request.id).state == "pending"


def test_a_button_value_naming_another_plan_or_no_request_is_refused(http_bot):
    request = submit_upgrade(http_bot.runtime)
    ts = http_bot.post_card(request)

    stale_url, _ = click(http_bot, action_id="gpuops.approve.0", value=f"{request.id}/{'0' * 64}", user="U0BOB",
                         message_ts=ts)
    forged_url, _ = click(http_bot, action_id="gpuops.approve.0", value="req-ffffff/" + request.plan_hash,
                          user="U0BOB", message_ts=ts)
    junk_url, _ = click(http_bot, action_id="gpuops.approve.0", value='{"approved": true}', user="U0BOB",
                        message_ts=ts)

    assert "The plan changed since you looked" in http_bot.slack.wait_for_response(stale_url).body["text"]
    assert "There is no request req-ffffff" in http_bot.slack.wait_for_response(forged_url).body["text"]
    assert "does not belong to a gpuops message" in http_bot.slack.wait_for_response(junk_url).body["text"]
    assert http_bot.runtime.services().requests.get(request.id).approvals_counted == 0


def test_a_click_delivered_twice_counts_once(http_bot):
    request = submit_upgrade(http_bot.runtime)
    ts = http_bot.post_card(request)
    approve = button(http_bot.slack.workspace.message(CHANNEL, ts), "Approve")
    url = http_bot.slack.response_url(channel=CHANNEL, message_ts=ts, user="U0BOB")
    body = signing.block_actions_body(action_id=approve["action_id"], value=approve["value"], user_id="U0BOB",
                                      message_ts=ts, response_url=url, trigger_id="2222.T0GPUOPS.click")

    send(http_bot.url, body)
    send(http_bot.url, body, headers={"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"})

    deliveries = http_bot.deliveries.wait_for(lambda ds: len(ds) == 2)
    assert sorted(d.outcome for d in deliveries) == ["answered", "duplicate"]
    db = http_bot.runtime.database.get()
    assert len(stored_approvals.for_request(db, request_id=request.id)) == 1
    assert len(http_bot.slack.calls("chat.update")) == 1


def test_destructive_buttons_ask_for_confirmation_in_slack(http_bot):
    ts = http_bot.post_card(submit_upgrade(http_bot.runtime))
    message = http_bot.slack.workspace.message(CHANNEL, ts)

    assert "confirm" not in button(message, "Approve")
    confirm = button(message, "Deny")["confirm"]
    assert confirm["style"] == "danger" and confirm["title"]["text"] == "Deny this request?"


def test_deny_asks_for_a_reason_in_a_modal_and_then_denies_and_updates_the_message(http_bot):
    request = submit_upgrade(http_bot.runtime)
    ts = http_bot.post_card(request)
    deny = button(http_bot.slack.workspace.message(CHANNEL, ts), "Deny")

    url, _ = click(http_bot, action_id=deny["action_id"], value=deny["value"], user="U0BOB", message_ts=ts)
    opened = http_bot.slack.wait_for("views.open")
    assert opened.ok and opened.args["view"]["callback_id"] == "gpuops.deny"
    assert http_bot.runtime.services().requests.get(request.id).state == "pending"  # nothing decided yet

    empty = send(http_bot.url, signing.view_submission_body(
        callback_id="gpuops.deny", user_id="U0BOB", private_metadata=opened.args["view"]["private_metadata"],
        values={"reason": {"reason": "  "}}))
    assert empty.json() == {"response_action": "errors",
                            "errors": {"reason": "Say why you deny it; the requester reads this."}}

    send(http_bot.url, signing.view_submission_body(
        callback_id="gpuops.deny", user_id="U0BOB", private_metadata=opened.args["view"]["private_metadata"],
        values={"reason": {"reason": "serving-a is at its capacity floor until Monday"}}))
    http_bot.slack.wait_for("chat.update")
    text = text_of(http_bot.slack.workspace.message(CHANNEL, ts).blocks)
    assert "denied · 0 of 2 approvals" in text
    assert "bob denied plan" in text and "serving-a is at its capacity floor until Monday" in text
    assert http_bot.runtime.services().requests.get(request.id).state == "denied"
    told = http_bot.slack.wait_for_response(url, lambda p: p.body.get("response_type") == "ephemeral")
    assert f"You denied {request.id}" in told.body["text"]


def test_a_deny_form_sent_back_for_its_reason_still_denies_when_submitted_again_under_the_same_view(http_bot):
    # Slack keeps a form that got field errors open: the corrected submission has the same view id.
    request = submit_upgrade(http_bot.runtime)
    ts = http_bot.post_card(request)
    deny = button(http_bot.slack.workspace.message(CHANNEL, ts), "Deny")
    click(http_bot, action_id=deny["action_id"], value=deny["value"], user="U0BOB", message_ts=ts)
    opened = http_bot.slack.wait_for("views.open")
    form = {"callback_id": "gpuops.deny", "user_id": "U0BOB", "view_id": opened.response["view"]["id"],
            "private_metadata": opened.args["view"]["private_metadata"]}

    empty = send(http_bot.url, signing.view_submission_body(**form, values={"reason": {"reason": ""}}))
    send(http_bot.url, signing.view_submission_body(**form, values={"reason": {"reason": "capacity floor"}}))

    assert empty.json()["response_action"] == "errors"
    deliveries = http_bot.deliveries.wait_for(lambda ds: len([d for d in ds if d.kind == "deny"]) == 2)
    assert [d.outcome for d in deliveries if d.kind == "deny"] == ["invalid", "answered"]
    assert http_bot.runtime.services().requests.get(request.id).state == "denied"


def test_a_rate_limited_update_is_retried_after_retry_after(http_bot):
    request = submit_upgrade(http_bot.runtime)
    ts = http_bot.post_card(request)
    approve = button(http_bot.slack.workspace.message(CHANNEL, ts), "Approve")
    http_bot.slack.rate_limit("chat.update", retry_after=0)

    click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0BOB", message_ts=ts)

    http_bot.deliveries.wait_for(lambda ds: len(ds) == 1)
    assert [c.status for c in http_bot.slack.calls("chat.update")] == [429, 200]
    assert "1 of 2 approvals" in text_of(http_bot.slack.workspace.message(CHANNEL, ts).blocks)


# ------------------------------------------------------------------ identity


def test_roles_from_a_slack_user_group_let_its_members_approve(http_bot):
    request = submit_upgrade(http_bot.runtime)
    ts = http_bot.post_card(request)
    approve = button(http_bot.slack.workspace.message(CHANNEL, ts), "Approve")

    url, _ = click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0FRANK", message_ts=ts)

    assert "You approved" in http_bot.slack.wait_for_response(url).body["text"]
    assert http_bot.slack.last("usergroups.users.list").args["usergroup"] == "S0SRE"


def test_someone_just_taken_out_of_an_approver_group_cannot_approve_on_the_cached_members(http_bot):
    approved_by(http_bot, "U0FRANK")  # reads the group's members into the cache
    second = submit_upgrade(http_bot.runtime)
    second_ts = http_bot.post_card(second)

    http_bot.set_usergroup("S0SRE", [])  # well within the 5-minute cache
    approve = button(http_bot.slack.workspace.message(CHANNEL, second_ts), "Approve")
    url, _ = click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0FRANK",
                   message_ts=second_ts)

    assert "needs the approver role" in http_bot.slack.wait_for_response(url).body["text"]
    assert http_bot.runtime.services().requests.get(second.id).approvals_counted == 0


def test_an_approval_stops_counting_once_its_approver_left_the_group_before_the_request_completed(http_bot):
    request, ts, approve = approved_by(http_bot, "U0FRANK")
    assert http_bot.runtime.services().requests.get(request.id).approvals_counted == 1

    http_bot.set_usergroup("S0SRE", [])
    url, _ = click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0BOB", message_ts=ts)

    assert "You approved" in http_bot.slack.wait_for_response(url).body["text"]
    view = http_bot.runtime.services().requests.get(request.id)
    assert (view.state, view.approvals_counted, view.approvers) == ("pending", 1, ("U0BOB",))
    assert "1 of 2 approvals" in text_of(http_bot.slack.workspace.message(CHANNEL, ts).blocks)


def test_the_thread_names_a_group_approver_by_a_mention_never_by_the_display_name_she_chose(http_bot):
    # Mallory approves through the S0SRE group and has renamed herself "carol" in Slack.
    http_bot.slack.workspace.add_user("U0MALLORY", name="carol")
    http_bot.slack.workspace.set_usergroup("S0SRE", ["U0FRANK", "U0MALLORY"])
    request = submit_upgrade(http_bot.runtime)
    notifier = Notifier(http_bot.runtime, OutboxSlack.like(http_bot.app.client))
    notifier.deliver_due()  # the request's thread opens with its card
    ts = stored_requests.get(http_bot.runtime.database.get(), id=request.id).thread_ts
    approve = button(http_bot.slack.workspace.message(CHANNEL, ts), "Approve")

    click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0MALLORY", message_ts=ts)
    http_bot.deliveries.wait_for(lambda ds: len(ds) == 1)
    notifier.deliver_due()

    reply = http_bot.slack.last("chat.postMessage")
    assert reply.args["thread_ts"] == ts
    assert reply.args["text"] == f"<@U0MALLORY> approved {request.id} (1 of 2)."
    assert "carol" not in reply.args["text"]


def test_when_slack_cannot_list_a_user_group_its_members_get_no_role(http_bot):
    request = submit_upgrade(http_bot.runtime)
    ts = http_bot.post_card(request)
    approve = button(http_bot.slack.workspace.message(CHANNEL, ts), "Approve")
    http_bot.slack.fail_next("usergroups.users.list", "missing_scope", status=200)

    url, _ = click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0FRANK", message_ts=ts)

    assert "needs the approver role" in http_bot.slack.wait_for_response(url).body["text"]
    assert http_bot.runtime.services().requests.get(request.id).approvals_counted == 0


# ------------------------------------------------------------------ the Home tab


def test_opening_the_home_tab_publishes_the_fleet_and_what_waits_for_the_viewer(http_bot):
    request = submit_upgrade(http_bot.runtime)

    for user in ("U0BOB", "U0DAVE"):
        answer = send(http_bot.url, signing.app_home_opened_body(user), content_type=signing.JSON)
        assert answer.status == 200
    http_bot.deliveries.wait_for(lambda ds: len(ds) == 2)

    bob = http_bot.slack.workspace.home_view("U0BOB")
    assert "Waiting for your approval (1)" in text_of(bob["blocks"]) and request.id in text_of(bob["blocks"])
    assert {"Approve", "Deny"} <= {e["text"]["text"] for b in bob["blocks"] if b["type"] == "actions"
                                   for e in b["elements"]}
    assert "9 GPU nodes Ready" in text_of(bob["blocks"])
    dave = http_bot.slack.workspace.home_view("U0DAVE")
    assert "Nothing waits for your approval" in text_of(dave["blocks"])


def test_approving_from_the_home_tab_republishes_it(http_bot):
    request = submit_upgrade(http_bot.runtime)
    send(http_bot.url, signing.app_home_opened_body("U0BOB"), content_type=signing.JSON)
    http_bot.deliveries.wait_for(lambda ds: len(ds) == 1)
    home = http_bot.slack.workspace.home_view("U0BOB")
    approve = next(e for b in home["blocks"] if b["type"] == "actions" for e in b["elements"]
                   if e["text"]["text"] == "Approve")
    payload = signing.block_actions_payload(action_id=approve["action_id"], value=approve["value"], user_id="U0BOB")
    payload["container"] = {"type": "view", "view_id": home["id"]}
    payload.pop("response_url")

    send(http_bot.url, ("payload=" + __import__("urllib.parse").parse.quote(json.dumps(payload))).encode())

    http_bot.deliveries.wait_for(lambda ds: len(ds) == 2)
    home = http_bot.slack.workspace.home_view("U0BOB")
    assert f"You approved {request.id} (1 of 2)" in text_of(home["blocks"])
    assert "Nothing waits for your approval" in text_of(home["blocks"])


def test_a_channel_answer_the_bot_cannot_post_falls_back_to_a_direct_message(http_bot):
    url = http_bot.slack.response_url(channel="C0ELSEWHERE", user="U0ERIN")
    http_bot.slack.expire_response_url(url)
    reply = Reply(title="Run run-9b01de paused", summary="steps in flight finish", visibility="in_channel")

    http_bot.bot.answer(reply, user="U0ERIN", channel="C0ELSEWHERE", response_url=url)

    refused, delivered = http_bot.slack.calls("chat.postMessage")
    assert (refused.args["channel"], refused.error) == ("C0ELSEWHERE", "not_in_channel")
    assert delivered.ok and delivered.args["channel"].startswith("D") and "run-9b01de" in delivered.args["text"]


def test_when_the_request_message_cannot_be_updated_the_click_still_answers_the_clicker(http_bot):
    request = submit_upgrade(http_bot.runtime)
    ts = http_bot.post_card(request)
    approve = button(http_bot.slack.workspace.message(CHANNEL, ts), "Approve")
    http_bot.slack.fail_next("chat.update", "channel_not_found", status=200)

    url, _ = click(http_bot, action_id=approve["action_id"], value=approve["value"], user="U0BOB", message_ts=ts)

    replaced = http_bot.slack.wait_for_response(url, lambda p: p.body.get("replace_original") is True)
    told = http_bot.slack.wait_for_response(url, lambda p: p.body.get("response_type") == "ephemeral")
    assert "1 of 2 approvals" in text_of(replaced.body["blocks"]) and "You approved" in told.body["text"]
