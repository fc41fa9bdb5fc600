"""The fake Slack behaves like Slack for the real slack_sdk and slack_bolt clients: what
it records, what it refuses and why, rate limits, response_urls, Socket Mode and
request signatures. Everything runs on 127.0.0.1 port 0 and waits on conditions."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from typing import Any

import pytest
from slack_bolt import App
from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_bolt.request import BoltRequest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler
from slack_sdk.signature import Clock, SignatureVerifier
from slack_sdk.socket_mode.builtin import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.webhook import WebhookClient

from testenv.fakeslack import FakeSlackWebApi, Workspace, blockkit, signing


SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
NOW = 1_700_000_000


class FixedClock(Clock):
    def now(self) -> float:
        return float(NOW)


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


@pytest.fixture
def client(fake_slack: FakeSlackWebApi) -> WebClient:
    return WebClient(token=fake_slack.bot_token, base_url=fake_slack.base_url)


# ---------------------------------------------------------------------- messages
def test_a_posted_message_is_recorded_and_can_then_be_updated_in_place(fake_slack, client):
    posted = client.chat_postMessage(channel="C0OPS", text="draining gpu-1", blocks=[section("draining *gpu-1*")])
    client.chat_update(channel="C0OPS", ts=posted["ts"], text="gpu-1 drained", blocks=[section("*gpu-1* drained")])

    call = fake_slack.last("chat.postMessage")
    assert (call.token, call.args["text"]) == (fake_slack.bot_token, "draining gpu-1")
    assert call.args["blocks"] == [section("draining *gpu-1*")]  # decoded from the form body
    assert posted["channel"] == "C0OPS" and posted["ts"]
    (message,) = fake_slack.workspace.messages("C0OPS")
    assert (message.ts, message.text, message.blocks, message.edits) == (
        posted["ts"], "gpu-1 drained", [section("*gpu-1* drained")], 1,
    )


def test_updating_a_message_that_does_not_exist_answers_message_not_found(client):
    with pytest.raises(SlackApiError) as refused:
        client.chat_update(channel="C0OPS", ts="1700000000.999999", text="x")
    assert refused.value.response["error"] == "message_not_found"


def test_a_message_of_51_blocks_is_refused_naming_the_50_block_limit(fake_slack, client):
    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel="C0OPS", text="fleet", blocks=[{"type": "divider"}] * 51)

    assert refused.value.response["error"] == "invalid_blocks"
    assert refused.value.response["errors"] == ["blocks: block 51 exceeds the 50-block limit"]
    assert fake_slack.workspace.messages("C0OPS") == []


def test_a_section_of_3001_characters_is_refused_and_one_of_3000_is_not(client):
    client.chat_postMessage(channel="C0OPS", text="ok", blocks=[section("x" * 3000)])
    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel="C0OPS", text="too long", blocks=[section("ok"), section("x" * 3001)])

    assert refused.value.response["errors"] == ["blocks[1].text: must be less than 3001 characters (got 3001)"]


def test_a_text_over_40000_characters_is_refused_as_msg_too_long(client):
    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel="C0OPS", text="x" * 40_001)
    assert refused.value.response["error"] == "msg_too_long"


def error_of(call: Any) -> str:
    """The error Slack answered a call with (slack_sdk raises SlackApiError for it)."""
    with pytest.raises(SlackApiError) as refused:
        call()
    return refused.value.response["error"]


def test_a_post_without_a_channel_or_without_any_content_is_refused(client):
    no_channel = error_of(lambda: client.api_call("chat.postMessage", params={"text": "hello"}))
    no_text = error_of(lambda: client.api_call("chat.postMessage", params={"channel": "C0OPS"}))

    assert (no_channel, no_text) == ("channel_not_found", "no_text")


def test_posting_to_an_unknown_channel_or_one_the_bot_is_not_in_is_refused(fake_slack, client):
    fake_slack.workspace.add_channel("C0PRIVATE", bot_is_member=False)

    errors = []
    for channel in ("C0NOWHERE", "C0PRIVATE"):
        with pytest.raises(SlackApiError) as refused:
            client.chat_postMessage(channel=channel, text="hi")
        errors.append(refused.value.response["error"])
    assert errors == ["channel_not_found", "not_in_channel"]


def test_an_unknown_method_is_refused_and_still_recorded(fake_slack, client):
    with pytest.raises(SlackApiError) as refused:
        client.api_call("chat.scheduleMessage", params={"channel": "C0OPS", "text": "x", "post_at": 1})

    assert refused.value.response["error"] == "unknown_method"
    assert fake_slack.last("chat.scheduleMessage").error == "unknown_method"


def test_a_missing_unknown_or_wrong_kind_of_token_is_refused(fake_slack):
    def error(token: str | None, method: str = "auth.test") -> str:
        return error_of(lambda: WebClient(token=token, base_url=fake_slack.base_url).api_call(method))

    assert error(None) == "not_authed"
    assert error("xoxb-someone-else") == "invalid_auth"
    assert error(fake_slack.app_token) == "not_allowed_token_type"
    assert error(fake_slack.bot_token, "apps.connections.open") == "not_allowed_token_type"


def test_users_and_user_groups_come_from_the_configured_workspace():
    workspace = Workspace(
        users={"U0BOB": {"name": "bob", "tz": "Europe/Berlin"}},
        usergroups={"S0ONCALL": ["U0BOB"]},
    )
    with FakeSlackWebApi(workspace) as fake:
        client = WebClient(token=fake.bot_token, base_url=fake.base_url)

        assert client.users_info(user="U0BOB")["user"]["tz"] == "Europe/Berlin"
        assert client.usergroups_users_list(usergroup="S0ONCALL")["users"] == ["U0BOB"]
        assert client.conversations_open(users="U0BOB")["channel"]["id"] == "D0BOB"
        for call, error in (
            (lambda: client.users_info(user="U0NOBODY"), "user_not_found"),
            (lambda: client.api_call("users.info"), "invalid_arguments"),
            (lambda: client.usergroups_users_list(usergroup="S0NONE"), "no_such_subteam"),
        ):
            with pytest.raises(SlackApiError) as refused:
                call()
            assert refused.value.response["error"] == error


def test_wait_for_returns_a_call_made_on_another_thread_and_names_what_came_instead(fake_slack, client):
    poster = threading.Thread(target=lambda: client.chat_postMessage(channel="C0OPS", text="from a worker"))
    poster.start()

    call = fake_slack.wait_for("chat.postMessage", lambda c: c.args.get("text") == "from a worker")
    poster.join()
    assert call.ok
    with pytest.raises(TimeoutError, match=r"chat.postMessage\(ok\)"):
        fake_slack.wait_for("chat.delete", timeout=0.05)


# ---------------------------------------------------------------------- rate limits
def test_a_rate_limited_call_is_retried_after_retry_after_and_then_succeeds(fake_slack):
    client = WebClient(
        token=fake_slack.bot_token, base_url=fake_slack.base_url,
        retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=2)],
    )
    fake_slack.rate_limit("chat.postMessage", times=1, retry_after=1)

    posted = client.chat_postMessage(channel="C0OPS", text="eventually")

    assert posted["ok"]
    first, second = fake_slack.calls("chat.postMessage")
    assert (first.status, first.error, second.status) == (429, "ratelimited", 200)
    assert second.at - first.at >= 1  # the client honoured Retry-After


def test_without_a_retry_handler_the_rate_limit_reaches_the_caller_with_retry_after(fake_slack, client):
    fake_slack.fail_next("chat.postMessage", retry_after=7)

    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel="C0OPS", text="x")

    assert refused.value.response.status_code == 429
    assert refused.value.response.headers["Retry-After"] == "7"
    assert client.chat_postMessage(channel="C0OPS", text="x")["ok"]  # only the next call failed


def test_an_injected_error_answers_ok_false_once(fake_slack, client):
    fake_slack.fail_next("users.info", "fatal_error", status=200)

    assert error_of(lambda: client.users_info(user="U0ALICE")) == "fatal_error"
    assert client.users_info(user="U0ALICE")["user"]["name"] == "alice"


# ---------------------------------------------------------------------- views and files
def test_a_home_tab_of_101_blocks_is_refused_and_one_of_100_is_published(fake_slack, client):
    with pytest.raises(SlackApiError) as refused:
        client.views_publish(user_id="U0ALICE", view={"type": "home", "blocks": [{"type": "divider"}] * 101})
    client.views_publish(user_id="U0ALICE", view={"type": "home", "blocks": [{"type": "divider"}] * 100})

    assert refused.value.response["errors"] == ["view.blocks: block 101 exceeds the 100-block limit"]
    assert len(fake_slack.workspace.home_view("U0ALICE")["blocks"]) == 100


def test_a_modal_opens_once_per_trigger_and_updates_by_view_id(fake_slack, client):
    modal = {
        "type": "modal", "callback_id": "drain", "title": {"type": "plain_text", "text": "Drain gpu-1"},
        "blocks": [section("Drain *gpu-1*?")],
    }
    opened = client.views_open(trigger_id="T1", view=modal)
    client.views_update(view_id=opened["view"]["id"], view={**modal, "blocks": [section("Draining...")]})

    assert fake_slack.workspace.view(opened["view"]["id"])["blocks"] == [section("Draining...")]
    for view, error in (
        (modal, "exchanged_trigger_id"),
        ({**modal, "title": {"type": "plain_text", "text": "x" * 25}}, "invalid_blocks"),
    ):
        with pytest.raises(SlackApiError) as refused:
            client.views_open(trigger_id="T1", view=view)
        assert refused.value.response["error"] == error
    assert "view.title: must be less than 25 characters (got 25)" in refused.value.response["errors"]


def test_a_large_reply_can_be_uploaded_as_a_file_to_a_channel(fake_slack, client):
    report = "gpu-1 ready\n" * 5000

    client.files_upload_v2(channel="C0OPS", content=report, filename="fleet.txt", title="Fleet")

    (uploaded,) = fake_slack.workspace.files()
    assert (uploaded.filename, uploaded.title, uploaded.channel) == ("fleet.txt", "Fleet", "C0OPS")
    assert uploaded.completed
    assert uploaded.content == report.encode()


# ---------------------------------------------------------------------- response_url
def test_a_response_url_takes_five_posts_and_then_answers_404_expired_url(fake_slack):
    webhook = WebhookClient(fake_slack.response_url())

    statuses = [webhook.send(text=f"reply {n}").status_code for n in range(6)]

    assert statuses == [200, 200, 200, 200, 200, 404]
    assert json.loads(webhook.send(text="again").body)["error"] == "expired_url"
    assert [p.body["text"] for p in fake_slack.response_posts() if p.ok] == [f"reply {n}" for n in range(5)]


def test_an_expired_response_url_answers_404(fake_slack):
    url = fake_slack.response_url()
    fake_slack.expire_response_url(url)

    answer = WebhookClient(url).send(text="too late")

    assert (answer.status_code, json.loads(answer.body)["error"]) == (404, "expired_url")


def test_a_response_url_enforces_block_limits_and_replaces_the_message_it_belongs_to(fake_slack, client):
    posted = client.chat_postMessage(channel="C0OPS", text="Approve?", blocks=[section("Approve?")])
    webhook = WebhookClient(fake_slack.response_url(channel="C0OPS", message_ts=posted["ts"]))

    too_many = webhook.send(text="x", blocks=[{"type": "divider"}] * 51, replace_original=True)
    replaced = webhook.send(text="Approved by alice", blocks=[section("Approved")], replace_original=True)

    assert too_many.status_code == 400 and json.loads(too_many.body)["error"] == "invalid_blocks"
    assert replaced.status_code == 200
    assert fake_slack.workspace.message("C0OPS", posted["ts"]).text == "Approved by alice"


def test_a_response_url_bound_to_a_channel_posts_in_channel_replies_and_deletes_the_original(fake_slack, client):
    posted = client.chat_postMessage(channel="C0OPS", text="Approve?")
    webhook = WebhookClient(fake_slack.response_url(channel="C0OPS", message_ts=posted["ts"], user="U0ALICE"))

    webhook.send(text="alice approved", response_type="in_channel")
    webhook.send(text="only you can see this")
    webhook.send(delete_original=True)

    assert [m.text for m in fake_slack.workspace.messages("C0OPS")] == ["alice approved"]
    assert [e.text for e in fake_slack.workspace.ephemerals(user="U0ALICE")] == ["only you can see this"]


# ---------------------------------------------------------------------- Block Kit limits
def button(**changes: Any) -> dict[str, Any]:
    return {"type": "button", "action_id": "go", "text": plain("Go"), "value": "v", **changes}


def option(text: str = "o", value: str = "v") -> dict[str, Any]:
    return {"text": {"type": "plain_text", "text": text}, "value": value}


def confirm(**changes: Any) -> dict[str, Any]:
    dialog = {"title": plain("Sure?"), "text": plain("Really?"), "confirm": plain("Yes"), "deny": plain("No")}
    return {**dialog, **changes}


def actions(*elements: dict[str, Any]) -> dict[str, Any]:
    return {"type": "actions", "elements": list(elements)}


def plain(text: str) -> dict[str, str]:
    return {"type": "plain_text", "text": text}


B0 = "blocks[0]"
E0 = "blocks[0].elements[0]"
SELECT = {"type": "static_select", "action_id": "s"}


@pytest.mark.parametrize(
    ("block", "error"),
    [
        ({"type": "section", "fields": [plain("f")] * 11}, f"{B0}.fields: must have no more than 10 items"),
        ({"type": "section", "fields": [plain("x" * 2001)]}, f"{B0}.fields[0]: must be less than 2001 characters"),
        ({"type": "header", "text": plain("x" * 151)}, f"{B0}.text: must be less than 151 characters"),
        ({"type": "context", "elements": [plain("c")] * 11}, f"{B0}.elements: must have no more than 10 items"),
        (actions(*[button(action_id=f"{i}") for i in range(26)]), f"{B0}.elements: must have no more than 25"),
        ({"type": "divider", "block_id": "b" * 256}, f"{B0}.block_id: must be less than 256 characters"),
        (actions(button(action_id="a" * 256)), f"{E0}.action_id: must be less than 256 characters"),
        (actions(button(text=plain("x" * 76))), f"{E0}.text: must be less than 76 characters"),
        (actions(button(value="x" * 2001)), f"{E0}.value: must be less than 2001 characters"),
        (actions(button(url="https://" + "x" * 2993)), f"{E0}.url: must be less than 3001 characters"),
        (actions({**SELECT, "options": [option(text="x" * 76)]}), f"{E0}.options[0].text: must be less than 76"),
        (actions({**SELECT, "options": [option(value="x" * 151)]}), f"{E0}.options[0].value: must be less than 151"),
        (actions(button(confirm=confirm(title=plain("x" * 101)))), f"{E0}.confirm.title: must be less than 101"),
        (actions(button(confirm=confirm(text=plain("x" * 301)))), f"{E0}.confirm.text: must be less than 301"),
        (actions(button(confirm=confirm(confirm=plain("x" * 31)))), f"{E0}.confirm.confirm: must be less than 31"),
        (actions(button(confirm=confirm(deny=plain("x" * 31)))), f"{E0}.confirm.deny: must be less than 31"),
        (actions(button(), button()), "blocks[0].elements[1].action_id: duplicate action_id 'go'"),
        ({"type": "sectoin", "text": plain("typo")}, f"{B0}.type: unknown block type 'sectoin'"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_block_kit_limit_is_refused_with_where_and_what(block, error):
    errors = blockkit.message_errors(blocks=[block])

    assert any(e.startswith(error) for e in errors), errors


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"title": plain("x" * 25)}, "view.title: must be less than 25 characters"),
        ({"submit": plain("x" * 25)}, "view.submit: must be less than 25 characters"),
        ({"close": plain("x" * 25)}, "view.close: must be less than 25 characters"),
        ({"private_metadata": "x" * 3001}, "view.private_metadata: must be less than 3001 characters"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_modal_limit_is_refused_with_where_and_what(changes, error):
    modal = {"type": "modal", "title": plain("Drain"), "blocks": [], **changes}

    assert any(e.startswith(error) for e in blockkit.view_errors(modal)), blockkit.view_errors(modal)


def test_blocks_within_every_limit_pass():
    blocks = [
        {"type": "header", "text": plain("x" * 150)},
        {"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3000}, "fields": [plain("x" * 2000)] * 10,
         "accessory": button(action_id="acc")},
        {"type": "context", "elements": [plain("c")] * 10},
        actions(*[button(action_id=f"a{i}", value="x" * 2000) for i in range(25)]),
    ] + [{"type": "divider"}] * 46

    assert blockkit.message_errors(blocks=blocks) == []


# ---------------------------------------------------------------------- Socket Mode
@pytest.fixture
def socket_client(fake_slack, fake_socket_mode):
    """The real builtin SocketModeClient, acking every envelope with a payload."""
    client = SocketModeClient(
        app_token=fake_slack.app_token, web_client=WebClient(base_url=fake_slack.base_url), ping_interval=1,
    )
    seen: list[dict[str, Any]] = []

    def on_message(_client, message: dict[str, Any], _raw: str | None) -> None:
        seen.append(message)

    def ack(client: SocketModeClient, request: SocketModeRequest) -> None:
        client.send_socket_mode_response(
            SocketModeResponse(
                envelope_id=request.envelope_id, payload={"text": f"ack {request.payload.get('text')}"}
            )
        )

    client.message_listeners.append(on_message)
    client.socket_mode_request_listeners.append(ack)
    client.seen = seen  # type: ignore[attr-defined]
    client.connect()
    yield client
    fake_socket_mode.close_client(client)


def test_the_real_socket_mode_client_connects_receives_an_envelope_and_acks_it(
    fake_slack, fake_socket_mode, socket_client
):
    envelope_id = fake_socket_mode.send_envelope("slash_commands", {"command": "/gpu", "text": "status"})

    ack = fake_socket_mode.wait_for_ack(envelope_id)

    assert ack == {"envelope_id": envelope_id, "payload": {"text": "ack status"}}
    assert socket_client.seen[0]["type"] == "hello"
    assert fake_slack.last("apps.connections.open").token == fake_slack.app_token
    assert fake_socket_mode.envelopes[0]["accepts_response_payload"] is True
    fake_socket_mode.ping(b"still there?")  # answered with a pong, or this times out


def test_after_a_disconnect_message_the_client_reconnects_and_keeps_receiving(
    fake_slack, fake_socket_mode, socket_client
):
    fake_socket_mode.wait_for_ack(fake_socket_mode.send_envelope("slash_commands", {"text": "before"}))

    fake_socket_mode.disconnect()
    fake_socket_mode.wait_for_connections(2)
    envelope_id = fake_socket_mode.send_envelope(
        "events_api", signing.app_home_opened_event("U0ALICE"), retry_attempt=1, retry_reason="timeout",
    )

    assert fake_socket_mode.wait_for_ack(envelope_id)["envelope_id"] == envelope_id
    assert len(fake_slack.calls("apps.connections.open")) == 2
    assert fake_socket_mode.open_connections == 1
    assert fake_socket_mode.envelopes[-1]["retry_attempt"] == 1


def test_envelopes_and_acks_of_100_kb_cross_the_socket_intact(fake_socket_mode, socket_client):
    text = "gpu-1 " * 20_000

    ack = fake_socket_mode.wait_for_ack(fake_socket_mode.send_envelope("slash_commands", {"text": text}))

    assert ack["payload"]["text"] == f"ack {text}"


def test_a_used_socket_mode_url_cannot_be_connected_to_again(fake_socket_mode, socket_client):
    used = urllib.parse.urlparse(socket_client.wss_uri)

    with socket.create_connection((used.hostname, used.port), timeout=5) as sock:
        sock.sendall(
            f"GET /link/?{used.query} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        answer = sock.recv(100)

    assert answer.startswith(b"HTTP/1.1 401")


def test_a_bolt_app_in_socket_mode_answers_a_slash_command_in_its_ack(fake_slack, fake_socket_mode):
    app = App(client=WebClient(token=fake_slack.bot_token, base_url=fake_slack.base_url))

    @app.command("/gpu")
    def gpu(ack, command):
        ack(f"you asked for {command['text']}")

    handler = SocketModeHandler(app, fake_slack.app_token, ping_interval=1)
    handler.connect()
    try:
        envelope_id = fake_socket_mode.send_envelope(
            "slash_commands", signing.slash_command_payload(text="status", response_url=fake_slack.response_url()),
        )
        ack = fake_socket_mode.wait_for_ack(envelope_id)
    finally:
        fake_socket_mode.close_client(handler.client)

    assert ack["payload"]["text"] == "you asked for status"


# ---------------------------------------------------------------------- signing
def test_a_signed_body_passes_slack_sdks_verifier_and_tampering_with_body_or_time_fails():
    body = signing.slash_command_body(text="drain gpu-1", user_id="U0ALICE")
    headers = signing.sign(body, secret=SECRET, timestamp=NOW)
    verifier = SignatureVerifier(SECRET, clock=FixedClock())

    assert verifier.is_valid(body, headers["X-Slack-Request-Timestamp"], headers["X-Slack-Signature"])
    assert not verifier.is_valid(body.replace(b"gpu-1", b"gpu-2"), str(NOW), headers["X-Slack-Signature"])
    assert not verifier.is_valid(body, str(NOW + 1), headers["X-Slack-Signature"])
    assert not SignatureVerifier("another-secret", clock=FixedClock()).is_valid_request(body, headers)


def test_a_signed_slash_command_reaches_a_bolt_app_whose_reply_lands_on_the_response_url(fake_slack):
    app = App(signing_secret=SECRET, client=WebClient(token=fake_slack.bot_token, base_url=fake_slack.base_url))

    @app.command("/gpu")
    def gpu(ack, respond, command):
        ack()
        respond(f"status of {command['text']}")

    body = signing.slash_command_body(text="gpu-1", response_url=fake_slack.response_url())
    # bolt accepts only timestamps within 5 minutes of its own clock
    headers = {**signing.sign(body, secret=SECRET, timestamp=int(time.time())), "Content-Type": signing.FORM}

    response = app.dispatch(BoltRequest(body=body.decode(), headers=headers))

    assert response.status == 200
    assert fake_slack.wait_for_response().body["text"] == "status of gpu-1"


def test_interaction_bodies_carry_what_slack_sends():
    click = signing.block_actions_body(
        action_id="approve", value="req-1", block_id="decision", message_ts="1700000000.000001",
        channel_id="C0OPS", response_url="http://x/response/1", trigger_id="T1", user_id="U0BOB",
    )
    submit = signing.view_submission_body(
        callback_id="drain", values={"reason": {"text": "maintenance"}}, private_metadata="gpu-1",
    )

    action = json.loads(urllib.parse.parse_qs(click.decode())["payload"][0])
    view = json.loads(urllib.parse.parse_qs(submit.decode())["payload"][0])
    assert action["type"] == "block_actions" and action["user"]["id"] == "U0BOB"
    assert action["actions"] == [
        {"type": "button", "action_id": "approve", "block_id": "decision", "value": "req-1",
         "action_ts": "1700000001.000001"}
    ]
    assert (action["container"]["message_ts"], action["channel"]["id"], action["trigger_id"]) == (
        "1700000000.000001", "C0OPS", "T1",
    )
    assert view["view"]["state"]["values"] == {
        "reason": {"text": {"type": "plain_text_input", "value": "maintenance"}}
    }
    assert view["view"]["private_metadata"] == "gpu-1"
    event = json.loads(signing.app_home_opened_body("U0BOB"))
    assert (event["type"], event["event"]["type"]) == ("event_callback", "app_home_opened")
    assert event["event"]["user"] == "U0BOB"
