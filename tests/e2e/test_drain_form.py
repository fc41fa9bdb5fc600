"""The drain request form over a fake Slack: alice clicks "Request a drain" (under
`/gpu status training-a`, or on her Home tab), Slack opens the form, she submits it, and
what she gets back is exactly what `/gpu drain` answers: the plan with Approve/Deny and
a pending request, or the refusal. Input the form can check itself comes back as field
errors in the ack, and nothing is stored. Real Bolt app, signed HTTP requests, SQLite.

training-a drains here need one approval, so a drain asked for stays pending."""

from __future__ import annotations

import io
import json
import urllib.parse
from typing import Any

import pytest
import yaml

from bot.console import run_console
from testenv.fakeslack import signing
from tests.e2e.harness import CHANNEL, ROOT, demo_config, send, text_of
from workflows.config import GpuopsConfig

FORM = "gpuops.drain-request"


@pytest.fixture
def config() -> GpuopsConfig:
    pools = yaml.safe_load((ROOT / "deploy" / "config.example.yaml").read_text())["pools"]
    pools["training-a"]["approvals"] = {"drain": 1}
    return demo_config(pools=pools)


# ------------------------------------------------------------------ what a person does in Slack


def slash(bot, text: str, *, user: str) -> dict[str, Any]:
    """`/gpu <text>` typed in #ops; the reply's body as posted to the response_url."""
    url = bot.slack.response_url(channel=CHANNEL, user=user)
    send(bot.url, signing.slash_command_body(text=text, user_id=user, channel_id=CHANNEL, response_url=url))
    return bot.slack.wait_for_response(url).body


