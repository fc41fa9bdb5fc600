"""Small pieces of wording every message module shares: lists of names, counts with
their noun, durations and times as people read them. One definition each; this module
imports nothing from gpuops, so every package may use it."""

from __future__ import annotations

import datetime as dt
import reprlib
from collections.abc import Iterable
from typing import Literal

_LIST_AT_MOST = 6
_UTC = dt.timezone.utc

# How a time is written, by where it is read; every style writes the zone it is in, so a
# time read anywhere says which clock it is (callers pass the display zone,
# `GpuopsConfig.display_zone`, or a pool's or rotation's own):
#   minute  "2025-06-08 14:00 CEST"     request threads, cards and views
#   second  "2025-06-08 14:00:03 CEST"  run threads (steps follow each other within minutes)
#   table   "2025-06-08 14:00 CEST"     table cells
#   day     "Sun 08 Jun 14:00 CEST"     the handover, in the rotation's zone
#   local   "Sun 2025-06-08 14:00 CEST" drain plans, in the pool's zone
TimeStyle = Literal["minute", "second", "table", "day", "local"]
_TIME_FORMATS: dict[TimeStyle, str] = {
    "minute": "%Y-%m-%d %H:%M %Z",
    "second": "%Y-%m-%d %H:%M:%S %Z",
    "table": "%Y-%m-%d %H:%M %Z",
    "day": "%a %d %b %H:%M %Z",
    "local": "%a %Y-%m-%d %H:%M %Z",
}


def when(at: dt.datetime, zone: dt.tzinfo = _UTC, *, style: TimeStyle = "minute") -> str:
    """A time as people read it, in `zone` (UTC unless given) and saying which zone;
    `style` says where it is read (see `_TIME_FORMATS`)."""
    return at.astimezone(zone).strftime(_TIME_FORMATS[style])


def names(items: Iterable[str], *, at_most: int = _LIST_AT_MOST) -> str:
    """"a", "a and b", "a, b and c", "a, b, c, … and 4 more"."""
    listed = list(items)
    if not listed:
        return "none"
    if len(listed) > at_most:
        shown = listed[:at_most - 1]
        return f"{', '.join(shown)} and {len(listed) - len(shown)} more"
    if len(listed) == 1:
        return listed[0]
    return f"{', '.join(listed[:-1])} and {listed[-1]}"


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    return f"{count} {noun if count == 1 else (plural_noun or noun + 's')}"


def duration_text(length: dt.timedelta) -> str:
    """timedelta(hours=1, minutes=30) -> "1h30m"; whole units only, seconds if any."""
    total = int(length.total_seconds())
    if total <= 0:
        return "0m"
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "",
             f"{minutes}m" if minutes else "", f"{seconds}s" if seconds else ""]
    return "".join(parts)


def zone_name(zone: dt.tzinfo) -> str:
    return getattr(zone, "key", None) or ("UTC" if zone.utcoffset(None) in (None, dt.timedelta(0)) else str(zone))


def local_time(at: dt.datetime, zone: dt.tzinfo) -> str:
    """"Sat 2026-12-05 02:00 CET": a time as the pool's people read it."""
    return when(at, zone, style="local")


def at_words(at: dt.datetime, zone: dt.tzinfo) -> str:
    """The `at` clause that asks for exactly this time: "at 2026-12-05 02:00 Europe/Berlin"."""
    return f"at {at.astimezone(zone).strftime('%Y-%m-%d %H:%M')} {zone_name(zone)}"


def closest_hint(closest: Iterable[str]) -> str:
    """"; did you mean a or b?" after a name that is not known, or nothing."""
    listed = list(closest)
    return f"; did you mean {' or '.join(listed)}?" if listed else ""


def shown(text: str) -> str:
    """`text` safe to print: each character a terminal would act on or hide (control
    characters and the escapes that start with one, bidirectional overrides, zero-width
    characters, lone surrogates) written as its Python escape, "\\x1b[2J" for ESC [2J."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


_QUOTE_AT_MOST = 40
_QUOTED = reprlib.Repr()
_QUOTED.maxlevel, _QUOTED.maxdict, _QUOTED.maxlist, _QUOTED.maxtuple = 2, 4, 4, 4
_QUOTED.maxset = _QUOTED.maxfrozenset = _QUOTED.maxdeque = _QUOTED.maxarray = 4
_QUOTED.maxstring = _QUOTED.maxother = _QUOTED.maxlong = _QUOTE_AT_MOST


def quoted(value: object, *, at_most: int = _QUOTE_AT_MOST) -> str:
    """A value as a message quotes something a person wrote: repr()'s quotes and escapes,
    cut short after `at_most` characters with its length said ("'AAAA…' (10,000
    characters)"); a list or mapping shows its first few items, a level or two deep. The
    cost is bounded whatever the value holds."""
    if isinstance(value, str):
        if len(value) <= at_most:
            return repr(value)
        cut = repr(value[:at_most])
        return f"{cut[:-1]}…{cut[-1]} ({len(value):,} characters)"
    return shown(_QUOTED.repr(value))
