"""Every call gpuops makes to Slack's Web API and to response_urls, in one module, with
the bot scope each needs declared beside it (`WEB_API_SCOPES`). The app manifest
(deploy/slack-app-manifest.yaml) asks for exactly these scopes; a test keeps the two,
and the calls made in bot/, in step.

Rate limits (HTTP 429 with Retry-After) are retried by slack_sdk's
RateLimitErrorRetryHandler, connection resets by its ConnectionErrorRetryHandler. Errors
Slack answers (channel_not_found, not_in_channel, an expired response_url, ...) never
raise out of here: each method returns whether it worked and logs why not, so the
caller can fall back to another way of reaching the user.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler
from slack_sdk.webhook import WebhookClient

from bot import messages as msg

log = logging.getLogger("gpuops.bot.slack")

SLASH_COMMAND = "/gpu"
BOT_EVENTS = ("app_home_opened",)

# Web API method -> the bot token scope it needs (None: no scope).
WEB_API_SCOPES: dict[str, str | None] = {
    "auth.test": None,  # bolt checks the token at start
    "apps.connections.open": None,  # Socket Mode, with the app-level token (connections:write)
    "chat.postMessage": "chat:write",
    "chat.update": "chat:write",
    "chat.postEphemeral": "chat:write",
    "conversations.open": "im:write",
    "usergroups.users.list": "usergroups:read",
    "users.info": "users:read",
    "views.publish": None,
    "views.open": None,
    "files.getUploadURLExternal": "files:write",
    "files.completeUploadExternal": "files:write",
}
# Scopes that come with a feature rather than a method.
FEATURE_SCOPES = {"commands": "the /gpu slash command"}


def bot_scopes() -> set[str]:
    return {s for s in WEB_API_SCOPES.values() if s} | set(FEATURE_SCOPES)


def retry_handlers() -> list[Any]:
    return [RateLimitErrorRetryHandler(max_retry_count=2), ConnectionErrorRetryHandler(max_retry_count=2)]


# Told of every Web API call (method, "ok" or Slack's error): the process's metrics.
_call_observer: Callable[[str, str], None] | None = None


def observe_slack_calls(observer: Callable[[str, str], None] | None) -> None:
    """Tell `observer` of every Web API call made through `web_client` (None: nobody)."""
    global _call_observer
    _call_observer = observer


class _ObservedClient(WebClient):
    """slack_sdk's client, each call told to the observer (after its retries)."""

    def api_call(self, api_method: str, **kwargs: Any) -> Any:
        outcome = "error"
        try:
            answer = super().api_call(api_method, **kwargs)
            outcome = "ok"
            return answer
        except SlackApiError as err:
            outcome = str(err.response.get("error") or err.response.status_code)
            raise
        finally:
            observer = _call_observer
            if observer is not None:
                observer(api_method, outcome)


def web_client(token: str, *, base_url: str | None = None) -> WebClient:
    kwargs: dict[str, Any] = {"token": token, "retry_handlers": retry_handlers()}
    if base_url is not None:
        kwargs["base_url"] = base_url
    return _ObservedClient(**kwargs)


def _error(err: Exception) -> str:
    if isinstance(err, SlackApiError):
        return str(err.response.get("error") or err.response.status_code)
    return type(err).__name__ + (f": {err}" if str(err) else "")


