"""Keys already seen, so a repeated delivery is handled once: Slack's HTTP retries
(`slack-retry`), Socket Mode envelope ids (`envelope`), button clicks (`button`).

Keys are unique per scope (the primary key is `(scope, key)`), so an envelope id can
never shadow a button click that happens to share its text.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from storage import codec
from storage.codec import JsonValue
from storage.database import Database


@dataclass(frozen=True, slots=True)
class Remembered:
    scope: str
    key: str
    created_at: dt.datetime
    result: JsonValue


def remember(
    db: Database, *, key: str, scope: str, at: dt.datetime, result: JsonValue = None
) -> bool:
    """True if `key` is new in `scope` (and is now remembered); False if seen before.

    Atomic across threads and processes: a single INSERT that does nothing on conflict
    (the targeted form of INSERT OR IGNORE, which would also swallow NOT NULL and CHECK
    failures), so exactly one caller gets True.
    """
    cursor = db.execute(
        "INSERT INTO idempotency (scope, key, created_at, result) VALUES (?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (scope, key, codec.time_to_text(at), codec.optional_json_to_text(result)),
    )
    return cursor.rowcount == 1


def recall(db: Database, *, key: str, scope: str) -> Remembered | None:
    row = db.query_one("SELECT * FROM idempotency WHERE scope = ? AND key = ?", (scope, key))
    return None if row is None else _from_row(row)


def set_result(db: Database, *, key: str, scope: str, result: JsonValue) -> bool:
    """Store what handling the key produced, so a repeat can answer the same way."""
    cursor = db.execute(
        "UPDATE idempotency SET result = ? WHERE scope = ? AND key = ?",
        (codec.optional_json_to_text(result), scope, key),
    )
    return cursor.rowcount == 1


def prune(db: Database, *, older_than: dt.datetime) -> int:
    """Forget keys remembered before `older_than`; returns how many. Keep them longer than
    the longest redelivery window (Slack retries for minutes, buttons live for days)."""
    cursor = db.execute(
        "DELETE FROM idempotency WHERE created_at < ?", (codec.time_to_text(older_than),)
    )
    return cursor.rowcount


def _from_row(row: dict[str, Any]) -> Remembered:
    return Remembered(
        scope=row["scope"],
        key=row["key"],
        created_at=codec.time_from_text(row["created_at"]),
        result=codec.optional_json_from_text(row["result"]),
    )
