"""Parsing the loose values found in labels, annotations and CR specs: text that should
hold a number, a time or a mapping, and may hold anything. Each reader answers None (or
an empty mapping) for what it cannot read, never an exception."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping


def int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def parse_unix(value: str | None) -> dt.datetime | None:
    seconds = int_or_none(value)
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)


def mapping_of(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