class SlackApi:
    """The Web API calls gpuops makes, each answering None/False when Slack refuses."""

    def __init__(self, client: WebClient) -> None:
        self.client = client

    # -------------------------------------------------------------- messages
    def respond(self, response_url: str, message: dict[str, Any]) -> bool:
        """POST to an interaction's response_url (valid 30 minutes, 5 times)."""
        try:
            answer = WebhookClient(response_url, retry_handlers=retry_handlers()).send_dict(message)
        except (SlackClientError, OSError) as err:
            log.warning(msg.reply_fallback_log("the response_url", _error(err)))
            return False
        if answer.status_code != 200:
            log.warning(msg.reply_fallback_log("the response_url", f"HTTP {answer.status_code} {answer.body[:100]}"))
            return False
        return True

    def post(self, channel: str, message: dict[str, Any], *, thread_ts: str | None = None) -> str | None:
        """The new message's ts, or None (channel_not_found, not_in_channel, ...)."""
        try:
            answer = self.client.chat_postMessage(channel=channel, thread_ts=thread_ts, **message)
        except (SlackApiError, SlackClientError, OSError) as err:
            log.warning(msg.reply_fallback_log(f"chat.postMessage to {channel}", _error(err)))
            return None
        return str(answer["ts"])

    def update(self, channel: str, ts: str, message: dict[str, Any]) -> bool:
        try:
            self.client.chat_update(channel=channel, ts=ts, **message)
        except (SlackApiError, SlackClientError, OSError) as err:
            log.warning(msg.reply_fallback_log(f"chat.update of {channel}/{ts}", _error(err)))
            return False
        return True

    def ephemeral(self, channel: str, user: str, message: dict[str, Any]) -> bool:
        try:
            self.client.chat_postEphemeral(channel=channel, user=user, **message)
        except (SlackApiError, SlackClientError, OSError) as err:
            log.warning(msg.reply_fallback_log(f"chat.postEphemeral in {channel}", _error(err)))
            return False
        return True

    def open_dm(self, user: str) -> str | None:
        try:
            answer = self.client.conversations_open(users=user)
        except (SlackApiError, SlackClientError, OSError) as err:
            log.warning(msg.reply_fallback_log(f"conversations.open with {user}", _error(err)))
            return None
        return str(answer["channel"]["id"])

    def direct_message(self, user: str, message: dict[str, Any]) -> bool:
        channel = self.open_dm(user)
        return channel is not None and self.post(channel, message) is not None

    def upload_text(self, channel: str, *, filename: str, title: str, content: str) -> str | None:
        """Upload `content` as a file shared in `channel`; its permalink, or None."""
        return self._upload(channel, filename=filename, title=title, content=content) or None

    def upload_file(self, channel: str, *, filename: str, title: str, content: bytes) -> str | None:
        """Upload `content` (a picture) as a file shared in `channel`; its permalink ("" when
        Slack gave none), or None when the upload failed."""
        return self._upload(channel, filename=filename, title=title, content=content)

    def _upload(self, channel: str, *, filename: str, title: str, content: str | bytes) -> str | None:
        try:
            answer = self.client.files_upload_v2(channel=channel, filename=filename, title=title, content=content)
        except (SlackApiError, SlackClientError, OSError) as err:
            log.warning(msg.reply_fallback_log(f"a file upload to {channel}", _error(err)))
            return None
        file = answer.get("file") or {}
        return file.get("permalink") or ""

    # -------------------------------------------------------------- views
    def publish_home(self, user: str, view: dict[str, Any]) -> bool:
        try:
            self.client.views_publish(user_id=user, view=view)
        except (SlackApiError, SlackClientError, OSError) as err:
            log.warning(msg.reply_fallback_log(f"views.publish for {user}", _error(err)))
            return False
        return True

    def open_modal(self, trigger_id: str, view: dict[str, Any]) -> str | None:
        """None if it opened, else Slack's error (e.g. expired_trigger_id)."""
        try:
            self.client.views_open(trigger_id=trigger_id, view=view)
        except (SlackApiError, SlackClientError, OSError) as err:
            log.warning(msg.reply_fallback_log("views.open", _error(err)))
            return _error(err)
        return None

    # -------------------------------------------------------------- people
    def usergroup_members(self, group: str) -> frozenset[str]:
        """Raises SlackApiError (or a client error) when Slack does not answer."""
        answer = self.client.usergroups_users_list(usergroup=group)
        return frozenset(answer.get("users") or ())

    def display_name(self, user: str) -> str | None:
        try:
            answer = self.client.users_info(user=user)
        except (SlackApiError, SlackClientError, OSError) as err:
            log.info("users.info for %s failed (%s); using the id", user, _error(err))
            return None
        info = answer.get("user") or {}
        profile = info.get("profile") or {}
        return profile.get("display_name") or info.get("real_name") or info.get("name") or None
