"""The MIG change form over a fake Slack: alice clicks "Request a MIG change" on her Home
tab, Slack opens the form, and what she gets back is exactly what `/gpu mig` answers
(here, with no cluster to read the MIG manager's config from, its refusal saying so).
What the form can check itself comes back as field errors in the ack; nothing is stored.
Real Bolt app, signed HTTP requests, SQLite; the drain form's helpers drive Slack."""

from __future__ import annotations

from typing import Any

from testenv.fakeslack import signing
from tests.e2e.harness import send, text_of
from tests.e2e.test_drain_form import click_on_home, stored_requests

FORM = "gpuops.mig-request"


def mig_buttons(blocks: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [e for b in blocks or [] if b["type"] == "actions" for e in b["elements"]
            if e["text"]["text"] == "Request a MIG change"]


def open_home(bot, user: str) -> list[dict[str, Any]]:
    send(bot.url, signing.app_home_opened_body(user), content_type=signing.JSON)
    bot.deliveries.wait_for(lambda ds: any(d.kind == "home" for d in ds))
    return mig_buttons(bot.slack.workspace.home_view(user)["blocks"])


def submit(bot, view: dict[str, Any], *, user: str, targets: str, layout: str, reason: str,
           channel: str | None = None):
    values = {"targets": {"targets": targets}, "layout": {"layout": layout},
              "when": {"when": {"type": "static_select", "selected_option": {
                  "text": {"type": "plain_text", "text": "now"}, "value": "now"}}},
              "time": {"time": {"type": "datetimepicker", "selected_date_time": None}},
              "reason": {"reason": reason},
              "channel": {"channel": {"type": "conversations_select", "selected_conversation": channel}}}
    return send(bot.url, signing.view_submission_body(callback_id=FORM, user_id=user, view_id=view["id"],
                                                      values=values, private_metadata=view["private_metadata"]))


def test_an_operator_asks_for_a_mig_change_from_the_home_tab_and_gets_what_the_command_answers(http_bot):
    (button,) = open_home(http_bot, "U0ALICE")
    click_on_home(http_bot, button, user="U0ALICE")
    opened = http_bot.slack.wait_for("views.open", lambda c: c.args["view"].get("callback_id") == FORM)
    assert opened.ok, opened.error
    view = opened.response["view"]

    ack = submit(http_bot, view, user="U0ALICE", targets="inference-mig/*", layout="all 3g", reason=" ")
    assert set(ack.json()["errors"]) == {"targets", "layout", "reason", "channel"}

    ack = submit(http_bot, view, user="U0ALICE", targets="inference-mig", layout="all-3g.40gb",
                 reason="bigger slices", channel="C0OPS")
    assert (ack.status, ack.body) == (200, "")
    posted = http_bot.slack.wait_for("chat.postEphemeral")
    text = text_of(posted.args["blocks"])
    assert "MIG change refused (mig-config)" in text and "this gpuops reads no cluster" in text
    assert stored_requests(http_bot) == []


def test_a_viewer_is_not_offered_the_button(http_bot):
    assert open_home(http_bot, "U0DAVE") == []
