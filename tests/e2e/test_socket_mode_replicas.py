"""Socket Mode with two replicas: both connect with the app token, Slack hands each
envelope to one connection, and an envelope the replica it went to never acknowledged (its
process died) is sent again to the other, which answers it once. The replicas share the
database, so an envelope sent again after one of them acknowledged it runs nothing twice.

The second replica is another Bolt app over the same runtime's database with its own
Socket Mode connection; a replica that dies between receiving an envelope and acknowledging
it is slack_sdk's SocketModeClient with no listener (it receives, it never acks), cut with
`drop_connection` as a killed process's socket is."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_sdk import WebClient
from slack_sdk.socket_mode import SocketModeClient

from bot.slack_api import web_client
from bot.slack_app import SlackBot, build_app
from testenv.fakeslack import FakeSlackWebApi, FakeSocketModeServer, signing
from tests.e2e.harness import CHANNEL, text_of


@pytest.fixture
def second_replica(socket_bot, fake_socket_mode: FakeSocketModeServer) -> Iterator[tuple[SocketModeHandler, SlackBot]]:
    """Another replica of the bot: its own app and connection, the same database."""
    client = web_client(socket_bot.slack.bot_token, base_url=socket_bot.slack.base_url)
    app, bot = build_app(socket_bot.runtime, client=client)
    handler = SocketModeHandler(app, socket_bot.slack.app_token, ping_interval=1)
    handler.connect()
    fake_socket_mode.wait_for_connections(2)
    try:
        yield handler, bot
    finally:
        fake_socket_mode.close_client(handler.client)
        app.listener_runner.listener_executor.shutdown(wait=True)  # type: ignore[attr-defined]


@pytest.fixture
def dying_replica(socket_bot, fake_socket_mode: FakeSocketModeServer) -> Iterator[int]:
    """A replica that takes envelopes and dies before it acknowledges any: its connection's number.
    A dead process does not reconnect, so neither does this client."""
    client = SocketModeClient(app_token=socket_bot.slack.app_token,
                              web_client=WebClient(base_url=socket_bot.slack.base_url), ping_interval=1,
                              auto_reconnect_enabled=False)
    client.connect()
    fake_socket_mode.wait_for_connections(2)
    try:
        yield 2
    finally:
        # slack_sdk's close() joins its receiving thread, which a dropped socket can leave
        # blocked in a read for good: close on a thread of its own and do not wait on it
        # past a bound (the "process" is dead; its threads are daemons).
        closing = threading.Thread(target=client.close, daemon=True)
        closing.start()
        closing.join(timeout=10)


def _status(slack: FakeSlackWebApi, user: str = "U0DAVE") -> tuple[str, dict[str, str]]:
    url = slack.response_url(channel=CHANNEL, user=user)
    return url, signing.slash_command_payload(text="status", user_id=user, response_url=url)


def test_two_replicas_in_socket_mode_share_the_envelopes_and_each_command_is_answered_once(
        socket_bot, second_replica, fake_socket_mode):
    sent = []
    for _ in range(6):
        url, payload = _status(socket_bot.slack)
        sent.append((url, fake_socket_mode.send_envelope("slash_commands", payload)))

    for url, envelope in sent:
        fake_socket_mode.wait_for_ack(envelope)
        assert "GPU fleet status" in text_of(socket_bot.slack.wait_for_response(url).body["blocks"])
    assert {fake_socket_mode.connection_of(envelope) for _, envelope in sent} == {1, 2}
    assert all(len(socket_bot.slack.response_posts(url)) == 1 for url, _ in sent)


def test_an_envelope_whose_replica_died_before_acking_reaches_the_other_and_is_answered_once(
        socket_bot, dying_replica, fake_socket_mode):
    url, payload = _status(socket_bot.slack)
    envelope = fake_socket_mode.send_envelope("slash_commands", payload)
    if fake_socket_mode.connection_of(envelope) != dying_replica:  # in turn: the next one goes there
        fake_socket_mode.wait_for_ack(envelope)
        url, payload = _status(socket_bot.slack)
        envelope = fake_socket_mode.send_envelope("slash_commands", payload)
    assert fake_socket_mode.connection_of(envelope) == dying_replica

    fake_socket_mode.drop_connection(dying_replica)

    assert fake_socket_mode.wait_for_ack(envelope) == {"envelope_id": envelope}
    assert fake_socket_mode.connection_of(envelope) == 1
    assert fake_socket_mode.envelopes[-1]["retry_attempt"] == 1
    assert "GPU fleet status" in text_of(socket_bot.slack.wait_for_response(url).body["blocks"])
    socket_bot.deliveries.wait_for(lambda ds: len(ds) >= 1)
    assert len(socket_bot.slack.response_posts(url)) == 1


def test_an_envelope_acked_by_one_replica_and_sent_again_to_the_other_runs_once(
        socket_bot, second_replica, fake_socket_mode):
    url, payload = _status(socket_bot.slack)
    first = fake_socket_mode.send_envelope("slash_commands", payload)
    fake_socket_mode.wait_for_ack(first)
    socket_bot.slack.wait_for_response(url)
    took_first = fake_socket_mode.connection_of(first)

    # Slack did not get the ack in time and sends it again: to the other connection, in turn.
    fake_socket_mode.send_envelope("slash_commands", payload, envelope_id=first, retry_attempt=1,
                                   retry_reason="timeout")

    assert fake_socket_mode.connection_of(first) != took_first
    handler, bot = second_replica
    by_replica = {1: socket_bot.deliveries, 2: bot.deliveries}
    dropped = by_replica[fake_socket_mode.connection_of(first)].wait_for(lambda ds: len(ds) >= 1)
    assert [d.outcome for d in dropped] == ["duplicate"]
    # Recorded after the answer went out and the inbox was told (the answer is already seen).
    answered = by_replica[took_first].wait_for(lambda ds: len(ds) >= 1)
    assert [d.outcome for d in answered] == ["answered"]
    assert len(socket_bot.slack.response_posts(url)) == 1
