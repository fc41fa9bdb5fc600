"""`/gpu approve` and `/gpu deny` typed by someone just taken out of an approver group:
like the buttons, the commands that decide read the user's Slack groups afresh, so the
5-minute cache of group members cannot let a removed approver decide (found by the
security matrix, tests/reliability/inprocess/test_security.py)."""

from __future__ import annotations

from testenv.fakeslack import signing
from tests.e2e.harness import CHANNEL, send, submit_upgrade


def _command(bot, text: str, *, user: str) -> str:
    url = bot.slack.response_url(channel=CHANNEL, user=user)
    assert send(bot.url, signing.slash_command_body(text=text, user_id=user, response_url=url)).status == 200
    return url


def _frank_in_the_cache(bot) -> None:
    """Frank approves through S0SRE; his groups are read (and cached for 5 minutes)."""
    url = _command(bot, "requests", user="U0FRANK")
    bot.slack.wait_for_response(url)
    assert bot.bot.directory.roles_of("U0FRANK").has_anywhere("approver")  # type: ignore[arg-type]


def test_someone_just_taken_out_of_an_approver_group_cannot_approve_by_command(http_bot):
    request = submit_upgrade(http_bot.runtime)
    _frank_in_the_cache(http_bot)
    http_bot.set_usergroup("S0SRE", [])  # well within the 5-minute cache

    url = _command(http_bot, f"approve {request.id} {request.short_hash}", user="U0FRANK")

    assert "needs the approver role" in http_bot.slack.wait_for_response(url).body["text"]
    assert http_bot.runtime.services().requests.get(request.id).approvals_counted == 0


def test_someone_just_taken_out_of_an_approver_group_cannot_deny_by_command(http_bot):
    request = submit_upgrade(http_bot.runtime)
    _frank_in_the_cache(http_bot)
    http_bot.set_usergroup("S0SRE", [])

    url = _command(http_bot, f'"deny" {request.id} "not today"', user="U0FRANK")  # quoted words too

    assert "needs the approver role" in http_bot.slack.wait_for_response(url).body["text"]
    assert http_bot.runtime.services().requests.get(request.id).state == "pending"


def test_a_group_member_still_in_the_group_approves_by_command(http_bot):
    request = submit_upgrade(http_bot.runtime)

    url = _command(http_bot, f"approve {request.id} {request.short_hash}", user="U0FRANK")

    assert "Approved" in http_bot.slack.wait_for_response(url).body["text"]
    assert http_bot.runtime.services().requests.get(request.id).approvals_counted == 1
