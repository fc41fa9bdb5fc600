"""Runs: durable executions of a request's plan, one unfinished run per request at most.

The engine moves a run with compare-and-set transitions and resumes `unfinished()` runs
after a restart. The run's steps are in `storage.steps`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from storage import codec
from storage.database import Database
from storage.ids import RequestId, RunId, new_run_id

RunState = Literal["pending", "running", "paused", "aborted", "failed", "succeeded"]
UNFINISHED_STATES: frozenset[RunState] = frozenset({"pending", "running", "paused"})
FINISHED_STATES: frozenset[RunState] = frozenset({"aborted", "failed", "succeeded"})


@dataclass(frozen=True, slots=True)
class Run:
    id: RunId
    request_id: RequestId
    state: RunState
    dry_run: bool
    current_wave: int | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    halted_reason: str | None
    # What the run waits for before its next node or wave (a change freeze, the pool's
    # capacity or window), as the engine last said it; None while nothing holds it.
    waiting: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES


def create(
    db: Database,
    *,
    request_id: RequestId,
    dry_run: bool,
    at: dt.datetime,
    id: RunId | None = None,
) -> Run | None:
    """A new `pending` run, or None if the request already has an unfinished run (or an
    explicit `id` is taken). An unknown request raises `ConstraintViolated`."""
    with db.transaction():
        run_id = id if id is not None else _free_id(db)
        cursor = db.execute(
            "INSERT INTO runs (id, request_id, state, dry_run, created_at) "
            "VALUES (?, ?, 'pending', ?, ?) ON CONFLICT DO NOTHING",
            (run_id, request_id, int(dry_run), codec.time_to_text(at)),
        )
        if cursor.rowcount == 0:
            return None
        row = db.query_one("SELECT * FROM runs WHERE id = ?", (run_id,))
    assert row is not None
    return _from_row(row)


def get(db: Database, *, id: RunId) -> Run | None:
    row = db.query_one("SELECT * FROM runs WHERE id = ?", (id,))
    return None if row is None else _from_row(row)


def transition(
    db: Database,
    *,
    id: RunId,
    expected: RunState | Collection[RunState],
    new: RunState,
    at: dt.datetime,
    halted_reason: str | None = None,
) -> bool:
    """Move the run to `new` only if it is in `expected` now; True if this call won.

    The first move to `running` stamps `started_at`; a move to a finished state stamps
    `ended_at` and forgets what it waited for. `halted_reason` (why it paused, aborted or
    failed) replaces the old one when given.
    """
    states = codec.state_set(expected)
    stamp = codec.time_to_text(at)
    cursor = db.execute(
        "UPDATE runs SET state = ?,"
        " started_at = CASE WHEN ? = 'running' THEN coalesce(started_at, ?) ELSE started_at END,"
        " ended_at = CASE WHEN ? IN ('aborted', 'failed', 'succeeded') THEN ? ELSE ended_at END,"
        " halted_reason = coalesce(?, halted_reason),"
        " waiting = CASE WHEN ? IN ('aborted', 'failed', 'succeeded') THEN NULL ELSE waiting END"
        f" WHERE id = ? AND state IN ({codec.placeholders(states)})",
        (new, new, stamp, new, stamp, halted_reason, new, id, *states),
    )
    return cursor.rowcount == 1


def advance_wave(db: Database, *, id: RunId, expected_wave: int | None, wave: int) -> bool:
    """Set the wave the run is working on, if it is still on `expected_wave`."""
    cursor = db.execute(
        "UPDATE runs SET current_wave = ? WHERE id = ? AND current_wave IS NOT DISTINCT FROM ?",
        (wave, id, expected_wave),
    )
    return cursor.rowcount == 1


def set_waiting(db: Database, *, id: RunId, waiting: str | None) -> bool:
    """Say what the unfinished run waits for now (None: nothing); True if it changed."""
    cursor = db.execute(
        "UPDATE runs SET waiting = ? WHERE id = ? AND waiting IS DISTINCT FROM ?"
        " AND state IN ('pending', 'running', 'paused')",
        (waiting, id, waiting),
    )
    return cursor.rowcount == 1


def ended_since(db: Database, *, since: dt.datetime, states: Collection[RunState] = FINISHED_STATES) -> list[Run]:
    """Runs that ended (in one of `states`) at or after `since`, oldest first."""
    wanted = codec.state_set(states)
    rows = db.query(
        f"SELECT * FROM runs WHERE ended_at >= ? AND state IN ({codec.placeholders(wanted)})"
        " ORDER BY ended_at, id",
        (codec.time_to_text(since), *wanted),
    )
    return [_from_row(r) for r in rows]


def for_request(db: Database, *, request_id: RequestId) -> list[Run]:
    rows = db.query(
        "SELECT * FROM runs WHERE request_id = ? ORDER BY created_at, id", (request_id,)
    )
    return [_from_row(r) for r in rows]


def unfinished(db: Database, *, cluster: tuple[str | None] | None = None) -> list[Run]:
    """Runs the engine must resume or start (pending, running, paused), oldest first; with
    `cluster`, `(name,)`, only those of that cluster's requests (`(None,)`: of requests
    that name none)."""
    if cluster is None:
        rows = db.query(
            "SELECT * FROM runs WHERE state IN ('pending', 'running', 'paused') ORDER BY created_at, id"
        )
    else:
        rows = db.query(
            "SELECT runs.* FROM runs JOIN requests ON requests.id = runs.request_id"
            " WHERE runs.state IN ('pending', 'running', 'paused') AND requests.cluster IS NOT DISTINCT FROM ?"
            " ORDER BY runs.created_at, runs.id",
            (cluster[0],),
        )
    return [_from_row(r) for r in rows]


def _free_id(db: Database) -> RunId:
    # Called under the write lock, so the id stays free until the insert.
    while True:
        candidate = new_run_id()
        if db.query_one("SELECT 1 AS taken FROM runs WHERE id = ?", (candidate,)) is None:
            return candidate


def _from_row(row: dict[str, Any]) -> Run:
    return Run(
        id=RunId(row["id"]),
        request_id=RequestId(row["request_id"]),
        state=row["state"],
        dry_run=bool(row["dry_run"]),
        current_wave=row["current_wave"],
        created_at=codec.time_from_text(row["created_at"]),
        started_at=codec.optional_time_from_text(row["started_at"]),
        ended_at=codec.optional_time_from_text(row["ended_at"]),
        halted_reason=row["halted_reason"],
        waiting=row.get("waiting"),
    )