def drain_buttons(blocks: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [e for b in blocks or [] if b["type"] == "actions" for e in b["elements"]
            if e["text"]["text"] == "Request a drain"]


def click_in_channel(bot, button: dict[str, Any], *, user: str) -> str:
    """Click a button of an ephemeral reply in #ops; the click's response_url."""
    url = bot.slack.response_url(channel=CHANNEL, user=user)
    payload = signing.block_actions_payload(action_id=button["action_id"], value=button.get("value"),
                                            user_id=user, channel_id=CHANNEL, response_url=url, block_id="intents")
    payload["container"]["is_ephemeral"] = True
    send(bot.url, _form(payload))
    return url


def click_on_home(bot, button: dict[str, Any], *, user: str) -> None:
    home = bot.slack.workspace.home_view(user)
    payload = signing.block_actions_payload(action_id=button["action_id"], value=button.get("value"), user_id=user)
    payload["container"] = {"type": "view", "view_id": home["id"]}
    payload.pop("channel")
    payload.pop("response_url")
    send(bot.url, _form(payload))


def _form(payload: dict[str, Any]) -> bytes:
    return urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()


def opened_form(bot) -> dict[str, Any]:
    """The drain form as Slack opened it (views.open answered ok)."""
    opened = bot.slack.wait_for("views.open", lambda c: c.args["view"].get("callback_id") == FORM)
    assert opened.ok, opened.error
    return opened.response["view"]


def submit(bot, view: dict[str, Any], *, user: str, targets: str, when: str = "now", duration: str = "",
           reason: str, retry: bool = False, channel: str | None = None):
    """Press "Plan the drain": Slack posts the view's state with the view's own id (and
    the channel picked, in a form from the Home tab, which asks for one)."""
    values = {"targets": {"targets": targets},
              "when": {"when": {"type": "static_select", "selected_option": {
                  "text": {"type": "plain_text", "text": when}, "value": when}}},
              "time": {"time": {"type": "datetimepicker", "selected_date_time": None}},
              "duration": {"duration": duration},
              "reason": {"reason": reason}}
    if any(b.get("block_id") == "channel" for b in view.get("blocks") or ()):
        values["channel"] = {"channel": {"type": "conversations_select", "selected_conversation": channel}}
    body = signing.view_submission_body(callback_id=FORM, user_id=user, view_id=view["id"], values=values,
                                        private_metadata=view["private_metadata"])
    headers = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"} if retry else None
    return send(bot.url, body, headers=headers)


def stored_requests(bot) -> list[dict[str, Any]]:
    return list(bot.runtime.database.get().query("SELECT id, kind, pool, state, targets, reason, channel "
                                                 "FROM requests"))


def form_deliveries(bot, count: int) -> list[str]:
    seen = bot.deliveries.wait_for(lambda ds: len([d for d in ds if d.kind == "drain-form"]) >= count)
    return [d.outcome for d in seen if d.kind == "drain-form"]


# ------------------------------------------------------------------ the tests


def test_an_operator_requests_a_drain_from_the_pool_status_and_gets_the_plan_with_her_cancel_button(http_bot):
    status = slash(http_bot, "status training-a", user="U0ALICE")
    (button,) = drain_buttons(status["blocks"])
    assert button["value"] == "training-a"

    click_in_channel(http_bot, button, user="U0ALICE")
    view = opened_form(http_bot)
    targets = next(b for b in view["blocks"] if b.get("block_id") == "targets")
    assert targets["element"]["initial_value"] == "training-a"

    ack = submit(http_bot, view, user="U0ALICE", targets="training-a-001", duration="2h", reason="NIC swap")
    assert (ack.status, ack.body) == (200, "")  # the form closes
    posted = http_bot.slack.wait_for("chat.postEphemeral")

    assert (posted.args["channel"], posted.args["user"]) == (CHANNEL, "U0ALICE")
    text = text_of(posted.args["blocks"])
    (request,) = stored_requests(http_bot)
    assert (request["kind"], request["pool"], request["state"]) == ("drain", "training-a", "pending")
    assert json.loads(request["targets"]) == ["training-a-001"]
    assert (request["reason"], request["channel"]) == ("NIC swap", CHANNEL)
    assert f"Drain {request['id']} · training-a" in text and "training-a-001" in text and "NIC swap" in text
    # Only alice sees this answer, and she may not approve her own request: Cancel, not Approve.
    assert {e["text"]["text"] for b in posted.args["blocks"] if b["type"] == "actions"
            for e in b["elements"]} == {"Cancel request"}
    assert "From the drain form: `/gpu drain training-a-001 for 2h NIC swap`" in text
    assert form_deliveries(http_bot, 1) == ["answered"]


def test_a_submission_slack_delivers_twice_requests_one_drain(http_bot):
    click_in_channel(http_bot, {"action_id": "gpuops.request-drain.0", "value": "training-a-004"}, user="U0ALICE")
    view = opened_form(http_bot)

    submit(http_bot, view, user="U0ALICE", targets="training-a-004", reason="firmware")
    submit(http_bot, view, user="U0ALICE", targets="training-a-004", reason="firmware", retry=True)

    assert sorted(form_deliveries(http_bot, 2)) == ["answered", "duplicate"]
    assert len(stored_requests(http_bot)) == 1
    assert len(http_bot.slack.calls("chat.postEphemeral")) == 1


def test_a_form_from_the_home_tab_asks_where_the_thread_goes_and_answers_there(http_bot):
    send(http_bot.url, signing.app_home_opened_body("U0ALICE"), content_type=signing.JSON)
    http_bot.deliveries.wait_for(lambda ds: any(d.kind == "home" for d in ds))
    (button,) = drain_buttons(http_bot.slack.workspace.home_view("U0ALICE")["blocks"])
    click_on_home(http_bot, button, user="U0ALICE")
    view = opened_form(http_bot)

    nowhere = submit(http_bot, view, user="U0ALICE", targets="training-a-001", reason="firmware")
    assert nowhere.json() == {"response_action": "errors", "errors": {
        "channel": "Pick a channel: the request's progress is posted in its thread there."}}
    assert stored_requests(http_bot) == []

    picked = submit(http_bot, view, user="U0ALICE", targets="training-a-001", reason="firmware", channel=CHANNEL)
    assert (picked.status, picked.body) == (200, "")
    assert form_deliveries(http_bot, 2) == ["invalid", "answered"]
    (request,) = stored_requests(http_bot)
    assert request["channel"] == CHANNEL  # the notifier opens the request's thread there
    posted = http_bot.slack.wait_for("chat.postEphemeral")
    assert (posted.args["channel"], posted.args["user"]) == (CHANNEL, "U0ALICE")
    assert f"Drain {request['id']}" in text_of(posted.args["blocks"])


def test_a_malformed_duration_is_a_field_error_nothing_is_stored_and_the_corrected_form_goes_through(http_bot):
    send(http_bot.url, signing.app_home_opened_body("U0ALICE"), content_type=signing.JSON)
    http_bot.deliveries.wait_for(lambda ds: any(d.kind == "home" for d in ds))
    (button,) = drain_buttons(http_bot.slack.workspace.home_view("U0ALICE")["blocks"])
    assert "value" not in button  # the Home tab's names no node or pool

    click_on_home(http_bot, button, user="U0ALICE")
    view = opened_form(http_bot)
    assert json.loads(view["private_metadata"]) == {}  # no channel: the form asks for one

    refused = submit(http_bot, view, user="U0ALICE", targets="training-a-001", duration="2 hours",
                     reason="firmware", channel=CHANNEL)

    assert refused.json() == {"response_action": "errors",
                              "errors": {"duration": "Write how long like 2h, 90m or 1h30m, not '2 hours'."}}
    assert form_deliveries(http_bot, 1) == ["invalid"]
    assert stored_requests(http_bot) == []
    assert http_bot.slack.calls("chat.postEphemeral") == [] and http_bot.slack.calls("chat.postMessage") == []

    # Slack keeps the form open under the same view id; the corrected submission runs.
    fixed = submit(http_bot, view, user="U0ALICE", targets="training-a-001", duration="2h", reason="firmware",
                   channel=CHANNEL)
    assert (fixed.status, fixed.body) == (200, "")
    assert form_deliveries(http_bot, 2) == ["invalid", "answered"]
    (request,) = stored_requests(http_bot)
    assert request["state"] == "pending" and request["channel"] == CHANNEL
    answer = http_bot.slack.wait_for("chat.postEphemeral")
    assert answer.args["channel"] == CHANNEL and f"Drain {request['id']}" in text_of(answer.args["blocks"])


def test_a_viewer_is_not_offered_the_button_and_is_refused_when_clicking_or_submitting_anyway(http_bot):
    status = slash(http_bot, "status training-a", user="U0DAVE")
    assert drain_buttons(status["blocks"]) == []
    send(http_bot.url, signing.app_home_opened_body("U0DAVE"), content_type=signing.JSON)
    http_bot.deliveries.wait_for(lambda ds: any(d.kind == "home" for d in ds))
    assert drain_buttons(http_bot.slack.workspace.home_view("U0DAVE")["blocks"]) == []

    # A button from someone else's message: no form, a word to dave instead.
    url = click_in_channel(http_bot, {"action_id": "gpuops.request-drain.0", "value": "training-a"}, user="U0DAVE")
    told = http_bot.slack.wait_for_response(url, lambda p: p.body.get("response_type") == "ephemeral")
    assert "`/gpu drain` needs the operator role; dave has viewer." in told.body["text"]
    assert http_bot.slack.calls("views.open") == []

    # A form submitted anyway (say, opened while dave still was an operator): the command refuses.
    form = {"id": "V0STALE", "private_metadata": json.dumps({"channel": CHANNEL})}
    ack = submit(http_bot, form, user="U0DAVE", targets="training-a-001", duration="2h", reason="mine now")
    assert (ack.status, ack.body) == (200, "")
    posted = http_bot.slack.wait_for("chat.postEphemeral")
    assert posted.args["user"] == "U0DAVE"
    assert "`/gpu drain` needs the operator role; dave has viewer." in text_of(posted.args["blocks"])
    assert form_deliveries(http_bot, 1) == ["refused"]
    assert stored_requests(http_bot) == []


def test_a_refusal_of_the_pool_policy_comes_back_naming_the_rule_and_nothing_is_stored(http_bot):
    # serving-a drains only in weekend windows and never below 48 ready GPUs.
    click_in_channel(http_bot, {"action_id": "gpuops.request-drain.0", "value": "serving-a-000"}, user="U0ERIN")
    view = opened_form(http_bot)

    submit(http_bot, view, user="U0ERIN", targets="serving-a-000", when="next-window", duration="1h",
           reason="NIC swap")

    posted = http_bot.slack.wait_for("chat.postEphemeral")
    assert "Drain refused (min_ready_gpus)" in text_of(posted.args["blocks"])
    assert form_deliveries(http_bot, 1) == ["refused"]
    assert stored_requests(http_bot) == []


def test_a_reason_that_starts_with_a_node_name_stays_the_reason_and_drains_only_the_named_node(http_bot):
    # The form submits a structured request: no words are made and read back, so a
    # reason naming another node is just the reason.
    click_in_channel(http_bot, {"action_id": "gpuops.request-drain.0", "value": "training-a-001"}, user="U0ALICE")
    view = opened_form(http_bot)

    submit(http_bot, view, user="U0ALICE", targets="training-a-001", reason="training-a-004 is next")

    http_bot.slack.wait_for("chat.postEphemeral")
    (request,) = stored_requests(http_bot)
    assert json.loads(request["targets"]) == ["training-a-001"]
    assert request["reason"] == "training-a-004 is next"
    assert form_deliveries(http_bot, 1) == ["answered"]


def test_empty_targets_over_socket_mode_are_a_field_error_in_the_ack(socket_bot, fake_socket_mode):
    envelope = fake_socket_mode.send_envelope("interactive", signing.view_submission_payload(
        callback_id=FORM, user_id="U0ALICE", private_metadata=json.dumps({"channel": CHANNEL}),
        values={"targets": {"targets": "  "}, "reason": {"reason": "firmware"}}))

    ack = fake_socket_mode.wait_for_ack(envelope)

    assert ack["payload"] == {"response_action": "errors", "errors": {"targets": "Name at least one GPU node, or a pool."}}
    assert form_deliveries(socket_bot, 1) == ["invalid"]
    assert stored_requests(socket_bot) == []


def test_in_the_console_the_button_says_which_gpu_drain_to_type(runtime):
    out = io.StringIO()
    run_console(["/gpu status training-a", "1"], runtime=runtime, out=out, as_user="U0ALICE")

    transcript = out.getvalue()
    assert "[1] Request a drain" in transcript
    assert ("In Slack this button opens the drain form. Here, type: "
            "/gpu drain training-a [at <time>|next-window] [for <duration>] [--include <node>,...] [reason]") in transcript
