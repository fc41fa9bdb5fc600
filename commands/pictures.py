"""What a picture shows, as plain data: a run's timeline (one row per node, a bar per step,
its waves, its window's edges and its halt) and a pool's capacity over a day (GPUs
advertised and out, and the pool's floor). Commands and the notifier build these values;
bot/pictures.py draws them. Nothing here draws or reads a clock: the layout is what the
tests assert on.

The timeline comes from a run's stored steps alone, so every kind of change (a drain, an
upgrade, a MIG change, a move, a rollback, a kind added later) gets the same picture with
whatever steps it had."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from storage.capacity import CapacitySample
from storage.requests import Request
from storage.runs import Run
from storage.steps import Step
from workflows.fleet.summary import Fleet

CHART_SPAN = dt.timedelta(days=1)  # how far back `/gpu status <pool> --chart` looks
CHART_STEP = dt.timedelta(minutes=5)  # its resolution when read from Prometheus (as the leader samples)


@dataclass(frozen=True)
class TimelineBar:
    """One step of one node: from when it started to when it ended (or, for a step the
    run's end stopped, when the run ended)."""

    kind: str
    state: str
    start: dt.datetime
    end: dt.datetime

    @property
    def failed(self) -> bool:
        return self.state == "failed"


@dataclass(frozen=True)
class TimelineRow:
    node: str
    wave: int
    bars: tuple[TimelineBar, ...]


@dataclass(frozen=True)
class WaveSpan:
    """When a wave's first step started and its last step ended."""

    wave: int
    start: dt.datetime
    end: dt.datetime


@dataclass(frozen=True)
class RunTimeline:
    run_id: str
    request_id: str
    kind: str
    pool: str
    state: str
    rows: tuple[TimelineRow, ...]
    waves: tuple[WaveSpan, ...]
    window_start: dt.datetime | None
    window_end: dt.datetime | None
    halted_at: dt.datetime | None  # when a halted (failed) or aborted run ended; None otherwise

    @property
    def step_kinds(self) -> tuple[str, ...]:
        """Every step kind drawn, in the order first met (the legend's order)."""
        seen: dict[str, None] = {}
        for row in self.rows:
            for bar in row.bars:
                seen.setdefault(bar.kind, None)
        return tuple(seen)

    @property
    def file_name(self) -> str:
        return f"{self.run_id}-timeline.png"


def run_timeline(run: Run, steps: Sequence[Step], request: Request) -> RunTimeline:
    """The timeline of a finished run: a row per node, in wave order then plan order;
    a bar per step that started (steps never started, skipped or pending, have none)."""
    order: dict[str, tuple[int, int]] = {}
    for step in steps:
        key = (step.wave, step.seq)
        if step.node not in order or key < order[step.node]:
            order[step.node] = key
    rows: list[TimelineRow] = []
    spans: dict[int, tuple[dt.datetime, dt.datetime]] = {}
    for node in sorted(order, key=lambda n: (order[n], n)):
        bars: list[TimelineBar] = []
        for step in sorted((s for s in steps if s.node == node), key=lambda s: (s.wave, s.seq)):
            if step.started_at is None:
                continue
            end = step.ended_at or run.ended_at or step.started_at
            bars.append(TimelineBar(kind=step.kind, state=step.state, start=step.started_at,
                                    end=max(end, step.started_at)))
            first, last = spans.get(step.wave, (step.started_at, end))
            spans[step.wave] = (min(first, step.started_at), max(last, end))
        rows.append(TimelineRow(node=node, wave=order[node][0], bars=tuple(bars)))
    return RunTimeline(
        run_id=run.id, request_id=request.id, kind=request.kind, pool=request.pool, state=run.state,
        rows=tuple(rows), waves=tuple(WaveSpan(wave=w, start=s, end=e) for w, (s, e) in sorted(spans.items())),
        window_start=request.window_start, window_end=request.window_end,
        halted_at=run.ended_at if run.state in ("failed", "aborted") else None)


@dataclass(frozen=True)
class CapacityPoint:
    at: dt.datetime
    advertised: int  # GPUs the device plugin advertises in the pool
    out: int  # GPUs on cordoned nodes (by gpuops or by hand)


@dataclass(frozen=True)
class CapacityChart:
    pool: str
    since: dt.datetime
    until: dt.datetime
    points: tuple[CapacityPoint, ...]
    floor: int | None  # the pool's min_ready_gpus; None when it sets none
    source: str  # where the points came from, in words (commands.messages.chart_from_*)

    @property
    def file_name(self) -> str:
        return f"{self.pool}-capacity.png"


Picture = RunTimeline | CapacityChart


def capacity_now(fleet: Fleet, *, at: dt.datetime) -> list[CapacitySample]:
    """Each pool's GPUs advertised and out (physical GPUs on its cordoned nodes, whoever
    cordoned them) in `fleet` as seen at `at`: what the leader samples."""
    samples = []
    for pool in fleet.pools:
        out = sum(fleet.nodes[n].physical_gpus or 0 for n in pool.cordoned if n in fleet.nodes)
        samples.append(CapacitySample(pool=pool.name, at=at, advertised=pool.gpus_advertised, out=out))
    return samples


def capacity_chart(samples: Sequence[CapacitySample], *, pool: str, until: dt.datetime, floor: int | None,
                   source: str, span: dt.timedelta = CHART_SPAN) -> CapacityChart:
    """The pool's capacity over the `span` before `until` from its samples, oldest first."""
    since = until - span
    points = tuple(CapacityPoint(at=s.at, advertised=s.advertised, out=s.out)
                   for s in sorted(samples, key=lambda s: s.at) if s.pool == pool and since <= s.at <= until)
    return CapacityChart(pool=pool, since=since, until=until, points=points, floor=floor, source=source)
