"""What has been drained: per pool, the drain requests `/gpu status` shows (the last
finished one and those active or waiting for their window), and the latest time any run
(a drain, upgrade or MIG change) actually drained nodes of a pool, which the shift
handover reports. Read from the database; nothing here decides anything."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import Database
from storage.requests import Request, RequestState


@dataclass(frozen=True, slots=True)
class DrainRecord:
    """One drain request as `/gpu status` shows it."""

    request_id: str
    pool: str
    state: str
    nodes: tuple[str, ...]
    window_start: dt.datetime | None
    window_end: dt.datetime | None
    updated_at: dt.datetime  # for a finished drain: when it finished


@dataclass(frozen=True, slots=True)
class PoolDrains:
    """A pool's last finished drain (None before the first) and its drains whose
    window is approved, scheduled or running now."""

    pool: str
    last: DrainRecord | None
    active: tuple[DrainRecord, ...]


_FINISHED_DRAIN_STATES: tuple[RequestState, ...] = ("done", "failed")


_ACTIVE_DRAIN_STATES: tuple[RequestState, ...] = ("approved", "scheduled", "running")


_HISTORY_LIMIT = 500


def drain_history(db: Database, *, cluster: str | None = None) -> dict[str, PoolDrains]:
    """Per pool that has had a drain: the last one that finished (done or failed), with
    when and which nodes, and the drains active or waiting for their window. Pools
    without any drain are absent. With several clusters, `cluster`'s pools only (two
    clusters may each have a pool of the same name)."""
    only = None if cluster is None else (cluster,)

    def record(row: Request) -> DrainRecord:
        targets = row.targets if isinstance(row.targets, list) else []
        return DrainRecord(request_id=row.id, pool=row.pool, state=row.state,
                           nodes=tuple(str(t) for t in targets), window_start=row.window_start,
                           window_end=row.window_end, updated_at=row.updated_at)

    finished = [record(r) for r in stored_requests.in_states(db, states=_FINISHED_DRAIN_STATES, cluster=only,
                                                             limit=_HISTORY_LIMIT) if r.kind == "drain"]
    active = [record(r) for r in stored_requests.in_states(db, states=_ACTIVE_DRAIN_STATES, cluster=only,
                                                           limit=_HISTORY_LIMIT) if r.kind == "drain"]
    pools = sorted({d.pool for d in finished} | {d.pool for d in active})
    history: dict[str, PoolDrains] = {}
    for pool in pools:
        ours = [d for d in finished if d.pool == pool]
        last = max(ours, key=lambda d: d.updated_at) if ours else None
        history[pool] = PoolDrains(
            pool=pool, last=last,
            active=tuple(sorted((d for d in active if d.pool == pool),
                                key=lambda d: (d.window_start or d.updated_at, d.request_id))))
    return history


@dataclass(frozen=True, slots=True, kw_only=True)
class NodesDrained:
    """The latest time gpuops drained nodes of a pool: a finished drain or evict step of
    any real run (drain, upgrade or MIG change)."""

    pool: str
    request_id: str
    kind: str  # the request's kind: drain, upgrade, mig
    at: dt.datetime
    nodes: int
    outcome: str  # the run's state


DRAIN_SCAN_LIMIT = 200
_DRAIN_STEPS = frozenset({"drain", "evict"})
_DRAINED_REQUEST_STATES: tuple[RequestState, ...] = ("running", "done", "failed")


def last_drains(db: Database, *, cluster: str | None = None) -> list[NodesDrained]:
    """Per pool, the latest finished drain or evict step of a real (not dry) run; with
    several clusters, of `cluster`'s pools only."""
    latest: dict[str, NodesDrained] = {}
    requests = stored_requests.in_states(db, states=_DRAINED_REQUEST_STATES, limit=DRAIN_SCAN_LIMIT,
                                         cluster=None if cluster is None else (cluster,))
    for request in requests:
        for run in stored_runs.for_request(db, request_id=request.id):
            if run.dry_run:
                continue
            drained = [s for s in stored_steps.for_run(db, run_id=run.id)
                       if s.kind in _DRAIN_STEPS and s.state == "done" and s.ended_at]
            if not drained:
                continue
            at = max(s.ended_at for s in drained if s.ended_at)
            if request.pool not in latest or at > latest[request.pool].at:
                latest[request.pool] = NodesDrained(
                    pool=request.pool, request_id=request.id, kind=request.kind, at=at,
                    nodes=len({s.node for s in drained}), outcome=run.state)
    return sorted(latest.values(), key=lambda d: d.pool)
