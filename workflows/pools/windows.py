"""Maintenance windows: when a pool allows disruptive work such as a drain.

A `MaintenanceWindow` is a value parsed once from configuration (kured's model): the
days it starts on, a start and an end wall-clock time, and the IANA zone both are read
in. Nothing here reads the clock: every question takes the time as an argument.

The rules, for anyone reading a window in the configuration:

- `days` are the days a window *starts* on. An end at or before the start crosses
  midnight: `sat 22:00-04:00` runs from Saturday 22:00 to Sunday 04:00, and
  `sun 22:00-04:00` from Sunday 22:00 into Monday. `end: "24:00"` means midnight at the
  end of the start day, and an end equal to the start makes a 24-hour window.
  `windows: always` is how a pool allows drains at any time.
- An occurrence is the half-open span [start, end) of real time from the first instant
  the zone's clock shows `start` to the last instant it shows `end`. So across a
  daylight-saving change a window keeps its wall-clock times and changes its length: in
  America/New_York a 01:00-03:00 window lasts one hour on the spring-forward Sunday and
  three on the fall-back Sunday (01:00-02:00 is shown twice; both passes are inside).
- A wall time the clocks skip (02:30 on a spring-forward day) is read as the instant
  the clocks jump, as cron runs jobs scheduled in the skipped hour.
- A `WindowSet` is the union of a pool's windows: occurrences that overlap or touch are
  one span, so `sat 22:00-24:00` and `sun 00:00-06:00` allow one eight-hour drain.

All datetimes returned are aware and in UTC (arithmetic on zone-aware datetimes is
wall-clock arithmetic in Python, which is wrong across a DST change); callers show them
in the window's zone (`wording.local_time`).
"""

from __future__ import annotations

import datetime as dt
import difflib
import heapq
import re
import zoneinfo
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from workflows.pools import messages as say

UTC = dt.timezone.utc
DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_FULL_DAY_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# The span `always` answers with: all of time, as aware datetimes.
BEGINNING_OF_TIME = dt.datetime.min.replace(tzinfo=UTC)
END_OF_TIME = dt.datetime.max.replace(tzinfo=UTC)
# How far ahead searches for a window that fits look before giving up.
SEARCH_HORIZON = dt.timedelta(days=366)
# The longest span a WindowSet reports as one (windows covering every hour of the week
# would otherwise merge into one span without end).
_MERGE_SPAN = dt.timedelta(days=8)

_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})$", re.ASCII)


class WindowError(ValueError):
    """A window, day, time of day or zone that cannot be used; the message says why."""


class Occurrence(NamedTuple):
    """One occurrence of a window: the half-open span [start, end), in UTC."""

    start: dt.datetime
    end: dt.datetime

    @property
    def length(self) -> dt.timedelta:
        return self.end - self.start

    def contains(self, t: dt.datetime) -> bool:
        return self.start <= t < self.end


# ------------------------------------------------------------------ parsing


def parse_day(text: str) -> int:
    """"sat" or "Saturday" -> 5 (Monday is 0, as `date.weekday()` counts)."""
    word = text.strip().lower()
    if word in DAY_NAMES:
        return DAY_NAMES.index(word)
    if word in _FULL_DAY_NAMES:
        return _FULL_DAY_NAMES.index(word)
    raise WindowError(say.unknown_day(text, closest=difflib.get_close_matches(
        word, DAY_NAMES + _FULL_DAY_NAMES, n=1, cutoff=0.6)))


def parse_days(value: object) -> frozenset[int]:
    """Days as configured: a list of day names, ranges like "mon-fri" (which may wrap,
    "fri-mon"), or "daily"."""
    items: Sequence[object]
    if isinstance(value, str):
        items = [part for part in re.split(r"[,\s]+", value) if part]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise WindowError(say.days_not_a_list(value))
    days: set[int] = set()
    for item in items:
        if not isinstance(item, str):
            raise WindowError(say.days_not_a_list(item))
        word = item.strip().lower()
        if word == "daily":
            days.update(range(7))
        elif "-" in word:
            first, _, last = word.partition("-")
            a, b = parse_day(first), parse_day(last)
            days.update((a + i) % 7 for i in range((b - a) % 7 + 1))
        else:
            days.add(parse_day(word))
    if not days:
        raise WindowError(say.no_days())
    return frozenset(days)


