"""Small named text values: the engine's lease holder notes, the audit chain's anchor,
first-seen times of node states. Keys starting with `audit.` belong to `storage.audit`, `first-seen.` to
`storage.first_seen`; nothing else should write them.
"""

from __future__ import annotations

from storage.database import Database


def get(db: Database, *, key: str) -> str | None:
    row = db.query_one("SELECT value FROM kv WHERE key = ?", (key,))
    return None if row is None else row["value"]


def put(db: Database, *, key: str, value: str) -> None:
    db.execute(
        "INSERT INTO kv (key, value) VALUES (?, ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def delete(db: Database, *, key: str) -> bool:
    return db.execute("DELETE FROM kv WHERE key = ?", (key,)).rowcount == 1
