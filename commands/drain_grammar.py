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
import re
from collections.abc import Mapping, Sequence

from commands import messages as msg
from workflows.drain.plan import (
    DrainAsk,
    DrainRequestError,
    looks_like_a_target,
    resolve_drain_targets,
    target_kind,
    unknown_drain_target,
)
from workflows.durations import parse_duration
from workflows.fleet.summary import Fleet
from workflows.pools.config import PoolConfig
from workflows.pools.windows import (
    UTC,
    WindowError,
    as_utc,
    is_zone_name,
    parse_clock,
    parse_day,
    parse_zone,
    wall_time,
)

# The words that start a clause; in the targets they end the list.
KEYWORDS = frozenset({"at", "for", "next-window"})
_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$", re.ASCII)
_DATE_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2})[T ](\d{1,2}:\d{2})$", re.ASCII)


def read_drain_words(
    args: Sequence[str],
    *,
    fleet: Fleet,
    pools: Mapping[str, PoolConfig],
    now: dt.datetime,
) -> DrainAsk:
    """Read the words after `/gpu drain` into a `DrainAsk`. Raises `DrainRequestError`
    saying exactly which word is wrong."""
    now = as_utc(now, asker="drains")
    words, include = take_include_option([word for arg in args for word in arg.split()])
    if not words:
        raise DrainRequestError(msg.drain_needs_target(), code="missing-target")

    targets, at = _read_targets(words, fleet=fleet, pools=pools)
    if not targets:
        raise DrainRequestError(msg.drain_needs_target(), code="missing-target")
    # The pool says in which zone a time without one is read.
    pool, _, _ = resolve_drain_targets(targets, fleet=fleet, pools=pools)

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
            when_words, at = take_time_words(words, at + 1)
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

    if next_window:
        return DrainAsk(targets=tuple(targets), start_from="next-window", duration=duration, reason=reason,
                        include=include)
    if when_words is not None:
        start, zone = read_time(when_words, zone=pools[pool].window_set.zone or UTC, now=now)
        return DrainAsk(targets=tuple(targets), start_from="at", at=start, zone=zone, duration=duration,
                        reason=reason, include=include)
    return DrainAsk(targets=tuple(targets), duration=duration, reason=reason, include=include)


def _is_number(word: str) -> bool:
    # NB: str.isdigit() is true for "²" and other digits int() refuses.
    return word.isascii() and word.isdigit()


def _read_targets(words: list[str], *, fleet: Fleet, pools: Mapping[str, PoolConfig]) -> tuple[list[str], int]:
    """The target words, and the index of the first word after them. A word that names
    no node or pool starts the reason, unless it is the first or looks like a misspelt
    name (then it is refused with the closest names)."""
    targets: list[str] = []
    at = 0
    while at < len(words):
        word = words[at]
        if word.lower() in KEYWORDS:
            break
        if target_kind(word, fleet=fleet, pools=pools) is None:
            if not targets or looks_like_a_target(word, fleet=fleet, pools=pools):
                raise unknown_drain_target(word, fleet=fleet, pools=pools)
            break
        targets.append(word)
        at += 1
    return targets, at


def take_time_words(words: list[str], at: int) -> tuple[list[str], int]:
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


def read_time(words: list[str], *, zone: dt.tzinfo, now: dt.datetime) -> tuple[dt.datetime, dt.tzinfo]:
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


def read_start_words(rest: Sequence[str], *, zone: dt.tzinfo,
                     now: dt.datetime) -> tuple[dt.datetime | None, bool, int]:
    """When a rolling change (an upgrade, a MIG change) should start, from the words after
    what it changes: `at <time>`, `next-window` or `in the next window`, or nothing (now).
    Returns the start, whether it is the next window, and how many words that took."""
    lowered = [w.lower() for w in rest]
    if lowered[:1] == ["next-window"] or lowered[:2] == ["at", "next-window"]:
        return None, True, 1 if lowered[0] == "next-window" else 2
    if lowered[:4] == ["in", "the", "next", "window"]:
        return None, True, 4
    if lowered[:1] == ["at"]:
        when, used = take_time_words(list(rest), 1)
        start, _ = read_time(when, zone=zone, now=now)
        return start, False, used
    return None, False, 0


INCLUDE_OPTION = "--include"


def take_include_option(words: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """The words without `--include <node>[,<node>...]` (or `--include=<nodes>`, any number
    of times), and those nodes: every kind's words take it, so a node with open findings the
    change does not fix is changed anyway (workflows/preflight/nodes.py). Raises
    DrainRequestError for the option without a node."""
    kept: list[str] = []
    named: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word == INCLUDE_OPTION or word.startswith(INCLUDE_OPTION + "="):
            nodes = word.partition("=")[2]
            if not nodes and word == INCLUDE_OPTION and index + 1 < len(words) and not words[index + 1].startswith("--"):
                index += 1
                nodes = words[index]
            if not [n for n in nodes.split(",") if n]:
                raise DrainRequestError(msg.include_needs_node(), code="bad-include")
            named += [n for n in nodes.split(",") if n]
        else:
            kept.append(word)
        index += 1
    return kept, tuple(dict.fromkeys(named))
