"""What the database says about the bot's work right now, counted for /metrics: requests
by kind and state, approvals pending, runs by state, steps running and the durations of
finished ones, the Slack outbox's depth, handovers acknowledged late
(reminded, escalated), when the oldest pending request was asked for, each unfinished
run's window end and the runs halted since `since`. Aggregates in SQL;
step durations and halts over the last `since` only, so a scrape stays cheap as history grows."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from storage import codec
from storage.database import Database


@dataclass(frozen=True, slots=True)
class Gauges:
    requests: dict[tuple[str, str], int]  # (kind, state) -> count
    approvals_pending: int  # requests waiting for approvals
    runs: dict[str, int]  # state -> count
    steps_running: dict[str, int]  # kind -> count
    step_seconds: dict[str, list[float]]  # kind -> durations of steps finished since `since`
    outbox: dict[str, int]  # state -> count (pending, failed; sent is pruned)
    handovers_reminded: int  # handovers not acknowledged within ack_timeout (a reminder went out)
    handovers_escalated: int  # ... nor after the reminder (escalated)
    oldest_pending: dt.datetime | None = None  # when the oldest request waiting for approvals was asked for
    windows: tuple[RunWindow, ...] = ()  # unfinished runs (pending, running, paused) and their windows' ends
    halted: tuple[RunHalt, ...] = ()  # runs that failed (halted) since `since`


@dataclass(frozen=True, slots=True)
class RunWindow:
    run: str
    pool: str
    kind: str
    window_end: dt.datetime | None  # None: the request has no window end


@dataclass(frozen=True, slots=True)
class RunHalt:
    run: str
    pool: str
    kind: str
    at: dt.datetime


def read(db: Database, *, since: dt.datetime) -> Gauges:
    requests = {(r["kind"], r["state"]): int(r["n"]) for r in db.query(
        "SELECT kind, state, COUNT(*) AS n FROM requests GROUP BY kind, state")}
    runs = {r["state"]: int(r["n"]) for r in db.query("SELECT state, COUNT(*) AS n FROM runs GROUP BY state")}
    running = {r["kind"]: int(r["n"]) for r in db.query(
        "SELECT kind, COUNT(*) AS n FROM steps WHERE state = 'running' GROUP BY kind")}
    seconds: dict[str, list[float]] = {}
    for row in db.query("SELECT kind, started_at, ended_at FROM steps WHERE state IN ('done', 'failed') "
                        "AND started_at IS NOT NULL AND ended_at >= ?", (codec.time_to_text(since),)):
        took = codec.time_from_text(row["ended_at"]) - codec.time_from_text(row["started_at"])
        seconds.setdefault(row["kind"], []).append(max(0.0, took.total_seconds()))
    outbox = {r["state"]: int(r["n"]) for r in db.query(
        "SELECT state, COUNT(*) AS n FROM outbox WHERE state != 'sent' GROUP BY state")}
    # The handover service stamps each reminder and escalation once (kv
    # handover.<id>.reminded / .escalated).
    stamps = {r["what"]: int(r["n"]) for r in db.query(
        "SELECT substr(key, length(rtrim(key, 'abcdefghijklmnopqrstuvwxyz')) + 1) AS what, COUNT(*) AS n FROM kv "
        "WHERE key LIKE 'handover.%.reminded' OR key LIKE 'handover.%.escalated' GROUP BY what")}
    oldest = db.query("SELECT MIN(created_at) AS at FROM requests WHERE state = 'pending'")
    windows = tuple(RunWindow(run=r["id"], pool=r["pool"], kind=r["kind"],
                              window_end=codec.optional_time_from_text(r["window_end"])) for r in db.query(
        "SELECT runs.id, requests.pool, requests.kind, requests.window_end FROM runs "
        "JOIN requests ON requests.id = runs.request_id WHERE runs.state IN ('pending', 'running', 'paused') "
        "ORDER BY runs.id"))
    halted = tuple(RunHalt(run=r["id"], pool=r["pool"], kind=r["kind"], at=codec.time_from_text(r["ended_at"]))
                   for r in db.query(
        "SELECT runs.id, requests.pool, requests.kind, runs.ended_at FROM runs "
        "JOIN requests ON requests.id = runs.request_id WHERE runs.state = 'failed' AND runs.ended_at >= ? "
        "ORDER BY runs.id", (codec.time_to_text(since),)))
    return Gauges(requests=requests, approvals_pending=requests_pending(requests), runs=runs, steps_running=running,
                  step_seconds=seconds, outbox=outbox, handovers_reminded=stamps.get("reminded", 0),
                  handovers_escalated=stamps.get("escalated", 0),
                  oldest_pending=codec.optional_time_from_text(oldest[0]["at"] if oldest else None),
                  windows=windows, halted=halted)


def requests_pending(requests: dict[tuple[str, str], int]) -> int:
    return sum(n for (_, state), n in requests.items() if state == "pending")
