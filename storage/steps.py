"""Steps of a run: per node, in waves, in order (cordon -> ... -> uncordon).

The engine persists each step's transition before acting on the cluster, so a restarted
bot can see which step was in flight (`running`) and redo it idempotently.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from storage import codec
from storage.codec import JsonInput, JsonValue
from storage.database import Database
from storage.ids import RunId, StepId

# A step kind's name ("cordon", "driver-version"). Which kinds there are is not written
# here: each kind of change registers its own (workflows/kinds.py), and the database
# keeps them as reference rows, so it still refuses a step of a kind nobody registered.
StepKind = str
StepState = Literal["pending", "running", "done", "failed", "skipped"]
FINISHED_STATES: frozenset[StepState] = frozenset({"done", "failed", "skipped"})


@dataclass(frozen=True, slots=True)
class NewStep:
    """A step as the plan describes it, before it is stored."""

    wave: int
    node: str
    seq: int
    kind: StepKind
    detail: JsonValue = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Step:
    id: StepId
    run_id: RunId
    wave: int
    node: str
    seq: int
    kind: StepKind
    state: StepState
    attempt: int
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    detail: JsonValue
    error: str | None


def add(db: Database, *, run_id: RunId, steps: Sequence[NewStep]) -> list[Step]:
    """Store a run's steps, all `pending`, in one transaction; returned in run order.
    A repeated (node, seq) within the run raises `ConstraintViolated`."""
    rows = [
        {
            "run_id": run_id,
            "wave": s.wave,
            "node": s.node,
            "seq": s.seq,
            "kind": s.kind,
            "state": "pending",
            "attempt": 0,
            "detail": codec.json_to_text(s.detail),
        }
        for s in steps
    ]
    with db.transaction():
        if rows:
            for row in rows:
                db.insert("steps", row)
        return for_run(db, run_id=run_id)


def get(db: Database, *, id: StepId) -> Step | None:
    row = db.query_one("SELECT * FROM steps WHERE id = ?", (id,))
    return None if row is None else _from_row(row)


def for_run(db: Database, *, run_id: RunId, wave: int | None = None) -> list[Step]:
    """The run's steps (one wave's if given) ordered by wave, node, seq."""
    sql = _RUN_STEPS
    params: list[Any] = [run_id]
    if wave is not None:
        sql += " AND wave = ?"
        params.append(wave)
    return [_from_row(r) for r in db.query(sql + _IN_RUN_ORDER, params)]


_RUN_STEPS = "SELECT * FROM steps WHERE run_id = ?"
_IN_RUN_ORDER = " ORDER BY wave, node, seq"


class RunStepReads:
    """A run's steps read again and again, as the engine reads them on every turn: a row
    unchanged since this reader's last read of its run comes back as the `Step` decoded
    then. NB: decoding was half the engine's CPU in a 200-node upgrade (1,200 rows a turn,
    each eviction's detail 3.6 kB of JSON). What is returned equals what `for_run` returns;
    only a step's `detail` is shared between reads, so it is never changed in place
    (writers copy it, as `replace_detail`'s callers do)."""

    def __init__(self) -> None:
        self._known: dict[RunId, dict[tuple[Any, ...], Step]] = {}

    def for_run(self, db: Database, *, run_id: RunId) -> list[Step]:
        known = self._known.get(run_id, {})
        fresh: dict[tuple[Any, ...], Step] = {}
        steps = []
        names, rows = db.rows(_RUN_STEPS + _IN_RUN_ORDER, [run_id])
        for values in rows:  # every column: a change anywhere is another row
            step = known.get(values) or _from_row(dict(zip(names, values)))
            fresh[values] = step
            steps.append(step)
        self._known[run_id] = fresh  # what the run no longer holds is let go
        return steps

    def keep_only(self, run_ids: Collection[RunId]) -> None:
        """Let go of the runs not in `run_ids` (finished, or no longer this reader's)."""
        for run_id in set(self._known) - set(run_ids):
            del self._known[run_id]

    def forget(self) -> None:
        self._known.clear()


def finished_of_kind(db: Database, *, kind: StepKind, cluster: tuple[str | None] | None = None) -> list[Step]:
    """Every step of `kind` that ended done or failed, in every run that was not a dry
    run (with `cluster`, `(name,)`, only runs of that cluster's requests): the newest end
    first (ties: the later step first)."""
    sql = "SELECT steps.* FROM steps JOIN runs ON runs.id = steps.run_id"
    params: list[object] = []
    if cluster is not None:
        sql += " JOIN requests ON requests.id = runs.request_id AND requests.cluster IS NOT DISTINCT FROM ?"
        params.append(cluster[0])
    sql += (" WHERE steps.kind = ? AND steps.state IN ('done', 'failed') AND steps.ended_at IS NOT NULL"
            " AND runs.dry_run = 0")
    params.append(kind)
    return [_from_row(r) for r in db.query(sql + " ORDER BY steps.ended_at DESC, steps.id DESC", params)]


def transition(
    db: Database,
    *,
    id: StepId,
    expected: StepState | Collection[StepState],
    new: StepState,
    at: dt.datetime,
    detail: JsonInput = None,
    error: str | None = None,
) -> bool:
    """Move the step to `new` only if it is in `expected` now; True if this call won.

    Moving to `running` counts an attempt, stamps `started_at` and clears `ended_at` and
    `error` (a retry starts clean); moving to done/failed/skipped stamps `ended_at`.
    `detail` replaces the stored detail when given; `error` is recorded as given.
    """
    states = codec.state_set(expected)
    expected_params = {f"expected{i}": state for i, state in enumerate(states)}
    cursor = db.execute(
        "UPDATE steps SET state = :new,"
        " attempt = attempt + :starting,"
        " started_at = CASE WHEN :starting = 1 THEN :at ELSE started_at END,"
        " ended_at = CASE WHEN :starting = 1 THEN NULL"
        "   WHEN :new IN ('done', 'failed', 'skipped') THEN :at ELSE ended_at END,"
        " error = CASE WHEN :starting = 1 THEN :error ELSE coalesce(:error, error) END,"
        " detail = coalesce(:detail, detail)"
        f" WHERE id = :id AND state IN ({', '.join(':' + k for k in expected_params)})",
        {
            "new": new,
            "starting": int(new == "running"),
            "at": codec.time_to_text(at),
            "error": error,
            "detail": None if detail is None else codec.json_to_text(detail),
            "id": id,
            **expected_params,
        },
    )
    return cursor.rowcount == 1


def stop_unfinished(db: Database, steps: Sequence[Step], *, at: dt.datetime, error: str) -> None:
    """End the steps a stopped run leaves behind: pending ones become `skipped`, running
    ones `failed` with `error` (steps another writer moved meanwhile are left alone)."""
    for step in steps:
        if step.state == "pending":
            transition(db, id=step.id, expected="pending", new="skipped", at=at)
        elif step.state == "running":
            transition(db, id=step.id, expected="running", new="failed", at=at, error=error)


def replace_detail(db: Database, *, id: StepId, expected: StepState | Collection[StepState],
                   detail: JsonInput) -> bool:
    """Replace the step's detail while it is in `expected` (a control such as a released
    hold); True if this call won."""
    states = codec.state_set(expected)
    marks = ", ".join("?" for _ in states)
    cursor = db.execute(f"UPDATE steps SET detail = ? WHERE id = ? AND state IN ({marks})",
                        (codec.json_to_text(detail), id, *states))
    return cursor.rowcount == 1


def _from_row(row: dict[str, Any]) -> Step:
    return Step(
        id=StepId(row["id"]),
        run_id=RunId(row["run_id"]),
        wave=row["wave"],
        node=row["node"],
        seq=row["seq"],
        kind=row["kind"],
        state=row["state"],
        attempt=row["attempt"],
        started_at=codec.optional_time_from_text(row["started_at"]),
        ended_at=codec.optional_time_from_text(row["ended_at"]),
        detail=codec.json_from_text(row["detail"]),
        error=row["error"],
    )
