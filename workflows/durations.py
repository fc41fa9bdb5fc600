"""Durations as people write them in configuration and commands: "90s", "30m", "1h",
"2d", or combinations like "1h30m"; a bare number is seconds. One parser for all of
gpuops, and `utc_now`, the clock a component reads when it is given none. This module
imports nothing from gpuops, so every package may use it."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_DURATION = re.compile(r"^\s*(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?\s*$", re.ASCII)


def parse_duration(value: Any) -> dt.timedelta:
    """"1h30m" -> timedelta(hours=1, minutes=30); a bare number is seconds."""
    if isinstance(value, dt.timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return dt.timedelta(seconds=value)
    match = _DURATION.match(str(value)) if isinstance(value, str) and value.strip() else None
    if not match or not any(match.groups()):
        raise ValueError(f"{value!r} is not a duration; write it like 90s, 30m, 1h or 1h30m")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def utc_now() -> dt.datetime:
    """Now, in UTC (freezegun's time under a frozen clock)."""
    return dt.datetime.now(dt.timezone.utc)


Duration = Annotated[dt.timedelta, BeforeValidator(parse_duration)]
