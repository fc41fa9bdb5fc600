"""The pictures gpuops posts: a finished run's timeline (rows, bars, waves, the window's
edges, the halt) as the data handed to the renderer, and that the renderer makes a PNG of a
sane size from it and from a pool's capacity chart."""

from __future__ import annotations

import datetime as dt
import struct

from freezegun import freeze_time

from bot.pictures import render_png
from commands.pictures import CapacityChart, CapacityPoint, capacity_chart, run_timeline
from storage.capacity import KEEP, CapacitySample, of_pool, record_samples
from storage.database import open_database
from storage.ids import RequestId, RunId, StepId
from storage.requests import Request
from storage.runs import Run
from storage.steps import Step

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 12, 5, 22, 0, tzinfo=UTC)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def request(kind: str = "upgrade") -> Request:
    return Request(id=RequestId("req-7"), kind=kind, pool="training-a", targets=[], window_start=at(-5),  # type: ignore[arg-type]
                   window_end=at(60), reason="driver", requester="U1", requester_name="ana", state="done",
                   plan={}, plan_hash="h", approvals_required=1, expires_at=at(600), created_at=at(-60),
                   updated_at=at(60), channel="C0OPS", thread_ts="1.0")


def run(state: str, ended: float) -> Run:
    return Run(id=RunId("run-9"), request_id=RequestId("req-7"), state=state, dry_run=False,  # type: ignore[arg-type]
               current_wave=None, created_at=at(-1), started_at=at(0), ended_at=at(ended), halted_reason=None)


_ids = iter(range(1, 10_000))


def step(node: str, wave: int, seq: int, kind: str, state: str, start: float | None, end: float | None) -> Step:
    return Step(id=StepId(next(_ids)), run_id=RunId("run-9"), wave=wave, node=node, seq=seq, kind=kind,  # type: ignore[arg-type]
                state=state, attempt=1, started_at=None if start is None else at(start),  # type: ignore[arg-type]
                ended_at=None if end is None else at(end), detail={}, error=None)


def finished_upgrade() -> list[Step]:
    """Two waves: gpu-b alone, then gpu-a and gpu-c together."""
    steps = []
    for node, wave, base in (("gpu-b", 0, 0), ("gpu-a", 1, 20), ("gpu-c", 1, 21)):
        for seq, kind in enumerate(("cordon", "evict", "driver", "validate", "uncordon")):
            steps.append(step(node, wave, seq, kind, "done", base + 3 * seq, base + 3 * seq + 2))
    return steps


def test_a_finished_run_has_a_row_per_node_in_wave_order_and_a_bar_per_step() -> None:
    timeline = run_timeline(run("succeeded", 40), finished_upgrade(), request())

    assert [(r.node, r.wave) for r in timeline.rows] == [("gpu-b", 0), ("gpu-a", 1), ("gpu-c", 1)]
    assert [b.kind for b in timeline.rows[0].bars] == ["cordon", "evict", "driver", "validate", "uncordon"]
    assert (timeline.rows[1].bars[2].start, timeline.rows[1].bars[2].end) == (at(26), at(28))
    assert timeline.step_kinds == ("cordon", "evict", "driver", "validate", "uncordon")
    assert not any(b.failed for r in timeline.rows for b in r.bars)


def test_the_waves_span_from_their_first_step_to_their_last() -> None:
    timeline = run_timeline(run("succeeded", 40), finished_upgrade(), request())

    assert [(w.wave, w.start, w.end) for w in timeline.waves] == [(0, at(0), at(14)), (1, at(20), at(35))]


def test_the_window_edges_come_from_the_request_and_a_run_that_succeeded_has_no_halt() -> None:
    timeline = run_timeline(run("succeeded", 40), finished_upgrade(), request())

    assert (timeline.window_start, timeline.window_end) == (at(-5), at(60))
    assert timeline.halted_at is None


