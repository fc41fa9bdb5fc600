"""The driver upgrade form over a fake Slack: alice clicks "Request a driver upgrade"
under `/gpu status training-a` (or on her Home tab), Slack opens the form, she submits
it, and what she gets back is exactly what `/gpu upgrade` answers: the plan with the
approval buttons and a pending request, or the refusal. What the form can check itself
comes back as field errors in the ack, and nothing is stored. Real Bolt app, signed HTTP
requests, SQLite; the drain form's helpers drive Slack."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from testenv.fakeslack import signing
from tests.e2e.harness import CHANNEL, ROOT, demo_config, send, text_of
from tests.e2e.test_drain_form import click_in_channel, click_on_home, slash, stored_requests
from workflows.config import GpuopsConfig

FORM = "gpuops.upgrade-request"
NEW = "580.105.08"


@pytest.fixture
def config() -> GpuopsConfig:
    pools = yaml.safe_load((ROOT / "deploy" / "config.example.yaml").read_text())["pools"]
    # The demo's one ClusterPolicy drives every pool: accepted, and the plan names the others.
    return demo_config(pools=pools, upgrades={"cluster_policy_scope": "all-pools"})


def upgrade_buttons(blocks: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [e for b in blocks or [] if b["type"] == "actions" for e in b["elements"]
            if e["text"]["text"] == "Request a driver upgrade"]


def opened_form(bot) -> dict[str, Any]:
    opened = bot.slack.wait_for("views.open", lambda c: c.args["view"].get("callback_id") == FORM)
    assert opened.ok, opened.error
    return opened.response["view"]


def submit(bot, view: dict[str, Any], *, user: str, pool: str, version: str, reason: str,
           downgrade: bool = False, channel: str | None = None):
    """Press "Plan the upgrade" with the start left at Now."""
    picked = [{"text": {"type": "plain_text", "text": "downgrade"}, "value": "downgrade"}] if downgrade else []
    values = {"pool": {"pool": pool}, "version": {"version": version},
              "when": {"when": {"type": "static_select", "selected_option": {
                  "text": {"type": "plain_text", "text": "now"}, "value": "now"}}},
              "time": {"time": {"type": "datetimepicker", "selected_date_time": None}},
              "downgrade": {"downgrade": {"type": "checkboxes", "selected_options": picked}},
              "reason": {"reason": reason}}
    if any(b.get("block_id") == "channel" for b in view.get("blocks") or ()):
        values["channel"] = {"channel": {"type": "conversations_select", "selected_conversation": channel}}
    return send(bot.url, signing.view_submission_body(callback_id=FORM, user_id=user, view_id=view["id"],
                                                      values=values, private_metadata=view["private_metadata"]))


def test_an_operator_requests_a_driver_upgrade_from_the_pool_status_and_gets_the_plan(http_bot):
    status = slash(http_bot, "status training-a", user="U0ALICE")
    (button,) = upgrade_buttons(status["blocks"])
    assert button["value"] == "training-a"

    click_in_channel(http_bot, button, user="U0ALICE")
    view = opened_form(http_bot)
    pool = next(b for b in view["blocks"] if b.get("block_id") == "pool")
    assert pool["element"]["initial_value"] == "training-a"

    # A reason may say anything, even what would be a flag in the command's words.
    ack = submit(http_bot, view, user="U0ALICE", pool="training-a", version=NEW, reason="CVE fix --dry-run")
    assert (ack.status, ack.body) == (200, "")
    posted = http_bot.slack.wait_for("chat.postEphemeral")
    assert (posted.args["channel"], posted.args["user"]) == (CHANNEL, "U0ALICE")
    text = text_of(posted.args["blocks"])
    (request,) = stored_requests(http_bot)
    assert (request["kind"], request["pool"], request["state"]) == ("upgrade", "training-a", "pending")
    assert (request["reason"], request["channel"]) == ("CVE fix --dry-run", CHANNEL)
    assert f"Driver upgrade {request['id']} · training-a" in text
    assert f"/gpu upgrade training-a to {NEW} CVE fix --dry-run" in text  # how to ask the same by typing


def test_what_the_form_can_check_comes_back_as_field_errors_and_nothing_is_stored(http_bot):
    click_on_home_button(http_bot, user="U0ALICE")
    view = opened_form(http_bot)
    assert any(b.get("block_id") == "channel" for b in view["blocks"])  # from Home: where to post

    ack = submit(http_bot, view, user="U0ALICE", pool="", version="latest", reason=" ")
    errors = ack.json()["errors"]
    assert set(errors) == {"pool", "version", "reason", "channel"}
    assert "is not a driver version" in errors["version"]
    assert stored_requests(http_bot) == []


def test_a_viewer_is_not_offered_the_button_and_is_refused_when_clicking_or_submitting_anyway(http_bot):
    status = slash(http_bot, "status training-a", user="U0DAVE")
    assert upgrade_buttons(status["blocks"]) == []
    send(http_bot.url, signing.app_home_opened_body("U0DAVE"), content_type=signing.JSON)
    http_bot.deliveries.wait_for(lambda ds: any(d.kind == "home" for d in ds))
    assert upgrade_buttons(http_bot.slack.workspace.home_view("U0DAVE")["blocks"]) == []

    url = click_in_channel(http_bot, {"action_id": "gpuops.request-upgrade.0", "value": "training-a"},
                           user="U0DAVE")
    told = http_bot.slack.wait_for_response(url, lambda p: p.body.get("response_type") == "ephemeral")
    assert "`/gpu upgrade` needs the operator role; dave has viewer." in told.body["text"]
    assert http_bot.slack.calls("views.open") == []

    form = {"id": "V0STALE", "private_metadata": json.dumps({"channel": CHANNEL})}
    ack = submit(http_bot, form, user="U0DAVE", pool="training-a", version=NEW, reason="mine now")
    assert (ack.status, ack.body) == (200, "")
    posted = http_bot.slack.wait_for("chat.postEphemeral")
    assert "`/gpu upgrade` needs the operator role; dave has viewer." in text_of(posted.args["blocks"])
    assert stored_requests(http_bot) == []


def click_on_home_button(bot, *, user: str) -> None:
    send(bot.url, signing.app_home_opened_body(user), content_type=signing.JSON)
    bot.deliveries.wait_for(lambda ds: any(d.kind == "home" for d in ds))
    (button,) = upgrade_buttons(bot.slack.workspace.home_view(user)["blocks"])
    assert not button.get("value")  # no pool filled in
    click_on_home(bot, button, user=user)
