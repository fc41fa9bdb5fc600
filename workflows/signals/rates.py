"""How fast a counter grows, from readings of its total taken when commands ask (read
straight from the exporters, with no Prometheus to remember the past for gpuops).

The memory keeps, per node, GPU and counter, the reading a rate is measured from (the
baseline) and the last rate it gave. A first reading gives no rate: not known yet, which
is not the same as zero. A reading less than `min_span` after the baseline reuses the last
rate (if any) and keeps the baseline, so two commands a second apart never turn one
replay into thousands an hour. A total below the baseline means the counter restarted
(the driver reloaded: DCGM's volatile counters start again at 0): its increase is the new
total, as Prometheus counts it. Time is an argument; the memory is safe across threads."""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass

from workflows.signals.health import Rate

# (node, the GPU's key on it, the counter's series name)
CounterKey = tuple[str, str, str]

MIN_SPAN = dt.timedelta(minutes=5)
_HOUR = dt.timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class _Baseline:
    at: dt.datetime
    total: int
    last_rate: Rate | None


class CounterMemory:
    def __init__(self, *, min_span: dt.timedelta = MIN_SPAN) -> None:
        self.min_span = min_span
        self._lock = threading.Lock()
        self._baselines: dict[CounterKey, _Baseline] = {}

    def observe(self, key: CounterKey, total: int, *, at: dt.datetime) -> Rate | None:
        """The counter's rate at `at`, given its `total` then (None: not known yet)."""
        with self._lock:
            before = self._baselines.get(key)
            if before is None or at < before.at:
                # First reading (or the clock went back): this one is the baseline.
                self._baselines[key] = _Baseline(at=at, total=total, last_rate=None)
                return None
            span = at - before.at
            if span < self.min_span:
                return before.last_rate
            increase = total - before.total if total >= before.total else total
            rate = Rate(per_hour=increase * (_HOUR / span), over=span)
            self._baselines[key] = _Baseline(at=at, total=total, last_rate=rate)
            return rate
