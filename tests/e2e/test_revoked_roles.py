"""Someone just taken out of the Slack user group that gave them a role cannot change
anything on the cached members: every command the registry marks as changing something,
every button and every request form reads the user's groups afresh, so the revocation
takes effect on the next click. What only reads keeps the 5-minute cache.

Grace has no role of her own: S0OPS makes her an operator, S0SRE an approver, S0ADMINS
an admin. A fresh read may take members read a few seconds before (`FRESH_AGE`), so the
test lets that much time pass after changing a group (`set_usergroup`).
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from bot.identity import FRESH_AGE
from commands.catalog import REGISTRY
from testenv.fakeslack import signing
from tests.e2e.harness import CHANNEL, demo_config, send, submit_upgrade, text_of
from tests.e2e.test_drain_form import form_deliveries, stored_requests, submit
from workflows.access import Role

GROUP_OF = {Role.OPERATOR: "S0OPS", Role.APPROVER: "S0SRE", Role.ADMIN: "S0ADMINS"}
CHANGING = sorted((spec for spec in REGISTRY.commands.values() if spec.changes), key=lambda spec: spec.name)


@pytest.fixture
def config():
    return demo_config(usergroups={"S0OPS": ["operator"], "S0ADMINS": ["admin"]})


@pytest.fixture
def grace(http_bot):
    http_bot.slack.workspace.add_user("U0GRACE", name="grace")
    for group in ("S0OPS", "S0ADMINS"):
        http_bot.slack.workspace.set_usergroup(group, [])
    return http_bot


def _command(bot, text: str, *, user: str = "U0GRACE") -> str:
    url = bot.slack.response_url(channel=CHANNEL, user=user)
    assert send(bot.url, signing.slash_command_body(text=text, user_id=user, response_url=url)).status == 200
    return bot.slack.wait_for_response(url).body["text"]


def _click(bot, action: str, value: str, *, user: str = "U0GRACE") -> str:
    """What the clicker is told (and the message shows) once the click is handled."""
    url = bot.slack.response_url(channel=CHANNEL, message_ts="1700000000.000100", user=user)
    body = signing.block_actions_body(action_id=f"gpuops.{action}.0", value=value, user_id=user,
                                      message_ts="1700000000.000100", channel_id=CHANNEL, response_url=url)
    handled = len(bot.deliveries.all())
    assert send(bot.url, body).status == 200
    bot.deliveries.wait_for(lambda ds: len(ds) > handled)
    return "\n".join(post.body["text"] for post in bot.slack.response_posts(url) if post.body)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def test_every_command_but_the_read_only_ones_counts_as_changing_something():
    # A new command changes something until it is registered `changes=False`.
    assert {"freeze", "unfreeze", "migrate confirm", "cancel", "pause", "resume", "abort", "uncordon", "rollback",
            "drain", "upgrade", "mig", "migrate", "approve", "deny"} <= {spec.name for spec in CHANGING}
    assert all(spec.role == Role.VIEWER for spec in REGISTRY.commands.values() if not spec.changes)


@pytest.mark.parametrize("spec", CHANGING, ids=lambda spec: spec.name)
def test_someone_just_taken_out_of_the_group_that_gave_the_role_cannot_run_the_command_next(grace, spec):
    group = GROUP_OF[spec.role]
    grace.set_usergroup(group, ["U0GRACE"])
    # Without arguments: past the door, the command answers with its usage.
    assert f"needs the {spec.role} role" not in _command(grace, spec.name)

    grace.set_usergroup(group, [])  # well within the 5-minute cache

    assert f"needs the {spec.role} role" in _command(grace, spec.name)


def test_commands_that_only_read_keep_the_cached_members(grace):
    grace.set_usergroup("S0OPS", ["U0GRACE"])
    _command(grace, "freezes")
    read = len(grace.slack.calls("usergroups.users.list"))

    grace.set_usergroup("S0OPS", [])
    assert "needs the" not in _command(grace, "requests")
    assert "needs the" not in _command(grace, "status")

    assert len(grace.slack.calls("usergroups.users.list")) == read


# (button, its value, the role its group gives, what it answers while she holds it)
BUTTONS = [
    ("host-driver-removed", "run-0a1b2c@serving-a-000", Role.OPERATOR, "run-0a1b2c"),
    ("rollback", "run-0a1b2c", Role.OPERATOR, "run-0a1b2c"),
]


@pytest.mark.parametrize("action, value, role, holding", BUTTONS, ids=[b[0] for b in BUTTONS])
def test_someone_just_taken_out_of_the_group_that_gave_the_role_cannot_press_the_button_next(
        grace, action, value, role, holding):
    group = GROUP_OF[role]
    grace.set_usergroup(group, ["U0GRACE"])
    answer = _click(grace, action, value)
    assert holding in answer and f"needs the {role} role" not in answer  # past the door: no such run

    grace.set_usergroup(group, [])

    assert f"needs the {role} role" in _click(grace, action, value)


def test_an_admin_just_taken_out_of_the_admins_group_cannot_cancel_someone_elses_request_by_button(grace):
    first, second = submit_upgrade(grace.runtime), submit_upgrade(grace.runtime)
    grace.set_usergroup("S0ADMINS", ["U0GRACE"])
    _click(grace, "cancel", first.id)
    assert grace.runtime.services().requests.get(first.id).state == "cancelled"

    grace.set_usergroup("S0ADMINS", [])

    assert "requester" in _click(grace, "cancel", second.id)
    assert grace.runtime.services().requests.get(second.id).state == "pending"


def test_an_operator_just_taken_out_of_the_operators_group_cannot_abort_a_run_by_button(grace):
    services = grace.runtime.services()
    runs = []
    for _ in range(2):
        view = submit_upgrade(grace.runtime)
        for approver in ("U0BOB", "U0CAROL"):
            services.requests.approve(services.config.actor(approver), view.id, plan_hash=view.plan_hash, now=_now())
        runs.append(services.runs.start(view.id, dry_run=False, now=_now(),
                                        actor=services.config.actor("U0ALICE")).id)
    grace.set_usergroup("S0OPS", ["U0GRACE"])
    _click(grace, "abort", runs[0])
    assert services.runs.get(runs[0]).run.state == "aborted"

    grace.set_usergroup("S0OPS", [])

    assert "needs the operator role" in _click(grace, "abort", runs[1])
    assert services.runs.get(runs[1]).run.state != "aborted"


def test_an_operator_just_taken_out_of_the_operators_group_cannot_submit_the_drain_form(grace):
    grace.set_usergroup("S0OPS", ["U0GRACE"])
    assert "needs the" not in _command(grace, "freezes")  # her groups, read into the cache
    grace.set_usergroup("S0OPS", [])

    form = {"id": "V0OPENED", "private_metadata": json.dumps({"channel": CHANNEL})}
    submit(grace, form, user="U0GRACE", targets="training-a-001", duration="2h", reason="disk swap")

    assert form_deliveries(grace, 1) == ["refused"]
    assert "`/gpu drain` needs the operator role" in text_of(grace.slack.last("chat.postEphemeral").args["blocks"])
    assert stored_requests(grace) == []


def test_when_slack_cannot_list_the_groups_just_now_the_refusal_says_so(grace):
    grace.set_usergroup("S0OPS", ["U0GRACE"])
    assert "needs the" not in _command(grace, "freezes")
    grace.clock.skip(FRESH_AGE + 1)
    grace.slack.fail_next("usergroups.users.list", "internal_error", status=200, times=3)  # each group

    refused = _command(grace, "pause run-0a1b2c")

    assert "`/gpu pause` needs the operator role; grace has no role (gpuops could not read the Slack user " \
           "groups S0ADMINS, S0OPS, S0SRE just now, so the roles they give are not counted; try again in a minute)" \
           in refused
