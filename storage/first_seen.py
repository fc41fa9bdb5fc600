"""When gpuops first saw a node in a state (its driver upgrade state, its MIG change), so
ages survive a restart. Kept in `kv` under keys `first-seen.<aspect>.<node>`, one JSON
value `{"state": ..., "since": ...}` each; written only when a state changes."""

from __future__ import annotations

import datetime as dt
import json

from storage import codec, kv
from storage.database import Database

_PREFIX = "first-seen."


def _key(aspect: str, node: str) -> str:
    return f"{_PREFIX}{aspect}.{node}"


def load_all(db: Database) -> dict[tuple[str, str], tuple[str, dt.datetime]]:
    """(aspect, node) -> (state, since) for everything recorded."""
    found: dict[tuple[str, str], tuple[str, dt.datetime]] = {}
    for row in db.query("SELECT key, value FROM kv WHERE key LIKE ?", (_PREFIX + "%",)):
        aspect, _, node = str(row["key"])[len(_PREFIX):].partition(".")
        try:
            value = json.loads(row["value"])
            found[(aspect, node)] = (str(value["state"]), codec.time_from_text(str(value["since"])))
        except (ValueError, KeyError, TypeError):
            continue  # unreadable: it is recorded afresh
    return found


def get(db: Database, *, aspect: str, node: str) -> tuple[str, dt.datetime] | None:
    """(state, since) recorded for `node` in `aspect`; None when none (or unreadable)."""
    value = kv.get(db, key=_key(aspect, node))
    if value is None:
        return None
    try:
        found = json.loads(value)
        return str(found["state"]), codec.time_from_text(str(found["since"]))
    except (ValueError, KeyError, TypeError):
        return None


def put(db: Database, *, aspect: str, node: str, state: str, since: dt.datetime) -> None:
    kv.put(db, key=_key(aspect, node), value=codec.json_to_text({"state": state, "since": codec.time_to_text(since)}))


def forget(db: Database, *, aspect: str, node: str) -> None:
    kv.delete(db, key=_key(aspect, node))
