"""Operators per pool over Slack: the training team (the Slack user group S0TRAIN) operates
training-a, whose operator list is exclusive (`global_operators: false`); serving-a keeps
the fleet's operators. A slash command or a button on another pool's run is refused with
a sentence naming the pool and who may act there, and the run stays as it was.

frank is an approver (S0SRE) and, through S0TRAIN, an operator of training-a only; alice
is the fleet's operator; bob and carol approve.
"""

from __future__ import annotations

import datetime as dt

import pytest

from bot.intents import encode_value
from testenv.fakeslack import signing
from tests.e2e.harness import CHANNEL, a_plan, demo_config, send, submit_upgrade
from workflows.config import GpuopsConfig

TRAINING_OPERATORS = ("S0TRAIN",)


@pytest.fixture
def config() -> GpuopsConfig:
    base = demo_config()
    pools = {name: policy.model_dump(exclude_unset=True) for name, policy in base.pools.items()}
    pools["training-a"] = {**pools["training-a"], "operators": ["group:S0TRAIN"], "global_operators": False}
    return demo_config(pools=pools)


@pytest.fixture
def bot(http_bot):
    http_bot.slack.workspace.set_usergroup("S0TRAIN", ["U0FRANK"])
    return http_bot


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _command(bot, text: str, *, user: str) -> str:
    url = bot.slack.response_url(channel=CHANNEL, user=user)
    assert send(bot.url, signing.slash_command_body(text=text, user_id=user, response_url=url)).status == 200
    return bot.slack.wait_for_response(url).body["text"]


def _click(bot, action: str, value: str, *, user: str) -> str:
    """The refusal the clicker is told."""
    url = bot.slack.response_url(channel=CHANNEL, message_ts="1700000000.000100", user=user)
    body = signing.block_actions_body(action_id=f"gpuops.{action}.0", value=value, user_id=user,
                                      message_ts="1700000000.000100", channel_id=CHANNEL, response_url=url)
    assert send(bot.url, body).status == 200
    return bot.slack.wait_for_response(url, lambda post: "needs the" in (post.body or {}).get("text", "")).body["text"]


def _started(bot, *, pool: str, by: str, groups: tuple[str, ...] = ()) -> str:
    """An upgrade of `pool` asked for by `by`, approved as the pool needs, its run started."""
    runtime = bot.runtime
    services = runtime.services()
    asker = runtime.config.actor(by, groups=groups)
    if groups:
        view = services.requests.submit(
            asker, kind="upgrade", pool=pool, targets=[f"{pool}-000", f"{pool}-003"],
            plan=a_plan(pool, created_for=by), window_start=None, window_end=None,
            reason="580.105.08 fixes Xid 79 on H100", channel=CHANNEL, now=_now())
    else:
        view = submit_upgrade(runtime, by=by, pool=pool)
    for approver in ("U0BOB", "U0CAROL")[:view.approvals_required]:
        services.requests.approve(runtime.config.actor(approver), view.id, plan_hash=view.plan_hash, now=_now())
    return services.runs.start(view.id, dry_run=False, now=_now(), actor=asker).id


def _actions(bot, run_id: str) -> list[str]:
    services = bot.runtime.services()
    return [entry.action for entry in services.runs.request_audit(services.runs.get(run_id).request_id)]


def test_an_operator_of_one_pool_is_refused_on_another_pools_run_and_nothing_changes(bot):
    run_id = _started(bot, pool="serving-a", by="U0ALICE")
    before = _actions(bot, run_id)

    told = _command(bot, f"pause {run_id}", user="U0FRANK")

    assert ("A run being paused needs the operator role for pool serving-a; frank has approver, viewer. "
            "Who may act on pool serving-a: the fleet's operators and admins.") in told, told
    assert bot.runtime.services().runs.get(run_id).state == "pending"
    assert _actions(bot, run_id) == before


def test_an_operator_of_a_pool_controls_its_runs(bot):
    run_id = _started(bot, pool="training-a", by="U0FRANK", groups=TRAINING_OPERATORS)

    told = _command(bot, f"pause {run_id}", user="U0FRANK")

    assert bot.runtime.services().runs.get(run_id).state == "paused", told
    assert "run.paused" in _actions(bot, run_id)


def test_the_fleets_operator_is_refused_on_a_pool_whose_operators_are_its_own_by_command_and_by_button(bot):
    run_id = _started(bot, pool="training-a", by="U0FRANK", groups=TRAINING_OPERATORS)
    before = _actions(bot, run_id)
    who = "Who may act on pool training-a: S0TRAIN (user group) and admins."

    typed = _command(bot, f"abort {run_id}", user="U0ALICE")
    pressed = _click(bot, "abort", encode_value(run_id), user="U0ALICE")

    assert "needs the operator role for pool training-a; alice has viewer" in typed and who in typed, typed
    assert "needs the operator role for pool training-a; alice has viewer" in pressed and who in pressed, pressed
    assert bot.runtime.services().runs.get(run_id).state == "pending"
    assert _actions(bot, run_id) == before
    # alice still operates the pools that keep the fleet's operators.
    other = _started(bot, pool="serving-a", by="U0ALICE")
    _command(bot, f"pause {other}", user="U0ALICE")
    assert bot.runtime.services().runs.get(other).state == "paused"