def parse_clock(value: object, *, end: bool = False) -> dt.time:
    """"02:00" -> 02:00. "24:00" is allowed for an end (midnight after the start day).

    YAML reads an unquoted 02:00 as the number 120 (base 60), so a number is refused
    with advice to quote the time rather than guessed at."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise WindowError(say.clock_not_text(value))
    match = _CLOCK.match(value.strip())
    if not match:
        raise WindowError(say.bad_clock(value))
    hours, minutes = int(match.group(1)), int(match.group(2))
    if end and (hours, minutes) == (24, 0):
        return dt.time(0, 0)
    if hours > 23 or minutes > 59:
        raise WindowError(say.bad_clock(value))
    return dt.time(hours, minutes)


@lru_cache(maxsize=None)
def _zone_names() -> tuple[str, ...]:
    return tuple(sorted(zoneinfo.available_timezones()))


def parse_zone(name: object) -> zoneinfo.ZoneInfo:
    """An IANA zone ("Europe/Berlin", "UTC"); an unknown name is refused with the
    closest real ones."""
    if not isinstance(name, str) or not name.strip():
        raise WindowError(say.zone_missing())
    text = name.strip()
    try:
        if text in _zone_names():
            return zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        pass
    raise WindowError(say.unknown_zone(text, closest=difflib.get_close_matches(
        text, _zone_names(), n=3, cutoff=0.6)))


def is_zone_name(text: str) -> bool:
    return text in _zone_names()


# ------------------------------------------------------------------ wall clock -> instant


def wall_time(day: dt.date, clock: dt.time, zone: dt.tzinfo, *, last: bool = False) -> dt.datetime:
    """The instant (UTC) `zone`'s clock shows `clock` on `day`.

    A time shown twice (fall-back) is its first pass, or its last with `last=True`;
    a time the clocks skip (spring-forward) is the instant they jump."""
    naive = dt.datetime.combine(day, clock)
    first = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return first
    if first.astimezone(zone).replace(tzinfo=None) == naive:
        return second if last else first  # shown twice: both passes exist
    # Skipped: fold=1 reads it with the offset after the jump (an instant before the
    # jump), fold=0 with the offset before it (an instant after). The jump is between:
    # find its first second.
    low, high = int(min(first, second).timestamp()), int(max(first, second).timestamp())
    after = max(first, second).astimezone(zone).utcoffset()
    while high - low > 1:
        middle = (low + high) // 2
        if dt.datetime.fromtimestamp(middle, UTC).astimezone(zone).utcoffset() == after:
            high = middle
        else:
            low = middle
    return dt.datetime.fromtimestamp(high, UTC)


def as_utc(t: dt.datetime, *, asker: str = "window questions") -> dt.datetime:
    """`t` in UTC; a naive time is a programming error (`asker` names who asked)."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{asker} need an aware datetime, not {t.isoformat()}")
    return t.astimezone(UTC)


# ------------------------------------------------------------------ one window


@dataclass(frozen=True, slots=True)
class MaintenanceWindow:
    """Allowed on `days` (Monday is 0) from `start` to `end`, wall-clock times in `zone`."""

    days: frozenset[int]
    start: dt.time
    end: dt.time
    zone: zoneinfo.ZoneInfo

    def __post_init__(self) -> None:
        if not self.days or not all(0 <= d <= 6 for d in self.days):
            raise WindowError(say.no_days())

    @classmethod
    def parse(cls, *, days: object, start: object, end: object, timezone: object) -> MaintenanceWindow:
        """From configuration values; raises `WindowError` naming the bad part."""
        return cls(
            days=parse_days(days),
            start=parse_clock(start),
            end=parse_clock(end, end=True),
            zone=parse_zone(timezone),
        )

    @property
    def crosses_midnight(self) -> bool:
        return self.end <= self.start

    def occurrence_on(self, day: dt.date) -> Occurrence | None:
        """The occurrence that starts on `day` (local), if `day` is one of the window's
        days and the occurrence has any length (the clocks may skip all of it)."""
        if day.weekday() not in self.days:
            return None
        start = wall_time(day, self.start, self.zone)
        end_day = day + dt.timedelta(days=1) if self.crosses_midnight else day
        end = wall_time(end_day, self.end, self.zone, last=True)
        return Occurrence(start, end) if end > start else None

    def occurrences(self, after: dt.datetime) -> Iterator[Occurrence]:
        """Every occurrence that ends after `after`, in order (without end)."""
        t = as_utc(after)
        # An occurrence lasts at most 25 hours, so one that started two local days
        # back is the earliest that can still be running.
        day = t.astimezone(self.zone).date() - dt.timedelta(days=2)
        while True:
            found = self.occurrence_on(day)
            if found is not None and found.end > t:
                yield found
            day += dt.timedelta(days=1)

    def occurrence_containing(self, t: dt.datetime) -> Occurrence | None:
        t = as_utc(t)
        for found in self.occurrences(t):
            return found if found.start <= t else None
        return None  # pragma: no cover - occurrences() never ends

    def contains(self, t: dt.datetime) -> bool:
        return self.occurrence_containing(t) is not None

    def next_start(self, after: dt.datetime) -> dt.datetime:
        """The start of the first occurrence that starts at or after `after`."""
        t = as_utc(after)
        for found in self.occurrences(t):
            if found.start >= t:
                return found.start
        raise AssertionError("unreachable")  # pragma: no cover

    def fits(self, start: dt.datetime, duration: dt.timedelta) -> bool:
        """Whether a drain from `start` lasting `duration` lies inside one occurrence."""
        return _fits(self.occurrence_containing(start), as_utc(start), duration)

    def next_fit(self, after: dt.datetime, duration: dt.timedelta,
                 *, horizon: dt.timedelta = SEARCH_HORIZON) -> dt.datetime | None:
        """The earliest time at or after `after` when a drain of `duration` fits."""
        return _next_fit(self.occurrences(after), as_utc(after), duration, horizon)


