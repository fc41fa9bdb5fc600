"""The Slack app manifest asks for what the code uses, no more and no less: the slash
command the app listens to, the events it subscribes to, and the bot scopes of the Web
API methods called anywhere in bot/."""

from __future__ import annotations

import ast

import yaml
from slack_bolt.request import BoltRequest
from slack_sdk import WebClient

from bot import slack_api
from bot.slack_app import build_app
from testenv.fakeslack import signing
from tests.e2e.harness import ROOT

MANIFEST = yaml.safe_load((ROOT / "deploy" / "slack-app-manifest.yaml").read_text())
# slack_sdk helpers that call several Web API methods.
COMPOSITE = {"files_upload_v2": ("files.getUploadURLExternal", "files.completeUploadExternal")}
# Called by bolt and slack_sdk, not by our code: the token check and the Socket Mode connection.
CALLED_BY_BOLT = {"auth.test", "apps.connections.open"}


def web_api_methods_called_in_bot() -> set[str]:
    # NB: `api_call` is the door every method goes through (bot/slack_api.py counts calls there), not a method.
    client_methods = {name for name in dir(WebClient) if "_" in name and not name.startswith("_")} - {"api_call"}
    called: set[str] = set()
    for path in (ROOT / "bot").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in client_methods:
                name = node.func.attr
                called.update(COMPOSITE.get(name, (name.replace("_", "."),)))
    return called


def test_every_web_api_method_the_bot_calls_has_its_scope_declared_and_nothing_more():
    called = web_api_methods_called_in_bot()

    assert called - set(slack_api.WEB_API_SCOPES) == set(), "declare these in bot/slack_api.py WEB_API_SCOPES"
    assert set(slack_api.WEB_API_SCOPES) - called - CALLED_BY_BOLT == set(), "declared but never called"


def test_the_manifest_asks_for_exactly_the_scopes_the_code_declares():
    assert set(MANIFEST["oauth_config"]["scopes"]["bot"]) == slack_api.bot_scopes()


def test_the_manifest_slash_command_and_events_are_the_ones_the_app_answers(fake_slack, runtime):
    app, bot = build_app(runtime, client=slack_api.web_client(fake_slack.bot_token, base_url=fake_slack.base_url))
    (command,) = MANIFEST["features"]["slash_commands"]
    (event,) = MANIFEST["settings"]["event_subscriptions"]["bot_events"]

    def status(body: dict) -> int:
        return app.dispatch(BoltRequest(mode="socket_mode", body=body)).status

    assert status(signing.slash_command_payload(command=command["command"], text="help")) == 200
    assert status(signing.slash_command_payload(command="/gpu-other", text="help")) == 404
    home = signing.app_home_opened_event("U0DAVE")
    assert event == home["event"]["type"] and status(home) == 200
    bot.deliveries.wait_for(lambda ds: len(ds) == 2)  # both answered before the fake Slack stops
    assert command["should_escape"] is False and len(MANIFEST["display_information"]["name"]) <= 35
    assert MANIFEST["settings"]["socket_mode_enabled"] is True and MANIFEST["settings"]["interactivity"]["is_enabled"]
    assert MANIFEST["features"]["app_home"]["home_tab_enabled"] is True
