"""People are named the one way a request's thread names them: the name the
configuration gives them, else a Slack mention (which Slack shows as that very user),
never the Slack display name its owner can change to anyone's. Mallory asks for drains
through the S0OPS group and has renamed herself "alice" in Slack."""

from __future__ import annotations

import datetime as dt

import pytest

from testenv.fakeslack import signing
from tests.e2e.harness import CHANNEL, a_plan, demo_config, send, text_of


@pytest.fixture
def config():
    return demo_config(usergroups={"S0OPS": ["operator"]})


@pytest.fixture
def mallorys_request(http_bot):
    http_bot.slack.workspace.add_user("U0MALLORY", name="mallory", display_name="alice")
    http_bot.slack.workspace.set_usergroup("S0OPS", ["U0MALLORY"])
    mallory = http_bot.bot.directory.actor("U0MALLORY")
    assert mallory.name == "alice"  # what Slack says her name is
    return http_bot.runtime.services().requests.submit(
        mallory, kind="upgrade", pool="serving-a", targets=["serving-a-000", "serving-a-003"],
        plan=a_plan("serving-a", created_for="U0MALLORY"), window_start=None, window_end=None,
        reason="580.105.08 fixes Xid 79 on H100", channel=CHANNEL, now=dt.datetime.now(dt.timezone.utc))


def _typed(bot, text: str, *, user: str = "U0BOB") -> str:
    url = bot.slack.response_url(channel=CHANNEL, user=user)
    assert send(bot.url, signing.slash_command_body(text=text, user_id=user, response_url=url)).status == 200
    return text_of(bot.slack.wait_for_response(url).body["blocks"])


def test_the_request_card_names_the_requester_by_a_mention_not_her_display_name(http_bot, mallorys_request):
    card = _typed(http_bot, f"request {mallorys_request.id}")

    assert "*Requested by*\n<@U0MALLORY>" in card
    assert "alice" not in card


def test_the_requests_list_names_the_requester_by_her_slack_id_not_her_display_name(http_bot, mallorys_request):
    listed = _typed(http_bot, "requests")

    assert mallorys_request.id in listed and "U0MALLORY" in listed
    assert "alice" not in listed


def test_the_home_tab_names_the_requester_by_a_mention_not_her_display_name(http_bot, mallorys_request):
    assert send(http_bot.url, signing.app_home_opened_body("U0BOB"), content_type=signing.JSON).status == 200
    http_bot.deliveries.wait_for(lambda ds: any(d.kind == "home" for d in ds))

    home = text_of(http_bot.slack.workspace.home_view("U0BOB")["blocks"])
    assert "requested by <@U0MALLORY>" in home
    assert "alice" not in home


def test_a_refusal_names_the_requester_by_her_slack_id_not_her_display_name(http_bot, mallorys_request):
    refused = _typed(http_bot, f"cancel {mallorys_request.id}", user="U0DAVE")  # dave is no operator
    assert "needs the operator role" in refused
    refused = _typed(http_bot, f"cancel {mallorys_request.id}", user="U0ALICE")  # an operator, not hers

    assert "Only the requester (" in refused and "U0MALLORY" in refused
    assert "alice" not in refused