def _fits(found: Occurrence | None, start: dt.datetime, duration: dt.timedelta) -> bool:
    if duration < dt.timedelta(0):
        raise ValueError(f"a drain cannot last {duration}")
    if found is None:
        return False
    return found.end == END_OF_TIME or start + duration <= found.end


def _next_fit(found: Iterable[Occurrence], after: dt.datetime, duration: dt.timedelta,
              horizon: dt.timedelta) -> dt.datetime | None:
    limit = after + horizon
    for occurrence in found:
        begin = max(occurrence.start, after)
        if begin > limit:
            return None
        if _fits(occurrence, begin, duration):
            return begin
    return None


# ------------------------------------------------------------------ a pool's windows


@dataclass(frozen=True, slots=True)
class WindowSet:
    """A pool's allowed windows. `always` allows any time; an empty set (no windows
    configured) allows none: drains fail closed until someone writes the windows."""

    windows: tuple[MaintenanceWindow, ...] = ()
    always: bool = False

    @classmethod
    def any_time(cls) -> WindowSet:
        return cls(always=True)

    @property
    def never(self) -> bool:
        return not self.always and not self.windows

    @property
    def zone(self) -> zoneinfo.ZoneInfo | None:
        """The zone people of this pool read times in: the first window's."""
        return self.windows[0].zone if self.windows else None

    def occurrences(self, after: dt.datetime) -> Iterator[Occurrence]:
        """Every span ending after `after`, in order; overlapping or touching
        occurrences of different windows are merged into one span."""
        t = as_utc(after)
        if self.always:
            yield Occurrence(BEGINNING_OF_TIME, END_OF_TIME)
            return
        if not self.windows:
            return
        # Start a while back so a span that began before `t` is reported from its real
        # start, and cap spans so windows that cover all of time still yield.
        merged = heapq.merge(*(w.occurrences(t - _MERGE_SPAN) for w in self.windows))
        current: Occurrence | None = None
        for found in merged:
            if current is None:
                current = found
            elif found.start <= current.end and current.length < _MERGE_SPAN:
                current = Occurrence(current.start, max(current.end, found.end))
            else:
                if current.end > t:
                    yield current
                current = found

    def occurrence_containing(self, t: dt.datetime) -> Occurrence | None:
        t = as_utc(t)
        for found in self.occurrences(t):
            return found if found.start <= t else None
        return None

    def contains(self, t: dt.datetime) -> bool:
        return self.occurrence_containing(t) is not None

    def next_start(self, after: dt.datetime) -> dt.datetime | None:
        """The start of the first span starting at or after `after`; `after` itself
        when any time is allowed; None when no window is configured."""
        t = as_utc(after)
        if self.always:
            return t
        for found in self.occurrences(t):
            if found.start >= t:
                return found.start
        return None

    def fits(self, start: dt.datetime, duration: dt.timedelta) -> bool:
        return _fits(self.occurrence_containing(start), as_utc(start), duration)

    def next_fit(self, after: dt.datetime, duration: dt.timedelta,
                 *, horizon: dt.timedelta = SEARCH_HORIZON) -> dt.datetime | None:
        """The earliest time at or after `after` when a drain of `duration` fits in one
        span; None if none does within `horizon` (or no window is configured)."""
        return _next_fit(self.occurrences(after), as_utc(after), duration, horizon)

    def longest(self, after: dt.datetime, *, horizon: dt.timedelta = dt.timedelta(days=14)) -> dt.timedelta:
        """The longest span starting within `horizon` of `after` (for "no window is long
        enough" answers)."""
        t = as_utc(after)
        best = dt.timedelta(0)
        for found in self.occurrences(t):
            if found.start > t + horizon:
                break
            best = max(best, found.length)
            if found.end == END_OF_TIME:
                break
        return best




def days_text(days: Iterable[int]) -> str:
    """{0,1,2,3,4} -> "mon-fri"; {5,6} -> "sat,sun"; every day -> "daily"."""
    chosen = sorted(set(days))
    if len(chosen) == 7:
        return "daily"
    runs: list[list[int]] = []
    for day in chosen:
        if runs and runs[-1][-1] == day - 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    return ",".join(f"{DAY_NAMES[r[0]]}-{DAY_NAMES[r[-1]]}" if len(r) >= 3
                    else ",".join(DAY_NAMES[d] for d in r) for r in runs)


def window_text(window: MaintenanceWindow) -> str:
    """"sat,sun 02:00-06:00 Europe/Berlin"."""
    return (f"{days_text(window.days)} {window.start.strftime('%H:%M')}-"
            f"{window.end.strftime('%H:%M')} {window.zone.key}")


def windows_text(windows: WindowSet) -> str:
    if windows.always:
        return "any time"
    if not windows.windows:
        return "none configured"
    return "; ".join(window_text(w) for w in windows.windows)
