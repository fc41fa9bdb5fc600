"""What Slack sends to an app: payloads, HTTP-mode bodies, and their signatures.

The `*_payload` builders return the dicts Slack sends (the `payload` of a Socket Mode
envelope); the `*_body` builders return the raw bytes of the HTTP-mode request for the
same thing, to be signed with `sign()`:

    body = slash_command_body(text="drain gpu-1", response_url=fake.response_url())
    headers = {**sign(body, secret=SECRET, timestamp=now), "Content-Type": FORM}
    app.dispatch(BoltRequest(body=body.decode(), headers=headers))

Defaults describe the fake workspace (`workspace.Team`) and a user U0ALICE in C0OPS;
tests override only what their story is about.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

from testenv.fakeslack.workspace import DEFAULT_CHANNEL, DEFAULT_USER, Team

FORM = "application/x-www-form-urlencoded"
JSON = "application/json"

_TEAM = Team()
_ids = itertools.count(1)


def sign(body: bytes, *, secret: str, timestamp: int) -> dict[str, str]:
    """The headers Slack signs a request with: `v0=` + HMAC-SHA256 of `v0:{ts}:{body}`."""
    base = b"v0:" + str(timestamp).encode("ascii") + b":" + body
    digest = hmac.new(secret.encode("utf-8"), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Signature": f"v0={digest}", "X-Slack-Request-Timestamp": str(timestamp)}


def _next_id(prefix: str) -> str:
    return f"{prefix}{next(_ids):08d}"


def _trigger_id() -> str:
    return f"{next(_ids)}.{_TEAM.id}.fake-trigger"


# ---------------------------------------------------------------------- slash commands
def slash_command_payload(
    *,
    command: str = "/gpu",
    text: str = "",
    user_id: str = DEFAULT_USER,
    user_name: str | None = None,
    channel_id: str = DEFAULT_CHANNEL,
    channel_name: str | None = None,
    response_url: str = "",
    trigger_id: str | None = None,
    team_id: str = _TEAM.id,
    team_domain: str = _TEAM.domain,
    api_app_id: str = _TEAM.app_id,
) -> dict[str, str]:
    return {
        "token": "deprecated-verification-token",
        "team_id": team_id,
        "team_domain": team_domain,
        "channel_id": channel_id,
        "channel_name": channel_name or channel_id.lower(),
        "user_id": user_id,
        "user_name": user_name or user_id.lower(),
        "command": command,
        "text": text,
        "api_app_id": api_app_id,
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": trigger_id or _trigger_id(),
    }


def slash_command_body(**fields: Any) -> bytes:
    """The form-encoded body of a slash command (`slash_command_payload`'s fields)."""
    return urllib.parse.urlencode(slash_command_payload(**fields)).encode("utf-8")


# ---------------------------------------------------------------------- interactivity
def block_actions_payload(
    *,
    action_id: str,
    value: str | None = None,
    block_id: str = "actions",
    action_type: str = "button",
    user_id: str = DEFAULT_USER,
    user_name: str | None = None,
    message_ts: str = "1700000000.000001",
    channel_id: str = DEFAULT_CHANNEL,
    response_url: str = "",
    trigger_id: str | None = None,
    message: Mapping[str, Any] | None = None,
    team_id: str = _TEAM.id,
    api_app_id: str = _TEAM.app_id,
) -> dict[str, Any]:
    """A click on a message's button (or a select: `action_type`, `value` as selected)."""
    action: dict[str, Any] = {
        "type": action_type,
        "action_id": action_id,
        "block_id": block_id,
        "action_ts": "1700000001.000001",
    }
    if action_type == "button":
        action["value"] = value
    elif value is not None:
        action["selected_option"] = {"text": {"type": "plain_text", "text": value}, "value": value}
    return {
        "type": "block_actions",
        "user": _user(user_id, user_name, team_id),
        "api_app_id": api_app_id,
        "token": "deprecated-verification-token",
        "container": {
            "type": "message",
            "message_ts": message_ts,
            "channel_id": channel_id,
            "is_ephemeral": False,
        },
        "trigger_id": trigger_id or _trigger_id(),
        "team": {"id": team_id, "domain": _TEAM.domain},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel_id, "name": channel_id.lower()},
        "message": dict(message) if message is not None else {"type": "message", "ts": message_ts, "text": ""},
        "response_url": response_url,
        "actions": [action],
    }


