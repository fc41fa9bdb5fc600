"""The Web API methods the fake answers: one function per method, taking the request's
arguments (JSON-looking fields such as `blocks` and `view` already decoded) and
returning Slack's answer, or raising `SlackError` for an `{"ok": false}` answer.

Authentication, recording, injected failures and HTTP live in `webapi`; here is only
what each method checks and changes, with the errors Slack gives for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testenv.fakeslack import blockkit
from testenv.fakeslack.workspace import Channel, Ephemeral, Message, Workspace

Args = dict[str, Any]
Answer = dict[str, Any]

# Required arguments per method, from Slack's published spec
# (/work/shared/reference/slack/required_args_by_method.json), plus what Slack enforces
# although the spec does not mark it: users.info `user`, chat.delete `channel`/`ts`,
# views.update `view`, and the methods the 2020 spec predates (files.*External).
REQUIRED: dict[str, tuple[str, ...]] = {
    "auth.test": (),
    "chat.postMessage": ("channel",),
    "chat.update": ("channel", "ts"),
    "chat.postEphemeral": ("channel", "user"),
    "chat.delete": ("channel", "ts"),
    "chat.getPermalink": ("channel", "message_ts"),
    "views.publish": ("user_id", "view"),
    "views.open": ("trigger_id", "view"),
    "views.update": ("view",),
    "usergroups.users.list": ("usergroup",),
    "users.info": ("user",),
    "conversations.open": (),
    "apps.connections.open": (),
    "files.getUploadURLExternal": ("filename", "length"),
    "files.completeUploadExternal": ("files",),
}

# Only this method takes the app-level token (xapp-); every other one the bot token.
APP_TOKEN_METHODS = frozenset({"apps.connections.open"})


class SlackError(Exception):
    """An `{"ok": false, "error": ...}` answer."""

    def __init__(self, error: str, *, messages: list[str] | None = None, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.messages = messages or []
        self.extra = extra

    def answer(self) -> Answer:
        answer: Answer = {"ok": False, "error": self.error, **self.extra}
        if self.messages:
            answer["response_metadata"] = {"messages": [f"[ERROR] {m}" for m in self.messages]}
        return answer


def invalid_blocks(errors: list[str]) -> SlackError:
    return SlackError("invalid_blocks", messages=errors, errors=errors)


@dataclass
class MethodContext:
    workspace: Workspace
    upload_url: Callable[[str], str]
    socket_mode_url: Callable[[], str] | None


def check_required(method: str, args: Args) -> None:
    missing = [name for name in REQUIRED.get(method, ()) if args.get(name) in (None, "")]
    if not missing:
        return
    if missing[0] == "channel" and method.startswith("chat."):
        raise SlackError("channel_not_found")
    raise SlackError(
        "invalid_arguments",
        messages=[f"missing required field: {name}" for name in missing],
    )


# ---------------------------------------------------------------------- shared checks
def _postable_channel(ctx: MethodContext, channel_id: str) -> Channel:
    channel = ctx.workspace.resolve_channel(channel_id)
    if channel is None:
        raise SlackError("channel_not_found")
    if not channel.bot_is_member:
        raise SlackError("not_in_channel")
    return channel


def _known_channel(ctx: MethodContext, channel_id: str) -> Channel:
    channel = ctx.workspace.resolve_channel(channel_id)
    if channel is None:
        raise SlackError("channel_not_found")
    return channel


def check_message_content(args: Args, *, require_content: bool = True) -> None:
    """no_text, msg_too_long, invalid_blocks: what Slack checks in a message body."""
    text, blocks, attachments = args.get("text"), args.get("blocks"), args.get("attachments")
    if isinstance(blocks, str):
        raise SlackError("invalid_blocks_format", messages=["blocks: not valid JSON"])
    if isinstance(attachments, str):
        raise SlackError("invalid_attachments", messages=["attachments: not valid JSON"])
    if require_content and not text and not blocks and not attachments:
        raise SlackError("no_text")
    if isinstance(text, str) and len(text) > blockkit.MESSAGE_TEXT:
        raise SlackError(
            "msg_too_long",
            messages=[f"text: must be less than {blockkit.MESSAGE_TEXT + 1} characters (got {len(text)})"],
        )
    errors = blockkit.message_errors(blocks=blocks, attachments=attachments)
    if errors:
        raise invalid_blocks(errors)


def _check_view(view: Any, *, expected_type: str) -> dict[str, Any]:
    if isinstance(view, str):
        raise SlackError("invalid_arguments", messages=["view: not valid JSON"])
    errors = blockkit.view_errors(view, expected_type=expected_type)
    if errors:
        raise invalid_blocks(errors)
    return view


def _message_answer(ctx: MethodContext, message: Message) -> Answer:
    team = ctx.workspace.team
    answer: Answer = {
        "type": "message",
        "user": team.bot_user_id,
        "bot_id": team.bot_id,
        "app_id": team.app_id,
        "team": team.id,
        "ts": message.ts,
        "text": message.text or "",
    }
    if message.blocks is not None:
        answer["blocks"] = message.blocks
    if message.attachments is not None:
        answer["attachments"] = message.attachments
    if message.thread_ts is not None:
        answer["thread_ts"] = message.thread_ts
    return answer


# ---------------------------------------------------------------------- methods
def auth_test(ctx: MethodContext, args: Args) -> Answer:
    team = ctx.workspace.team
    return {
        "ok": True,
        "url": team.url,
        "team": team.name,
        "user": team.bot_name,
        "team_id": team.id,
        "user_id": team.bot_user_id,
        "bot_id": team.bot_id,
        "is_enterprise_install": False,
    }


def chat_post_message(ctx: MethodContext, args: Args) -> Answer:
    channel = _postable_channel(ctx, args["channel"])
    check_message_content(args)
    message = ctx.workspace.post_message(
        Message(
            channel=channel.id,
            ts="",
            text=args.get("text"),
            blocks=args.get("blocks"),
            attachments=args.get("attachments"),
            thread_ts=args.get("thread_ts"),
            user=ctx.workspace.team.bot_user_id,
        )
    )
    return {"ok": True, "channel": channel.id, "ts": message.ts, "message": _message_answer(ctx, message)}


def chat_update(ctx: MethodContext, args: Args) -> Answer:
    channel = _known_channel(ctx, args["channel"])
    if ctx.workspace.message(channel.id, args["ts"]) is None:
        raise SlackError("message_not_found")
    check_message_content(args)
    changes = {name: args[name] for name in ("text", "blocks", "attachments") if name in args}
    message = ctx.workspace.update_message(channel.id, args["ts"], **changes)
    if message is None:  # deleted meanwhile
        raise SlackError("message_not_found")
    return {
        "ok": True,
        "channel": channel.id,
        "ts": message.ts,
        "text": message.text or "",
        "message": _message_answer(ctx, message),
    }


def chat_post_ephemeral(ctx: MethodContext, args: Args) -> Answer:
    channel = _postable_channel(ctx, args["channel"])
    check_message_content(args)
    ephemeral = ctx.workspace.post_ephemeral(
        Ephemeral(
            channel=channel.id,
            user=args["user"],
            ts=ctx.workspace.new_ts(),
            text=args.get("text"),
            blocks=args.get("blocks"),
            thread_ts=args.get("thread_ts"),
        )
    )
    return {"ok": True, "message_ts": ephemeral.ts}


def chat_delete(ctx: MethodContext, args: Args) -> Answer:
    channel = _known_channel(ctx, args["channel"])
    if ctx.workspace.delete_message(channel.id, args["ts"]) is None:
        raise SlackError("message_not_found")
    return {"ok": True, "channel": channel.id, "ts": args["ts"]}


def chat_get_permalink(ctx: MethodContext, args: Args) -> Answer:
    channel = _known_channel(ctx, args["channel"])
    if ctx.workspace.message(channel.id, args["message_ts"]) is None:
        raise SlackError("message_not_found")
    permalink = ctx.workspace.permalink(channel.id, args["message_ts"])
    return {"ok": True, "channel": channel.id, "permalink": permalink}


def views_publish(ctx: MethodContext, args: Args) -> Answer:
    view = _check_view(args["view"], expected_type="home")
    return {"ok": True, "view": ctx.workspace.store_view(view, user_id=args["user_id"])}


def views_open(ctx: MethodContext, args: Args) -> Answer:
    view = _check_view(args["view"], expected_type="modal")
    trigger_error = ctx.workspace.use_trigger(args["trigger_id"])
    if trigger_error:
        raise SlackError(trigger_error)
    return {"ok": True, "view": ctx.workspace.store_view(view)}


def views_update(ctx: MethodContext, args: Args) -> Answer:
    if not args.get("view_id") and not args.get("external_id"):
        raise SlackError("invalid_arguments", messages=["view_id or external_id is required"])
    current = ctx.workspace.find_view(view_id=args.get("view_id"), external_id=args.get("external_id"))
    if current is None:
        raise SlackError("not_found")
    if args.get("hash") and args["hash"] != current["hash"]:
        raise SlackError("hash_conflict")
    view = _check_view(args["view"], expected_type=current["type"])
    return {"ok": True, "view": ctx.workspace.store_view({**view, "id": current["id"]})}


def usergroups_users_list(ctx: MethodContext, args: Args) -> Answer:
    members = ctx.workspace.usergroup(args["usergroup"])
    if members is None:
        raise SlackError("no_such_subteam")
    return {"ok": True, "users": members}


def users_info(ctx: MethodContext, args: Args) -> Answer:
    user = ctx.workspace.user(args["user"])
    if user is None:
        raise SlackError("user_not_found")
    return {"ok": True, "user": user}


def conversations_open(ctx: MethodContext, args: Args) -> Answer:
    if args.get("channel"):
        channel = ctx.workspace.channel(args["channel"])
        if channel is None or channel.dm_user is None:
            raise SlackError("channel_not_found")
        return {"ok": True, "no_op": True, "already_open": True, "channel": {"id": channel.id}}
    users = [u.strip() for u in str(args.get("users") or "").split(",") if u.strip()]
    if not users:
        raise SlackError("users_list_not_supplied")
    for user_id in users:
        if ctx.workspace.user(user_id) is None:
            raise SlackError("user_not_found")
    channel = ctx.workspace.open_dm(users)
    return {"ok": True, "channel": {"id": channel.id}}


def apps_connections_open(ctx: MethodContext, args: Args) -> Answer:
    if ctx.socket_mode_url is None:
        # Not a Slack error: the test did not attach a FakeSocketModeServer.
        raise SlackError("fake_socket_mode_not_attached")
    return {"ok": True, "url": ctx.socket_mode_url()}


def files_get_upload_url_external(ctx: MethodContext, args: Args) -> Answer:
    try:
        length = int(args["length"])
    except (TypeError, ValueError):
        raise SlackError("invalid_arguments", messages=["length: must be an integer"]) from None
    upload = ctx.workspace.new_upload(filename=str(args["filename"]), length=length)
    return {"ok": True, "upload_url": ctx.upload_url(upload.id), "file_id": upload.id}


def files_complete_upload_external(ctx: MethodContext, args: Args) -> Answer:
    files = args["files"]
    if isinstance(files, str):
        try:
            files = json.loads(files)
        except json.JSONDecodeError:
            raise SlackError("invalid_arguments", messages=["files: not valid JSON"]) from None
    if not isinstance(files, list) or not files:
        raise SlackError("invalid_arguments", messages=["files: must be a non-empty array"])
    channel_id = args.get("channel_id") or (str(args.get("channels") or "").split(",")[0] or None)
    channel = _postable_channel(ctx, channel_id) if channel_id else None
    for item in files:
        upload = ctx.workspace.file(item.get("id", "")) if isinstance(item, dict) else None
        if upload is None or upload.content is None:
            # Unknown id, or the client never posted the bytes to the upload URL.
            raise SlackError("file_not_found")
    team = ctx.workspace.team
    answers = []
    for item in files:
        upload = ctx.workspace.complete_upload(
            item["id"],
            title=item.get("title") or ctx.workspace.file(item["id"]).filename,  # type: ignore[union-attr]
            channel=channel.id if channel else None,
            initial_comment=args.get("initial_comment"),
            thread_ts=args.get("thread_ts"),
        )
        answers.append(
            {
                "id": upload.id,
                "name": upload.filename,
                "title": upload.title,
                "size": len(upload.content or b""),
                "channels": [upload.channel] if upload.channel else [],
                "permalink": f"{team.url}files/{team.bot_user_id}/{upload.id}/{upload.filename}",
            }
        )
    return {"ok": True, "files": answers}


METHODS: dict[str, Callable[[MethodContext, Args], Answer]] = {
    "auth.test": auth_test,
    "chat.postMessage": chat_post_message,
    "chat.update": chat_update,
    "chat.postEphemeral": chat_post_ephemeral,
    "chat.delete": chat_delete,
    "chat.getPermalink": chat_get_permalink,
    "views.publish": views_publish,
    "views.open": views_open,
    "views.update": views_update,
    "usergroups.users.list": usergroups_users_list,
    "users.info": users_info,
    "conversations.open": conversations_open,
    "apps.connections.open": apps_connections_open,
    "files.getUploadURLExternal": files_get_upload_url_external,
    "files.completeUploadExternal": files_complete_upload_external,
}
assert set(METHODS) == set(REQUIRED), "every method the fake answers lists its required arguments"


def call(method: str, args: Args, ctx: MethodContext) -> Answer:
    """Answer one call (the token has already been checked)."""
    check_required(method, args)
    return METHODS[method](ctx, args)
