"""Who a Slack user is to gpuops: an `Actor` with the roles the configuration gives their
user id and the Slack user groups they belong to.

Group members are read with usergroups.users.list, one call per group the configuration
names (in `access.usergroups` or as `group:S…` in a pool's approvers), and kept for
`ttl` (5 minutes): enough for what only reads. Anything that changes something (every
button, every request form, and each typed command the registry marks as changing
something) asks for the user's groups `fresh`: each group is read again unless it was
read within `fresh_age` seconds, so someone just taken out of a group cannot act on the
cached list (and someone just added can act at once). The earlier approvals counted
with a fresh approval are re-checked on those members too (`roles_of`).

usergroups.users.list is Tier 2 (about 20 calls a minute): reads are paced to
`reads_per_minute` over a sliding minute, a burst of clicks costs one call per group
(the `fresh_age` answer, and one reader per group at a time), and a fresh read that
finds the minute spent waits up to `fresh_wait` for room. A read that fails, or finds no
room, grants nothing from that group (fail closed); a failed lookup is tried again
after `failure_ttl`, so a Slack outage cannot hand out roles and does not turn into a
call per command either. Names come from the configuration, else users.info (cached the
same way), else what the payload says, else the id.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from bot import messages as msg
from bot.slack_api import SlackApi
from workflows.access import Actor
from workflows.config import GpuopsConfig

log = logging.getLogger("gpuops.bot.identity")

GROUP_TTL = 300.0
FAILURE_TTL = 30.0
# How old a group's members may be for an action that changes something.
FRESH_AGE = 5.0
# Slack's Tier 2 (usergroups.users.list): "20+ per minute"; the floor, per workspace.
GROUP_READS_PER_MINUTE = 20
# How long a fresh read waits for room in the minute before it fails closed.
FRESH_WAIT = 10.0
_MINUTE = 60.0


@dataclass(frozen=True)
class _Cached:
    members: frozenset[str] | None  # None: the lookup failed
    until: float
    read_at: float


def configured_groups(config: GpuopsConfig) -> tuple[str, ...]:
    """The Slack user groups roles come from: `access.usergroups` and every pool's
    `group:` approvers and operators (each cluster's, with several)."""
    groups = set(config.access.usergroups)
    pools = [*config.pools.values(), *(pool for entry in config.clusters.values() for pool in entry.pools.values())]
    for pool in pools:
        groups.update(a.removeprefix("group:") for a in (*pool.approvers, *pool.operators) if a.startswith("group:"))
    return tuple(sorted(groups))


class SlackDirectory:
    def __init__(self, api: SlackApi, config: GpuopsConfig, *, ttl: float = GROUP_TTL,
                 failure_ttl: float = FAILURE_TTL, fresh_age: float = FRESH_AGE,
                 reads_per_minute: int = GROUP_READS_PER_MINUTE, fresh_wait: float = FRESH_WAIT,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._api = api
        self._config = config
        self._ttl = ttl
        self._failure_ttl = failure_ttl
        self._fresh_age = fresh_age
        self._reads_per_minute = reads_per_minute
        self._fresh_wait = fresh_wait
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._groups: dict[str, _Cached] = {}
        self._reading: dict[str, threading.Lock] = {}  # one reader per group at a time
        self._reads: deque[float] = deque()  # when each read of the last minute was made
        self._names: dict[str, tuple[str | None, float]] = {}

    def actor(self, user_id: str, *, fallback_name: str | None = None, fresh: bool = False) -> Actor:
        """The user with their roles; `fresh` (an action that changes something) reads
        each group from Slack again unless it was read within `fresh_age` seconds."""
        groups, unread = self._groups_of(user_id, fresh=fresh)
        name = self._config.access.names.get(user_id) or self._name(user_id) or fallback_name or user_id
        return self._config.actor(user_id, groups=groups, via="slack", name=name, unread_groups=unread)

    def roles_of(self, user_id: str) -> Actor:
        """The user's roles as the cache knows them, without asking Slack for a name
        (`workflows.requests.RoleLookup`)."""
        groups, unread = self._groups_of(user_id)
        return self._config.actor(user_id, groups=groups, via="slack", unread_groups=unread)

    def _groups_of(self, user_id: str, *, fresh: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The configured groups the user is in, and those that could not be read."""
        groups: list[str] = []
        unread: list[str] = []
        for group in configured_groups(self._config):
            members = self._members(group, fresh=fresh)
            if members is None:
                unread.append(group)
            elif user_id in members:
                groups.append(group)
        return tuple(groups), tuple(unread)

    def _members(self, group: str, *, fresh: bool = False) -> frozenset[str] | None:
        """The group's members; None when they could not be read (no role from it)."""
        cached = self._usable(group, fresh=fresh)
        if cached is not None:
            return cached.members
        with self._lock:
            reading = self._reading.setdefault(group, threading.Lock())
        with reading:
            # Another thread may have read it while this one waited.
            cached = self._usable(group, fresh=fresh)
            if cached is not None:
                return cached.members
            if not self._room(wait=fresh):
                log.warning(msg.group_lookup_paced_log(group, self._reads_per_minute))
                # NB: the cached list is kept for what only reads; this action gets nothing.
                return None if fresh else self._stale(group)
            now = self._clock()
            try:
                cached = _Cached(self._api.usergroup_members(group), now + self._ttl, now)
            except Exception as err:  # noqa: BLE001 - any failure fails closed
                error = getattr(getattr(err, "response", None), "get", lambda _k: None)("error") or type(err).__name__
                log.warning(msg.group_lookup_failed_log(group, str(error)))
                cached = _Cached(None, now + self._failure_ttl, now)
            with self._lock:
                self._groups[group] = cached
        return cached.members

    def _usable(self, group: str, *, fresh: bool) -> _Cached | None:
        """The cached answer when it serves this read, else None (read it again)."""
        now = self._clock()
        with self._lock:
            cached = self._groups.get(group)
        if cached is None or cached.until <= now:
            return None
        return cached if not fresh or now - cached.read_at <= self._fresh_age else None

    def _stale(self, group: str) -> frozenset[str] | None:
        with self._lock:
            cached = self._groups.get(group)
        return cached.members if cached is not None else None

    def _room(self, *, wait: bool) -> bool:
        """Take a place among this minute's reads; `wait` up to `fresh_wait` for one."""
        deadline = self._clock() + self._fresh_wait
        while True:
            with self._lock:
                now = self._clock()
                while self._reads and self._reads[0] <= now - _MINUTE:
                    self._reads.popleft()
                if len(self._reads) < self._reads_per_minute:
                    self._reads.append(now)
                    return True
                free_at = self._reads[0] + _MINUTE
            if not wait or free_at > deadline:
                return False
            self._sleep(max(free_at - now, 0.01))

    def _name(self, user_id: str) -> str | None:
        now = self._clock()
        with self._lock:
            cached = self._names.get(user_id)
        if cached is not None and cached[1] > now:
            return cached[0]
        name = self._api.display_name(user_id)
        with self._lock:
            self._names[user_id] = (name, now + (self._ttl if name else self._failure_ttl))
        return name