def block_actions_body(**fields: Any) -> bytes:
    """The form body of a button click: field `payload` holding the JSON."""
    return _payload_form(block_actions_payload(**fields))


def view_submission_payload(
    *,
    callback_id: str,
    values: Mapping[str, Mapping[str, Any]] | None = None,
    private_metadata: str = "",
    user_id: str = DEFAULT_USER,
    view_id: str | None = None,
    trigger_id: str | None = None,
    response_urls: list[dict[str, str]] | None = None,
    team_id: str = _TEAM.id,
    api_app_id: str = _TEAM.app_id,
) -> dict[str, Any]:
    """A modal's submission. `values[block_id][action_id]` is the element's state; a
    plain string stands for a plain_text_input's value."""
    state = {
        block_id: {
            action_id: ({"type": "plain_text_input", "value": v} if isinstance(v, str) else dict(v))
            for action_id, v in actions.items()
        }
        for block_id, actions in (values or {}).items()
    }
    return {
        "type": "view_submission",
        "team": {"id": team_id, "domain": _TEAM.domain},
        "user": _user(user_id, None, team_id),
        "api_app_id": api_app_id,
        "token": "deprecated-verification-token",
        "trigger_id": trigger_id or _trigger_id(),
        "view": {
            "id": view_id or _next_id("V"),
            "team_id": team_id,
            "type": "modal",
            "callback_id": callback_id,
            "private_metadata": private_metadata,
            "state": {"values": state},
            "hash": "1.fakehash",
            "app_id": api_app_id,
            "bot_id": _TEAM.bot_id,
            "blocks": [],
        },
        "response_urls": response_urls or [],
        "is_enterprise_install": False,
        "enterprise": None,
    }


def view_submission_body(**fields: Any) -> bytes:
    return _payload_form(view_submission_payload(**fields))


# ---------------------------------------------------------------------- Events API
def app_home_opened_event(
    user_id: str = DEFAULT_USER,
    *,
    tab: str = "home",
    event_id: str | None = None,
    event_time: int = 1_700_000_000,
    team_id: str = _TEAM.id,
    api_app_id: str = _TEAM.app_id,
) -> dict[str, Any]:
    """The Events API `event_callback` for a user opening the bot's Home tab."""
    return {
        "token": "deprecated-verification-token",
        "team_id": team_id,
        "api_app_id": api_app_id,
        "event": {
            "type": "app_home_opened",
            "user": user_id,
            "channel": "D" + user_id[1:],
            "tab": tab,
            "event_ts": f"{event_time}.000100",
        },
        "type": "event_callback",
        "event_id": event_id or _next_id("Ev"),
        "event_time": event_time,
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": team_id,
                "user_id": _TEAM.bot_user_id,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
    }


def app_home_opened_body(user_id: str = DEFAULT_USER, **fields: Any) -> bytes:
    """The JSON body of `app_home_opened_event` for HTTP mode."""
    return json.dumps(app_home_opened_event(user_id, **fields)).encode("utf-8")


def _user(user_id: str, user_name: str | None, team_id: str) -> dict[str, str]:
    name = user_name or user_id.lower()
    return {"id": user_id, "username": name, "name": name, "team_id": team_id}


def _payload_form(payload: Mapping[str, Any]) -> bytes:
    return urllib.parse.urlencode({"payload": json.dumps(payload)}).encode("utf-8")
