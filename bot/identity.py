"""Who a Slack user is to gpuops: an `Actor` with the roles the configuration gives their
user id and the Slack user groups they belong to.

Group members are read with usergroups.users.list, one call per group the configuration
names (in `access.usergroups` or as `group:S…` in a pool's approvers), and kept for
`ttl` (5 minutes). An approval click, and `/gpu approve` or `/gpu deny` typed, read them
again at once (`fresh`), so someone just taken out of an approver group cannot decide on
the cached list, and the earlier
approvals counted with it are re-checked on fresh members too (`roles_of`). A lookup
that fails grants nothing from that group (fail closed) and is tried again after
`failure_ttl`, so a Slack outage cannot hand out roles and does not turn into a call per
command either. Names come from the configuration, else users.info
(cached the same way), else what the payload says, else the id.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bot import messages as msg
from bot.slack_api import SlackApi
from workflows.access import Actor
from workflows.config import GpuopsConfig

log = logging.getLogger("gpuops.bot.identity")

GROUP_TTL = 300.0
FAILURE_TTL = 30.0


@dataclass(frozen=True)
class _Cached:
    members: frozenset[str] | None  # None: the lookup failed
    until: float


def configured_groups(config: GpuopsConfig) -> tuple[str, ...]:
    """The Slack user groups roles come from: `access.usergroups` and every pool's
    `group:` approvers (each cluster's, with several)."""
    groups = set(config.access.usergroups)
    pools = [*config.pools.values(), *(pool for entry in config.clusters.values() for pool in entry.pools.values())]
    for pool in pools:
        groups.update(a.removeprefix("group:") for a in pool.approvers if a.startswith("group:"))
    return tuple(sorted(groups))


class SlackDirectory:
    def __init__(self, api: SlackApi, config: GpuopsConfig, *, ttl: float = GROUP_TTL,
                 failure_ttl: float = FAILURE_TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self._config = config
        self._ttl = ttl
        self._failure_ttl = failure_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, _Cached] = {}
        self._names: dict[str, tuple[str | None, float]] = {}

    def actor(self, user_id: str, *, fallback_name: str | None = None, fresh: bool = False) -> Actor:
        """The user with their roles; `fresh` reads the user groups from Slack now
        instead of from the cache (an approval click)."""
        groups = self._groups_of(user_id, fresh=fresh)
        name = self._config.access.names.get(user_id) or self._name(user_id) or fallback_name or user_id
        return self._config.actor(user_id, groups=groups, via="slack", name=name)

    def roles_of(self, user_id: str) -> Actor:
        """The user's roles as the cache knows them, without asking Slack for a name
        (`workflows.requests.RoleLookup`)."""
        return self._config.actor(user_id, groups=self._groups_of(user_id), via="slack")

    def _groups_of(self, user_id: str, *, fresh: bool = False) -> tuple[str, ...]:
        return tuple(g for g in configured_groups(self._config) if user_id in self._members(g, fresh=fresh))

    def _members(self, group: str, *, fresh: bool = False) -> frozenset[str]:
        now = self._clock()
        with self._lock:
            cached = self._groups.get(group)
        if fresh or cached is None or cached.until <= now:
            try:
                cached = _Cached(self._api.usergroup_members(group), now + self._ttl)
            except Exception as err:  # noqa: BLE001 - any failure fails closed
                error = getattr(getattr(err, "response", None), "get", lambda _k: None)("error") or type(err).__name__
                log.warning(msg.group_lookup_failed_log(group, str(error)))
                cached = _Cached(None, now + self._failure_ttl)
            with self._lock:
                self._groups[group] = cached
        return cached.members or frozenset()

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
