"""How Python values are stored in columns: times, JSON, booleans, state sets.

Times: UTC ISO-8601 text, always with six fractional digits and a `Z`, e.g.
`2025-06-07T12:00:00.000000Z`. The fixed width makes text order equal time order, so
range queries compare columns to parameters directly. Aware datetimes in any zone are
converted to UTC; naive datetimes are refused, because guessing their zone is how
windows end up an hour off.

JSON: canonical text (sorted keys, `,`/`:` separators, UTF-8 kept, NaN refused), so
the same value always has the same bytes; the audit hash chain depends on this.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeAlias

JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"
# What a write accepts: JSON read back is a JsonValue, but a value to store may be built of
# narrower containers (a `dict[str, list[str]]`), which the invariant `dict`/`list` of
# JsonValue refuse. Tuples are stored as lists; a mapping must be a dict at run time.
JsonInput: TypeAlias = "None | bool | int | float | str | Sequence[JsonInput] | Mapping[str, JsonInput]"

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def time_to_text(at: dt.datetime) -> str:
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(
            f"naive datetime {at.isoformat()} given to storage; pass an aware UTC time"
        )
    return at.astimezone(dt.timezone.utc).strftime(_TIME_FORMAT)


def time_from_text(text: str) -> dt.datetime:
    # NB: the engine reads every step of a run on each turn, two times a row: strptime
    # made that 70% of reading them. The stored form is fixed-width, so a text of its
    # shape goes to the C parser; anything else to strptime, which refuses it.
    if len(text) == 27 and text[10] == "T" and text[19] == "." and text[26] == "Z":
        return dt.datetime.fromisoformat(text[:26]).replace(tzinfo=dt.timezone.utc)
    return dt.datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=dt.timezone.utc)


def optional_time_to_text(at: dt.datetime | None) -> str | None:
    return None if at is None else time_to_text(at)


def optional_time_from_text(text: str | None) -> dt.datetime | None:
    return None if text is None else time_from_text(text)


def json_to_text(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def json_from_text(text: str) -> Any:
    return json.loads(text)


def optional_json_to_text(value: Any) -> str | None:
    return None if value is None else json_to_text(value)


def optional_json_from_text(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def state_set(expected: str | Collection[str]) -> tuple[str, ...]:
    """`expected=` of a compare-and-set: one state or several."""
    states = (expected,) if isinstance(expected, str) else tuple(expected)
    if not states:
        raise ValueError("a compare-and-set needs at least one expected state")
    return states


def placeholders(values: Collection[object]) -> str:
    """`?, ?, ?` for an `IN (...)` list of len(values) parameters."""
    return ", ".join("?" for _ in values)
