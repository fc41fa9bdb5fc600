"""What `gpuops run` reads before it answers anything (credentials from the environment
or files, secrets kept out of logs) and how a Slack user becomes an Actor (roles by user
id and by user group, group members cached for five minutes, failed lookups fail closed)."""

from __future__ import annotations

import json
import logging
import urllib.parse

import pytest

from bot.credentials import CredentialsError, load_credentials
from bot.identity import FRESH_AGE, SlackDirectory
from bot.logs import RedactSecrets
from bot.slack_api import SlackApi, web_client
from tests.e2e.harness import demo_config
from workflows.access import Role


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def directory(slack):
    clock = Clock()
    config = demo_config(pools={"serving-a": {"kind": "serving", "approvers": ["group:S0ONCALL"]}})
    slack.workspace.set_usergroup("S0ONCALL", ["U0DAVE"])
    api = SlackApi(web_client(slack.bot_token, base_url=slack.base_url))
    return SlackDirectory(api, config, clock=clock), clock


def test_socket_mode_needs_both_tokens_and_http_mode_the_signing_secret(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("0123456789abcdef0123\n")

    socket = load_credentials("socket", {"SLACK_BOT_TOKEN": "xoxb-1-abc", "SLACK_APP_TOKEN": "xapp-1-def"})
    http = load_credentials("http", {"SLACK_BOT_TOKEN": "xoxb-1-abc", "SLACK_SIGNING_SECRET_FILE": str(secret_file)})

    assert (socket.app_token, http.signing_secret) == ("xapp-1-def", "0123456789abcdef0123")
    assert "xoxb" not in repr(socket) and "0123" not in repr(http)


@pytest.mark.parametrize("env, says", [
    ({"SLACK_BOT_TOKEN": "xoxb-1"}, "SLACK_APP_TOKEN is not set"),
    ({"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xoxb-2"}, "starting with 'xapp-', but it starts with 'xoxb-'"),
    ({"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_BOT_TOKEN_FILE": "/x", "SLACK_APP_TOKEN": "xapp-1"}, "set only one"),
    ({"SLACK_BOT_TOKEN_FILE": "/nonexistent/token", "SLACK_APP_TOKEN": "xapp-1"}, "cannot be read"),
])
def test_a_missing_or_wrong_credential_is_named_with_what_to_do(env, says):
    with pytest.raises(CredentialsError, match=says):
        load_credentials("socket", env)


def test_secrets_and_anything_token_shaped_are_redacted_from_log_lines(caplog):
    logger = logging.getLogger("gpuops.test.redaction")
    caplog.set_level(logging.INFO, logger="gpuops.test.redaction")
    caplog.handler.addFilter(RedactSecrets(["signing-secret-value-123"]))

    logger.warning("posting with %s and %s, secret %s", "xoxb-1234-5678-abcdef", "xapp-1-A0-99-zz",
                   "signing-secret-value-123")
    logger.info("Invalid request signature detected (body: token=legacy-verification&team_id=T0)")

    assert caplog.messages == ["posting with [redacted] and [redacted], secret [redacted]",
                               "Invalid request signature detected (body: token=[redacted]&team_id=T0)"]


def test_url_encoded_secrets_tokens_and_response_urls_are_redacted_too(caplog):
    logger = logging.getLogger("gpuops.test.redaction")
    caplog.set_level(logging.INFO, logger="gpuops.test.redaction")
    caplog.handler.addFilter(RedactSecrets(["s3cr3t/with+odd=chars"]))
    hook = "https://hooks.slack.com/commands/T0GPUOPS/1234/AbCdEf"

    logger.info("body: %s", "payload=%7B%22token%22%3A%22legacy-verification%22%2C%22response_url%22%3A%22"
                + urllib.parse.quote(hook, safe="") + "%22%7D")
    logger.info("body: command=%2Fgpu&response_url=" + urllib.parse.quote(hook, safe="") + "&text=status")
    logger.info("json: %s", json.dumps({"response_url": hook, "Token": "legacy-verification"}))
    logger.info("posting to %s failed", hook)
    logger.info("env: SECRET=%s", urllib.parse.quote("s3cr3t/with+odd=chars", safe=""))

    logged = "\n".join(caplog.messages)
    assert "legacy-verification" not in logged and "AbCdEf" not in logged and "1234" not in logged
    assert "s3cr3t" not in logged
    assert caplog.messages[1] == "body: command=%2Fgpu&response_url=[redacted]&text=status"
    assert caplog.messages[2] == 'json: {"response_url": "[redacted]", "Token": "[redacted]"}'
    assert caplog.messages[3] == "posting to https://hooks.slack.com/[redacted] failed"


@pytest.mark.parametrize("quote", [lambda text: urllib.parse.quote(text, safe=""), urllib.parse.quote_plus],
                         ids=["%20", "+"])
def test_a_token_in_url_encoded_json_with_a_space_after_the_colon_is_redacted(caplog, quote):
    logger = logging.getLogger("gpuops.test.redaction")
    caplog.set_level(logging.INFO, logger="gpuops.test.redaction")
    caplog.handler.addFilter(RedactSecrets())
    payload = json.dumps({"type": "block_actions", "token": "legacy-verification",
                          "response_url": "https://example.com/actions/T0/1/AbCdEf"})  # ": " after each key

    logger.info("body: payload=%s", quote(payload))

    assert "legacy-verification" not in caplog.messages[0] and "AbCdEf" not in caplog.messages[0]
    assert "block_actions" in caplog.messages[0]


def test_roles_come_from_the_user_id_and_from_slack_user_groups(directory):
    directory, _ = directory

    frank = directory.actor("U0FRANK")
    dave = directory.actor("U0DAVE")

    assert frank.has(Role.APPROVER) and not frank.has(Role.OPERATOR)  # S0SRE: approver
    assert dave.has(Role.VIEWER) and not dave.has(Role.APPROVER)
    assert dave.has(Role.APPROVER, pool="serving-a")  # group:S0ONCALL approves serving-a


def test_group_members_are_cached_for_five_minutes_then_read_again(directory, slack):
    directory, clock = directory
    assert not directory.actor("U0ALICE").has(Role.APPROVER)
    slack.workspace.set_usergroup("S0SRE", ["U0FRANK", "U0ALICE"])

    clock.now += 299
    assert not directory.actor("U0ALICE").has(Role.APPROVER)
    clock.now += 2
    assert directory.actor("U0ALICE").has(Role.APPROVER)
    assert len(slack.calls("usergroups.users.list")) == 4  # two groups, read twice


def test_a_failed_group_lookup_grants_nothing_and_is_tried_again_later(directory, slack):
    directory, clock = directory
    slack.fail_next("usergroups.users.list", "ratelimited", status=200, times=2)  # both groups

    assert not directory.actor("U0FRANK").has(Role.APPROVER)
    clock.now += 31
    assert directory.actor("U0FRANK").has(Role.APPROVER)


def test_names_come_from_the_configuration_else_slack(directory, slack):
    directory, _ = directory
    slack.workspace.add_user("U0GRACE", name="grace", display_name="Grace H.")

    assert directory.actor("U0BOB").name == "bob"
    assert directory.actor("U0GRACE").name == "Grace H."
    assert directory.actor("U0NOBODY", fallback_name="nobody").name == "nobody"


def test_a_fresh_read_takes_members_read_a_few_seconds_ago_and_reads_again_after(directory, slack):
    directory, clock = directory
    assert directory.actor("U0FRANK", fresh=True).has(Role.APPROVER)
    slack.workspace.set_usergroup("S0SRE", [])

    clock.now += FRESH_AGE  # a burst of clicks: one read per group
    assert directory.actor("U0FRANK", fresh=True).has(Role.APPROVER)
    assert len(slack.calls("usergroups.users.list")) == 2
    clock.now += 1
    assert not directory.actor("U0FRANK", fresh=True).has(Role.APPROVER)
    assert len(slack.calls("usergroups.users.list")) == 4


def test_group_reads_are_paced_to_slacks_tier_2_and_a_fresh_read_waits_for_room(slack):
    clock = Clock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    api = SlackApi(web_client(slack.bot_token, base_url=slack.base_url))
    # One group (S0SRE), two reads a minute.
    directory = SlackDirectory(api, demo_config(), reads_per_minute=2, fresh_wait=60, clock=clock, sleep=sleep)
    directory.actor("U0FRANK", fresh=True)
    clock.now += 10
    directory.actor("U0FRANK", fresh=True)
    slack.workspace.set_usergroup("S0SRE", [])
    clock.now += 10

    assert not directory.actor("U0FRANK", fresh=True).has(Role.APPROVER)  # waited for the first read's minute
    assert slept == [40.0]
    assert len(slack.calls("usergroups.users.list")) == 3


def test_a_fresh_read_with_no_room_in_the_minute_grants_nothing_and_leaves_the_cache_to_what_only_reads(slack):
    clock = Clock()
    api = SlackApi(web_client(slack.bot_token, base_url=slack.base_url))
    directory = SlackDirectory(api, demo_config(), reads_per_minute=1, fresh_wait=5, clock=clock,
                               sleep=lambda seconds: None)
    assert directory.actor("U0FRANK").has(Role.APPROVER)
    clock.now += FRESH_AGE + 1

    refused = directory.actor("U0FRANK", fresh=True)
    assert not refused.has(Role.APPROVER) and refused.unread_groups == ("S0SRE",)
    assert directory.actor("U0FRANK").has(Role.APPROVER)
    assert len(slack.calls("usergroups.users.list")) == 1
