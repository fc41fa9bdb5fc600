"""Each pool's capacity as the leader sampled it (GPUs advertised, GPUs out on cordoned
nodes), for `/gpu status <pool> --chart` where no Prometheus is configured. Bounded: a
sample is taken every few minutes and `record` forgets samples older than `KEEP`, so the
table holds about a day per pool however long the bot runs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from storage import codec
from storage.database import Database

KEEP = dt.timedelta(hours=26)  # a day, and a little for a chart asked for at the hour


@dataclass(frozen=True, slots=True)
class CapacitySample:
    pool: str
    at: dt.datetime
    advertised: int
    out: int


def record_samples(db: Database, samples: Iterable[CapacitySample], *, cluster: str, at: dt.datetime) -> int:
    """Store the samples taken at `at` (a repeat at the same time replaces them) and forget
    those older than `KEEP`; how many were forgotten."""
    with db.transaction():
        for sample in samples:
            db.execute("INSERT INTO capacity_samples (cluster, pool, at, advertised, out) VALUES (?, ?, ?, ?, ?)"
                       " ON CONFLICT (cluster, pool, at) DO UPDATE SET advertised = excluded.advertised,"
                       " out = excluded.out",
                       (cluster, sample.pool, codec.time_to_text(sample.at), sample.advertised, sample.out))
        cursor = db.execute("DELETE FROM capacity_samples WHERE at < ?", (codec.time_to_text(at - KEEP),))
    return cursor.rowcount


def of_pool(db: Database, *, cluster: str, pool: str, since: dt.datetime) -> list[CapacitySample]:
    """The pool's samples from `since` on, oldest first."""
    rows = db.query("SELECT pool, at, advertised, out FROM capacity_samples"
                    " WHERE cluster = ? AND pool = ? AND at >= ? ORDER BY at",
                    (cluster, pool, codec.time_to_text(since)))
    return [CapacitySample(pool=r["pool"], at=codec.time_from_text(r["at"]), advertised=int(r["advertised"]),
                           out=int(r["out"])) for r in rows]