def test_a_halted_run_marks_the_failed_step_and_the_halt_and_draws_no_step_it_never_began() -> None:
    steps = [
        step("gpu-b", 0, 0, "cordon", "done", 0, 1),
        step("gpu-b", 0, 1, "evict", "done", 1, 4),
        step("gpu-b", 0, 2, "driver", "done", 4, 9),
        step("gpu-b", 0, 3, "check", "failed", 9, 12),
        step("gpu-b", 0, 4, "uncordon", "skipped", None, 13),
        step("gpu-a", 1, 0, "cordon", "skipped", None, 13),
    ]
    timeline = run_timeline(run("failed", 13), steps, request("mig"))

    assert [r.node for r in timeline.rows] == ["gpu-b", "gpu-a"]
    assert [(b.kind, b.failed) for b in timeline.rows[0].bars] == [
        ("cordon", False), ("evict", False), ("driver", False), ("check", True)]
    assert timeline.rows[1].bars == ()
    assert timeline.halted_at == at(13)
    assert [w.wave for w in timeline.waves] == [0]


def test_a_step_without_an_end_ends_where_the_run_ended() -> None:
    steps = [step("gpu-b", 0, 0, "evict", "failed", 2, None)]
    timeline = run_timeline(run("aborted", 30), steps, request("drain"))

    assert (timeline.rows[0].bars[0].start, timeline.rows[0].bars[0].end) == (at(2), at(30))
    assert timeline.halted_at == at(30)


def test_any_kind_of_step_is_drawn_with_its_own_colour_key() -> None:
    steps = [step("gpu-b", 0, 0, "label", "done", 0, 1), step("gpu-b", 0, 1, "mig-layout", "done", 1, 5)]
    timeline = run_timeline(run("succeeded", 6), steps, request("node_label"))

    assert timeline.step_kinds == ("label", "mig-layout")


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_a_timeline_renders_as_a_png_of_sane_size_growing_with_its_rows() -> None:
    small = png_size(render_png(run_timeline(run("succeeded", 40), finished_upgrade()[:5], request())))
    three = render_png(run_timeline(run("failed", 40), finished_upgrade(), request()))
    width, height = png_size(three)

    assert 600 <= width <= 2000 and 200 <= height <= 1500
    assert height > small[1]
    assert len(three) < 500_000


def test_a_capacity_chart_renders_as_a_png_of_sane_size() -> None:
    points = tuple(CapacityPoint(at=at(m), advertised=64 - (8 if 300 <= m < 420 else 0),
                                 out=8 if 300 <= m < 420 else 0) for m in range(-1440, 1, 15))
    chart = CapacityChart(pool="training-a", since=at(-1440), until=at(0), points=points, floor=48,
                          source="samples")
    width, height = png_size(render_png(chart))

    assert 600 <= width <= 2000 and 200 <= height <= 800


# ------------------------------------------------------------------ a pool's capacity


def test_a_capacity_chart_keeps_the_last_day_of_its_pools_samples_oldest_first() -> None:
    samples = [CapacitySample(pool="training-a", at=at(-10), advertised=56, out=8),
               CapacitySample(pool="training-a", at=at(-1500), advertised=64, out=0),  # over a day ago
               CapacitySample(pool="serving-a", at=at(-20), advertised=16, out=0),
               CapacitySample(pool="training-a", at=at(-30), advertised=64, out=0)]

    chart = capacity_chart(samples, pool="training-a", until=at(0), floor=48, source="samples")

    assert [(p.at, p.advertised, p.out) for p in chart.points] == [(at(-30), 64, 0), (at(-10), 56, 8)]
    assert (chart.since, chart.until, chart.floor) == (at(-1440), at(0), 48)


def test_the_samples_table_forgets_what_is_older_than_it_keeps(tmp_path) -> None:
    with open_database(tmp_path / "gpuops.db") as db, freeze_time(at(0)) as frozen:
        for _ in range(12 * 30):  # thirty hours of samples every five minutes
            now = dt.datetime.now(UTC)
            record_samples(db, [CapacitySample(pool="training-a", at=now, advertised=64, out=0)], cluster="", at=now)
            frozen.tick(dt.timedelta(minutes=5))
        kept = of_pool(db, cluster="", pool="training-a", since=at(-60))

    assert len(kept) == KEEP // dt.timedelta(minutes=5) + 1
    assert kept[0].at == kept[-1].at - KEEP
