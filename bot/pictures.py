"""Draws the pictures of commands/pictures.py as PNG bytes, with matplotlib's Agg backend
(no display, no GUI toolkit).

matplotlib is imported on the first drawing, not when the bot starts: importing it (and
numpy under it) costs a noticeable part of a second, which a process that may never draw
should not pay at start-up. Drawing is serialised: pyplot's state is process-wide and
the notifier's thread and a command's thread may draw at once."""

from __future__ import annotations

import datetime as dt
import io
import threading
from typing import Any

from commands.pictures import CapacityChart, Picture, RunTimeline

_DRAWING = threading.Lock()
DPI = 100
# Colours by step kind, in the order kinds are first met; a failed bar is red with a cross hatch.
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#72B7B2", "#EECA3B", "#9D755D", "#BAB0AC",
           "#FF9DA6", "#79706E")
FAILED = "#D62728"
WINDOW_EDGE = "#444444"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def render_png(picture: Picture) -> bytes:
    """The picture as a PNG."""
    with _DRAWING:
        plt = _pyplot()
        if isinstance(picture, RunTimeline):
            figure = _timeline(plt, picture)
        else:
            figure = _capacity(plt, picture)
        try:
            out = io.BytesIO()
            figure.savefig(out, format="png", dpi=DPI, bbox_inches="tight")
            return out.getvalue()
        finally:
            plt.close(figure)


def _naive(at: dt.datetime) -> dt.datetime:
    """matplotlib's date axis reads UTC when given naive times."""
    return at.astimezone(dt.timezone.utc).replace(tzinfo=None) if at.tzinfo else at


def _timeline(plt: Any, timeline: RunTimeline) -> Any:
    import matplotlib.dates as mdates
    from matplotlib.patches import Patch

    rows = timeline.rows
    height = max(2.5, 0.45 * len(rows) + 1.6)
    figure, axes = plt.subplots(figsize=(10, height))
    colours = {kind: PALETTE[i % len(PALETTE)] for i, kind in enumerate(timeline.step_kinds)}
    for y, row in enumerate(rows):
        for bar in row.bars:
            start = mdates.date2num(_naive(bar.start))
            width = max(mdates.date2num(_naive(bar.end)) - start, 1 / 86400)  # at least a second
            axes.broken_barh([(start, width)], (y - 0.35, 0.7), facecolors=FAILED if bar.failed else colours[bar.kind],
                             edgecolor="black" if bar.failed else "none", hatch="xx" if bar.failed else None)
    for span in timeline.waves:
        axes.axvspan(_naive(span.start), _naive(span.end), color="#888888", alpha=0.08 if span.wave % 2 else 0.16)
        axes.text(_naive(span.start), len(rows) - 0.4, f"wave {span.wave + 1}", fontsize=8, va="bottom")
    for edge, label in ((timeline.window_start, "window start"), (timeline.window_end, "window end")):
        if edge is not None:
            axes.axvline(_naive(edge), color=WINDOW_EDGE, linestyle="--", linewidth=1)
            axes.text(_naive(edge), -0.9, label, fontsize=8, ha="center", va="top", color=WINDOW_EDGE)
    if timeline.halted_at is not None:
        axes.axvline(_naive(timeline.halted_at), color=FAILED, linewidth=2)
        axes.text(_naive(timeline.halted_at), len(rows) - 0.4, "halted", fontsize=9, color=FAILED, va="bottom",
                  ha="right")
    axes.set_yticks(range(len(rows)), [row.node for row in rows])
    axes.set_ylim(len(rows), -1.2)
    axes.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
    axes.set_xlabel("UTC")
    axes.set_title(f"{timeline.kind} of {timeline.pool}: {timeline.run_id} ({timeline.state})", fontsize=10)
    handles = [Patch(facecolor=c, label=k) for k, c in colours.items()]
    if any(bar.failed for row in rows for bar in row.bars):
        handles.append(Patch(facecolor=FAILED, hatch="xx", edgecolor="black", label="failed"))
    if handles:
        axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return figure


def _capacity(plt: Any, chart: CapacityChart) -> Any:
    import matplotlib.dates as mdates

    figure, axes = plt.subplots(figsize=(10, 3.5))
    times = [_naive(p.at) for p in chart.points]
    axes.step(times, [p.advertised for p in chart.points], where="post", label="GPUs advertised", color=PALETTE[0])
    axes.step(times, [p.out for p in chart.points], where="post", label="GPUs out (cordoned)", color=PALETTE[1])
    if chart.floor is not None:
        axes.axhline(chart.floor, color=FAILED, linestyle="--", linewidth=1, label="floor (min_ready_gpus)")
    axes.set_xlim(_naive(chart.since), _naive(chart.until))
    axes.set_ylim(bottom=0)
    axes.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
    axes.set_xlabel("UTC")
    axes.set_ylabel("GPUs")
    axes.set_title(f"{chart.pool}: capacity over the last day ({chart.source})", fontsize=10)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return figure
