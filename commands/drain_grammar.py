"""The words of `/gpu drain`: `<node...|pool> [at <time>|next-window] [for <duration>]
[reason...]` read into a `DrainRequestSpec` (workflows.drain.plan), which the drain
use case checks against the pool's policy and turns into a plan.

- Targets come first: node names, or a pool name (all its GPU nodes; `pool=<name>`
  works too). All nodes must be in one configured pool. A word that is neither starts
  the reason, unless it looks like a misspelt node or pool, which is refused with the
  closest names.
- `at` takes `2026-12-05 02:00`, `2026-12-05T02:00`, `sat 02:00`, `today 02:00`,
  `tomorrow 03:00` or a bare `02:00` (the next time the clock shows it), optionally
  followed by a zone (`Europe/Berlin`). Without a zone the time is read in the zone of
  the pool's first window, else UTC. A time in the past is refused. No `at` means now.
- `next-window` is the start of the next window occurrence that starts at or after
  now (with `for`, the next one long enough for the drain).
- `for 2h` is how long the nodes stay drained. Without it a drain lasts until its
  window occurrence ends; on a pool whose windows are `always`, until someone says
  `drain done` (the request has no end).

Nothing here reads the clock or the cluster: `now` and the fleet are arguments.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from collections.abc import Mapping, Sequence

from commands import messages as msg
from workflows.drain import messages as say
from workflows.drain.plan import DrainError, DrainRequestSpec, StartFrom, next_window_start
from workflows.durations import parse_duration
from workflows.fleet.assessment import UNPOOLED
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName, PoolName
from workflows.pools import messages as pool_say
from workflows.pools.config import PoolConfig
from workflows.pools.windows import (
    END_OF_TIME,
    UTC,
    WindowError,
    as_utc,
    is_zone_name,
    parse_clock,
    parse_day,
    parse_zone,
    wall_time,
)

# Similarity above which an unknown word after the targets is taken for a misspelt
# node or pool (refused) rather than the start of the reason.
_TARGET_LIKENESS = 0.75


_KEYWORDS = ("at", "for", "next-window")


_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$", re.ASCII)


_DATE_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2})[T ](\d{1,2}:\d{2})$", re.ASCII)


class DrainRequestError(DrainError):
    """The words of the request cannot be read (unknown node, bad time, mixed pools)."""


def parse_drain_request(
    args: Sequence[str],
    *,
    fleet: Fleet,
    pools: Mapping[str, PoolConfig],
    now: dt.datetime,
) -> DrainRequestSpec:
    """Read the words after `/gpu drain`. Raises `DrainRequestError` saying exactly
    which word is wrong, or `DrainRefused` when `next-window` finds no window."""
    now = as_utc(now, asker="drains")
    words = [word for arg in args for word in arg.split()]
    if not words:
        raise DrainRequestError(msg.drain_needs_target(), code="missing-target")

    targets, at = _read_targets(words, fleet=fleet, pools=pools)
    if not targets:
        raise DrainRequestError(msg.drain_needs_target(), code="missing-target")
    pool, nodes, whole_pool = _resolve_targets(targets, fleet=fleet, pools=pools)
    policy = pools[pool]
    windows = policy.window_set

    when_words: list[str] | None = None
    next_window = False
    duration: dt.timedelta | None = None
    while at < len(words):
        word = words[at].lower()
        if word == "next-window" or (word == "at" and at + 1 < len(words)
                                     and words[at + 1].lower() == "next-window"):
            if when_words is not None or next_window:
                raise DrainRequestError(msg.repeated_clause("at"), code="repeated-clause")
            next_window = True
            at += 1 if word == "next-window" else 2
        elif word == "at":
            if when_words is not None or next_window:
                raise DrainRequestError(msg.repeated_clause("at"), code="repeated-clause")
            when_words, at = _take_time_words(words, at + 1)
        elif word == "for" and at + 1 < len(words) and _is_number(words[at + 1][:1]):
            if duration is not None:
                raise DrainRequestError(msg.repeated_clause("for"), code="repeated-clause")
            try:
                duration = parse_duration(words[at + 1])
            except ValueError:
                raise DrainRequestError(msg.bad_duration(words[at + 1]), code="bad-duration") from None
            if duration <= dt.timedelta(0):
                raise DrainRequestError(msg.bad_duration(words[at + 1]), code="bad-duration")
            at += 2
        elif word == "for" and at + 1 == len(words):
            raise DrainRequestError(msg.bad_duration(""), code="bad-duration")
        else:
            break
    reason = " ".join(words[at:]).strip()

    zone: dt.tzinfo = windows.zone or UTC
    start_from: StartFrom = "now"
    if next_window:
        start_from = "next-window"
        start = next_window_start(windows, pool=pool, now=now, duration=duration)
    elif when_words is not None:
        start_from = "at"
        start, zone = _read_time(when_words, zone=zone, now=now)
        if start < now:
            raise DrainRequestError(say.time_in_past(start, zone=zone, now=now), code="past-time")
    else:
        start = now

    if duration is not None:
        end: dt.datetime | None = start + duration
    else:
        occurrence = windows.occurrence_containing(start)
        end = None if occurrence is None or occurrence.end == END_OF_TIME else occurrence.end
    return DrainRequestSpec(pool=pool, nodes=nodes, whole_pool=whole_pool, start=start, end=end,
                            duration=duration, start_from=start_from, zone=zone, reason=reason)


def _is_number(word: str) -> bool:
    # NB: str.isdigit() is true for "²" and other digits int() refuses.
    return word.isascii() and word.isdigit()


def _pool_names(fleet: Fleet, pools: Mapping[str, PoolConfig]) -> list[str]:
    return sorted({p.name for p in fleet.pools if p.name != UNPOOLED} | set(pools))


def _known_names(fleet: Fleet, pools: Mapping[str, PoolConfig]) -> list[str]:
    return sorted(set(fleet.nodes) | set(_pool_names(fleet, pools)))


def _is_pool(name: str, fleet: Fleet, pools: Mapping[str, PoolConfig]) -> bool:
    return name != UNPOOLED and (name in pools or fleet.pool(name) is not None)


def _read_targets(words: list[str], *, fleet: Fleet,
                  pools: Mapping[str, PoolConfig]) -> tuple[list[tuple[str, bool]], int]:
    """(name, is_pool) for each target word, and the index of the first word after them."""
    targets: list[tuple[str, bool]] = []
    known = _known_names(fleet, pools)
    at = 0
    while at < len(words):
        word = words[at]
        if word.lower() in _KEYWORDS:
            break
        explicit_pool = word.lower().startswith("pool=")
        name = word[len("pool="):] if explicit_pool else word
        if explicit_pool and _is_pool(name, fleet, pools):
            targets.append((name, True))
        elif not explicit_pool and name in fleet.nodes:
            targets.append((name, False))
        elif not explicit_pool and _is_pool(name, fleet, pools):
            targets.append((name, True))
        else:
            candidates = _pool_names(fleet, pools) if explicit_pool else known
            closest = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
            likely = difflib.get_close_matches(name, candidates, n=1, cutoff=_TARGET_LIKENESS)
            if not targets or explicit_pool or likely:
                raise DrainRequestError(
                    msg.unknown_target(name, closest=closest, pool=explicit_pool),
                    code="unknown-target")
            break
        at += 1
    return targets, at


def _resolve_targets(targets: list[tuple[str, bool]], *, fleet: Fleet,
                     pools: Mapping[str, PoolConfig]) -> tuple[PoolName, tuple[NodeName, ...], bool]:
    nodes: list[NodeName] = []
    pool_of: dict[NodeName, PoolName] = {}
    whole_pool = False
    named_pools: list[PoolName] = []
    for name, is_pool in targets:
        if is_pool:
            whole_pool = True
            named_pools.append(PoolName(name))
            found = fleet.pool(name)
            members = found.nodes if found is not None else ()
            if not members:
                raise DrainRequestError(msg.empty_pool(name), code="empty-pool")
            for node in members:
                pool_of[node] = PoolName(name)
                if node not in nodes:
                    nodes.append(node)
        else:
            node = NodeName(name)
            pool_of[node] = fleet.nodes[node].pool
            if node not in nodes:
                nodes.append(node)
    by_pool: dict[PoolName, list[NodeName]] = {}
    for node in nodes:
        by_pool.setdefault(pool_of[node], []).append(node)
    if len(by_pool) > 1:
        raise DrainRequestError(msg.mixed_pools(by_pool), code="mixed-pools")
    (pool,) = by_pool
    if pool == UNPOOLED:
        raise DrainRequestError(msg.node_in_no_pool(by_pool[pool]), code="unconfigured-pool")
    if pool not in pools:
        raise DrainRequestError(pool_say.pool_not_configured(pool), code="unconfigured-pool")
    return pool, tuple(nodes), whole_pool


def _take_time_words(words: list[str], at: int) -> tuple[list[str], int]:
    """The words of an `at` clause: an optional day or date, a clock time (or a date
    and time in one word), an optional zone."""
    taken: list[str] = []
    if at < len(words) and not _CLOCK_WORD.match(words[at]) and not _DATE_TIME.match(words[at]):
        taken.append(words[at])
        at += 1
    if at < len(words) and (_CLOCK_WORD.match(words[at]) or _DATE_TIME.match(words[at])):
        taken.append(words[at])
        at += 1
    if at < len(words) and (is_zone_name(words[at]) or "/" in words[at]):
        taken.append(words[at])
        at += 1
    if not taken:
        raise DrainRequestError(msg.bad_time(""), code="bad-time")
    return taken, at


_CLOCK_WORD = re.compile(r"^\d{1,2}:\d{2}$", re.ASCII)


_RELATIVE_DAYS = {"today": 0, "tomorrow": 1}


def _read_time(words: list[str], *, zone: dt.tzinfo, now: dt.datetime) -> tuple[dt.datetime, dt.tzinfo]:
    text = " ".join(words)
    parts = list(words)
    if parts and (is_zone_name(parts[-1]) or "/" in parts[-1]):
        try:
            zone = parse_zone(parts.pop())
        except WindowError as err:
            raise DrainRequestError(str(err), code="unknown-zone") from None
    if len(parts) == 1 and (match := _DATE_TIME.match(parts[0])):
        parts = [match.group(1), match.group(2)]
    if not parts or not _CLOCK_WORD.match(parts[-1]):
        raise DrainRequestError(msg.bad_time(text), code="bad-time")
    try:
        clock = parse_clock(parts[-1])
    except WindowError:
        raise DrainRequestError(msg.bad_time(text), code="bad-time") from None
    today = now.astimezone(zone).date()
    if len(parts) == 1:
        day = today
        if wall_time(day, clock, zone) < now:
            day += dt.timedelta(days=1)
    elif len(parts) == 2:
        day = _read_day(parts[0], today=today, clock=clock, zone=zone, now=now, text=text)
    else:
        raise DrainRequestError(msg.bad_time(text), code="bad-time")
    return wall_time(day, clock, zone), zone


def _read_day(word: str, *, today: dt.date, clock: dt.time, zone: dt.tzinfo,
              now: dt.datetime, text: str) -> dt.date:
    lowered = word.lower()
    if lowered in _RELATIVE_DAYS:
        return today + dt.timedelta(days=_RELATIVE_DAYS[lowered])
    if match := _DATE.match(word):
        try:
            return dt.date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
        except ValueError:
            raise DrainRequestError(msg.bad_time(text), code="bad-time") from None
    try:
        weekday = parse_day(lowered)
    except WindowError:
        raise DrainRequestError(msg.bad_time(text), code="bad-time") from None
    # The next such day whose clock time is still ahead (today counts if it is).
    day = today + dt.timedelta(days=(weekday - today.weekday()) % 7)
    if wall_time(day, clock, zone) < now:
        day += dt.timedelta(days=7)
    return day
