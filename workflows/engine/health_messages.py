"""What a person reads about the service health a run holds between its waves (the pool's
`analysis` queries, workflows.engine.wave_gates): the watch starting after a wave, what
the next wave waits for, the queries held, and why one halted the run. Nothing here
decides anything."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from workflows.engine.phrases import span


def number(value: float) -> str:
    """A query's value as the thread shows it (enough digits to compare with its bound)."""
    return f"{value:.6g}"


def bound_words(*, max_value: float | None, min_value: float | None) -> str:
    return f"at most {number(max_value)}" if max_value is not None else f"at least {number(min_value or 0.0)}"


def watching(*, after: int, waves: int, checks: Sequence[tuple[str, str, dt.timedelta]], dry_run: bool) -> str:
    """`checks`: each query's name, its bound in words and its `for`."""
    listed = "; ".join(f"{name} {held} for {span(length)}" for name, held, length in checks)
    if dry_run:
        return (f"Wave {after} of {waves} done (dry run): a run would now hold service health before the next wave: "
                f"{listed}. The dry run does not wait.")
    return f"Wave {after} of {waves} done: service health must hold before the next wave starts: {listed}."


def waiting(*, after: int, left: dt.timedelta) -> str:
    """What the next wave waits for (the request view, App Home)."""
    return f"Waits for service health to hold after wave {after} ({span(left)} left)."


def held(*, after: int, values: Sequence[tuple[str, float]]) -> str:
    shown = ", ".join(f"{name} {number(value)}" for name, value in values)
    return f"Service health held after wave {after}: {shown}. The next wave starts."


def failed(*, after: int, name: str, query: str, value: float, max_value: float | None,
           min_value: float | None) -> str:
    side = f"above its max {number(max_value)}" if max_value is not None else f"below its min {number(min_value or 0.0)}"
    return f"Service health failed after wave {after}: {name} read {number(value)}, {side} (query `{query}`)"


def unread(*, after: int, name: str, query: str, reason: str) -> str:
    return (f"Service health could not be read after wave {after}, which counts as a failure: {name}: {reason} "
            f"(query `{query}`)")


def no_reader() -> str:
    return "no Prometheus is configured to read it (signals.prometheus)"
