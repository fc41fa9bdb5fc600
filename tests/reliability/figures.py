"""What the reliability suites share: how many cases a figure takes (a few in `make test`,
the issue's counts in `make reliability`), the seed, and writing a figure to
tests/reliability/results/<name>.json with the machine noted.

`make test` runs every suite here small, so a broken safety rule fails the suite; only
`make reliability` (GPUOPS_RELIABILITY_RESULTS set) writes figures, so the test suite
never changes the checked-in results."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from tests.bench.test_inventory_scale import _machine as bench_machine

RESULTS = Path(__file__).resolve().parent / "results"
FULL = os.environ.get("GPUOPS_RELIABILITY_FULL", "") not in ("", "0")
SEED = int(os.environ.get("GPUOPS_RELIABILITY_SEED", "20261204"))


def count(suite: int, full: int) -> int:
    """How many cases: `full` under `make reliability`, else `suite`."""
    return full if FULL else suite


def percentile(values: list[float], share: float) -> float:
    """The value at `share` (0.5: the median) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(share * len(ordered))) - 1))]


def machine() -> str:
    """The machine in one line, from what the benchmarks note."""
    m = bench_machine()
    return f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']:.0f} GiB, Python {m['python']}"


def record(name: str, figure: dict[str, Any]) -> None:
    """Print the figure; under `make reliability` also keep it, one entry per seed (the
    latest run of a seed replaces the earlier one)."""
    entry = {"seed": SEED, **figure, "machine": machine(),
             "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    print(f"\nreliability {name}: {json.dumps(entry, sort_keys=True)}")
    if not os.environ.get("GPUOPS_RELIABILITY_RESULTS"):
        return
    path = RESULTS / f"{name}.json"
    runs = json.loads(path.read_text()) if path.is_file() else []
    runs = [r for r in runs if r.get("seed") != SEED] + [entry]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(runs, indent=2, sort_keys=True) + "\n")
