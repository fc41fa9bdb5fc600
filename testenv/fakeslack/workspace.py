"""The Slack side of the fake: the team, its channels, users and user groups (configured
by the test), and what the bot has put there (messages, ephemeral messages, views,
files), which a test reads to see what a user would see.

Ids and message timestamps are deterministic (counters, not clocks) so that tests and
their failure messages read the same on every run. All access goes through one lock:
the Web API server answers each request on its own thread.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_CHANNEL = "C0OPS"
DEFAULT_USER = "U0ALICE"


@dataclass(frozen=True)
class Team:
    """Who the fake says the workspace and the bot are (what auth.test answers)."""

    id: str = "T0GPUOPS"
    name: str = "gpuops-test"
    domain: str = "gpuops-test"
    app_id: str = "A0GPUOPS"
    bot_user_id: str = "U0GPUOPSBOT"
    bot_id: str = "B0GPUOPS"
    bot_name: str = "gpuops"

    @property
    def url(self) -> str:
        return f"https://{self.domain}.slack.com/"


@dataclass(frozen=True)
class Channel:
    id: str
    name: str
    bot_is_member: bool = True
    dm_user: str | None = None  # set for a direct message channel (conversations.open)


@dataclass(frozen=True)
class Message:
    """A message as it stands now (after any chat.update or replace_original)."""

    channel: str
    ts: str
    text: str | None
    blocks: list[dict[str, Any]] | None
    attachments: list[dict[str, Any]] | None = None
    thread_ts: str | None = None
    user: str | None = None
    edits: int = 0  # how many times it was updated


@dataclass(frozen=True)
class Ephemeral:
    channel: str
    user: str
    ts: str
    text: str | None
    blocks: list[dict[str, Any]] | None
    thread_ts: str | None = None


@dataclass(frozen=True)
class UploadedFile:
    id: str
    filename: str
    length: int
    content: bytes | None = None  # None until the client has posted to the upload URL
    title: str | None = None
    channel: str | None = None
    initial_comment: str | None = None
    thread_ts: str | None = None
    completed: bool = False


@dataclass
class _Store:
    channels: dict[str, Channel] = field(default_factory=dict)
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    usergroups: dict[str, list[str]] = field(default_factory=dict)
    messages: dict[str, dict[str, Message]] = field(default_factory=dict)
    ephemerals: list[Ephemeral] = field(default_factory=list)
    home_views: dict[str, dict[str, Any]] = field(default_factory=dict)
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, UploadedFile] = field(default_factory=dict)
    used_triggers: set[str] = field(default_factory=set)
    expired_triggers: set[str] = field(default_factory=set)


class Workspace:
    """One Slack workspace with the bot installed.

    `channels` are known channels the bot is a member of (a list of ids, or a mapping of
    id to name); `channels_without_bot` are known channels it is not in (posting there
    answers `not_in_channel`); `users` are user ids, or a mapping of user id to fields
    of its users.info answer (`name`, `real_name`, `tz`, `email`, `is_bot`, `deleted`,
    ...); `usergroups` maps a user group id (S...) to its members. By default the
    workspace has channel C0OPS (#gpu-ops, bot is a member) and user U0ALICE (alice).
    """

    def __init__(
        self,
        *,
        team: Team | None = None,
        channels: Iterable[str] | Mapping[str, str] | None = None,
        channels_without_bot: Iterable[str] | Mapping[str, str] = (),
        users: Iterable[str] | Mapping[str, Mapping[str, Any]] | None = None,
        usergroups: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self.team = team or Team()
        self._lock = threading.RLock()
        self._store = _Store()
        self._ids = itertools.count(1)
        self._ts = itertools.count(1)
        if channels is None:
            channels = {DEFAULT_CHANNEL: "gpu-ops"}
        if users is None:
            users = {DEFAULT_USER: {"name": "alice", "real_name": "Alice Example"}}
        for names, member in ((channels, True), (channels_without_bot, False)):
            named = names if isinstance(names, Mapping) else {c: c.lower() for c in names}
            for channel_id, name in named.items():
                self.add_channel(channel_id, name=name, bot_is_member=member)
        if isinstance(users, Mapping):
            for user_id, fields in users.items():
                self.add_user(user_id, **fields)
        else:
            for user_id in users:
                self.add_user(user_id)
        for group_id, members in (usergroups or {}).items():
            self.set_usergroup(group_id, members)

    # ------------------------------------------------------------------ configuration
    def add_channel(self, channel_id: str, *, name: str | None = None, bot_is_member: bool = True) -> Channel:
        channel = Channel(id=channel_id, name=name or channel_id.lower(), bot_is_member=bot_is_member)
        with self._lock:
            self._store.channels[channel_id] = channel
        return channel

    def add_user(self, user_id: str, **fields: Any) -> dict[str, Any]:
        """Add (or replace) a user; `fields` override the users.info defaults."""
        name = fields.pop("name", user_id.lower())
        real_name = fields.pop("real_name", name.title())
        email = fields.pop("email", f"{name}@example.com")
        display_name = fields.pop("display_name", name)
        user: dict[str, Any] = {
            "id": user_id,
            "team_id": self.team.id,
            "name": name,
            "real_name": real_name,
            "deleted": False,
            "is_bot": False,
            "is_admin": False,
            "tz": "Etc/UTC",
            "tz_offset": 0,
            "profile": {"real_name": real_name, "display_name": display_name, "email": email},
        }
        profile = fields.pop("profile", {})
        user.update(fields)
        user["profile"].update(profile)
        with self._lock:
            self._store.users[user_id] = user
        return copy.deepcopy(user)

    def set_usergroup(self, group_id: str, members: Iterable[str]) -> None:
        with self._lock:
            self._store.usergroups[group_id] = list(members)

    def expire_trigger_id(self, trigger_id: str) -> None:
        """Make views.open with this trigger answer `expired_trigger_id` (Slack: after 3 s)."""
        with self._lock:
            self._store.expired_triggers.add(trigger_id)

    # ------------------------------------------------------------------ what tests read
    def channel(self, channel_id: str) -> Channel | None:
        with self._lock:
            return self._store.channels.get(channel_id)

    def user(self, user_id: str) -> dict[str, Any] | None:
        with self._lock:
            user = self._store.users.get(user_id)
            return copy.deepcopy(user) if user is not None else None

    def usergroup(self, group_id: str) -> list[str] | None:
        with self._lock:
            members = self._store.usergroups.get(group_id)
            return list(members) if members is not None else None

    def messages(self, channel: str | None = None) -> list[Message]:
        """Messages as they stand now, oldest first (deleted ones are gone)."""
        with self._lock:
            channels = [channel] if channel is not None else list(self._store.messages)
            return [m for c in channels for m in self._store.messages.get(c, {}).values()]

    def message(self, channel: str, ts: str) -> Message | None:
        with self._lock:
            return self._store.messages.get(channel, {}).get(ts)

    def ephemerals(self, *, channel: str | None = None, user: str | None = None) -> list[Ephemeral]:
        with self._lock:
            return [
                e for e in self._store.ephemerals
                if (channel is None or e.channel == channel) and (user is None or e.user == user)
            ]

    def home_view(self, user_id: str) -> dict[str, Any] | None:
        """The Home tab last published for a user (views.publish)."""
        with self._lock:
            view = self._store.home_views.get(user_id)
            return copy.deepcopy(view) if view is not None else None

    def view(self, view_id: str) -> dict[str, Any] | None:
        """A modal opened with views.open, as last updated."""
        with self._lock:
            view = self._store.views.get(view_id)
            return copy.deepcopy(view) if view is not None else None

    def views(self) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(v) for v in self._store.views.values()]

    def files(self) -> list[UploadedFile]:
        with self._lock:
            return list(self._store.files.values())

    def file(self, file_id: str) -> UploadedFile | None:
        with self._lock:
            return self._store.files.get(file_id)

    def permalink(self, channel: str, ts: str) -> str:
        return f"{self.team.url}archives/{channel}/p{ts.replace('.', '')}"

    # ------------------------------------------------------------------ what methods change
    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):08d}"

    def new_ts(self) -> str:
        # Increasing and unique like Slack's, but not a clock: the same on every run.
        return f"1700000000.{next(self._ts):06d}"

    def resolve_channel(self, channel_or_user: str) -> Channel | None:
        """A channel id, or a user id standing for the DM with that user (as Slack allows
        in chat.postMessage)."""
        with self._lock:
            channel = self._store.channels.get(channel_or_user)
            if channel is None and channel_or_user in self._store.users:
                channel = self.open_dm([channel_or_user])
            return channel

    def open_dm(self, users: list[str]) -> Channel:
        with self._lock:
            if len(users) == 1:
                channel_id = "D" + users[0][1:]  # what app_home_opened events carry too
            else:
                channel_id = "G" + hashlib.sha1(",".join(sorted(users)).encode()).hexdigest()[:8].upper()
            channel = self._store.channels.get(channel_id)
            if channel is None:
                dm_user = users[0] if len(users) == 1 else None
                channel = Channel(id=channel_id, name=channel_id.lower(), dm_user=dm_user)
                self._store.channels[channel_id] = channel
            return channel

    def post_message(self, message: Message) -> Message:
        with self._lock:
            message = replace(message, ts=message.ts or self.new_ts())
            self._store.messages.setdefault(message.channel, {})[message.ts] = message
            return message

    def update_message(self, channel: str, ts: str, **changes: Any) -> Message | None:
        with self._lock:
            current = self._store.messages.get(channel, {}).get(ts)
            if current is None:
                return None
            updated = replace(current, edits=current.edits + 1, **changes)
            self._store.messages[channel][ts] = updated
            return updated

    def delete_message(self, channel: str, ts: str) -> Message | None:
        with self._lock:
            return self._store.messages.get(channel, {}).pop(ts, None)

    def post_ephemeral(self, ephemeral: Ephemeral) -> Ephemeral:
        with self._lock:
            self._store.ephemerals.append(ephemeral)
            return ephemeral

    def use_trigger(self, trigger_id: str) -> str | None:
        """None if the trigger can open a view, else Slack's error for it."""
        with self._lock:
            if trigger_id in self._store.expired_triggers:
                return "expired_trigger_id"
            if trigger_id in self._store.used_triggers:
                return "exchanged_trigger_id"
            self._store.used_triggers.add(trigger_id)
            return None

    def store_view(self, view: dict[str, Any], *, user_id: str | None = None) -> dict[str, Any]:
        """Store a modal (or, with `user_id`, a Home tab) and return it as Slack answers."""
        with self._lock:
            if user_id is not None:
                previous = self._store.home_views.get(user_id)
                view_id = previous["id"] if previous else self.new_id("V")
            else:
                view_id = view.get("id") or self.new_id("V")
            stored = {
                "callback_id": "",
                "private_metadata": "",
                "external_id": "",
                "state": {"values": {}},
                **copy.deepcopy(view),
                "id": view_id,
                "team_id": self.team.id,
                "app_id": self.team.app_id,
                "bot_id": self.team.bot_id,
                "hash": f"{next(self._ids)}.fakehash",
            }
            if user_id is not None:
                self._store.home_views[user_id] = stored
            self._store.views[view_id] = stored
            return copy.deepcopy(stored)

    def find_view(self, *, view_id: str | None = None, external_id: str | None = None) -> dict[str, Any] | None:
        with self._lock:
            for view in self._store.views.values():
                if (view_id and view["id"] == view_id) or (external_id and view.get("external_id") == external_id):
                    return copy.deepcopy(view)
            return None

    def new_upload(self, *, filename: str, length: int) -> UploadedFile:
        upload = UploadedFile(id=self.new_id("F"), filename=filename, length=length)
        with self._lock:
            self._store.files[upload.id] = upload
        return upload

    def receive_upload(self, file_id: str, content: bytes) -> bool:
        with self._lock:
            upload = self._store.files.get(file_id)
            if upload is None or upload.completed:
                return False
            self._store.files[file_id] = replace(upload, content=content)
            return True

    def complete_upload(self, file_id: str, **changes: Any) -> UploadedFile:
        with self._lock:
            upload = replace(self._store.files[file_id], completed=True, **changes)
            self._store.files[file_id] = upload
            return upload
