"""Everything the tests and the demo need, built once: what is missing, about how long it
will take, and building it a few pieces at a time.

Each piece is its own cached build (`testenv.build`, `.operator`, `.helm`, `.toxiproxy`,
`.prometheus`), safe to run beside the others: Go's module and build caches take
concurrent builds, and each piece writes its own log and moves its binary into place
whole. Two at a time on two cores lets one piece download modules while another
compiles; more cores run more at once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from testenv import build, helm, operator, prometheus, toxiproxy

# The machine the figures below were measured on (empty Go module and build caches).
MEASURED_CORES = 2


@dataclass(frozen=True)
class Piece:
    """One cached build. `minutes`: how long it took alone on MEASURED_CORES cores with
    empty caches."""

    name: str
    minutes: float
    ready: Callable[[], bool]
    build: Callable[[], Path]


def pieces() -> tuple[Piece, ...]:
    """Every piece, longest first (so the longest starts at once)."""
    return (
        Piece("etcd, kwok, kube-apiserver, kube-controller-manager and kube-scheduler", 10.5,
              build.binaries_ready, build.ensure_binaries),
        Piece("helm (the chart's tests)", 4.0, lambda: helm.helm_path().is_file(), helm.helm_binary),
        Piece("the GPU Operator", 1.6, lambda: operator.operator_path().is_file(), operator.operator_binary),
        Piece("Toxiproxy (the API-faults suite)", 0.6, lambda: toxiproxy.toxiproxy_path().is_file(),
              toxiproxy.toxiproxy_binary),
        Piece("Prometheus and promtool (the metrics and alert tests; Debian's package)", 0.5,
              prometheus.ready, prometheus.prometheus_binary),
    )


def workers_for(cores: int) -> int:
    """How many pieces build at once: two on two cores (one downloads while one compiles),
    one more for every two cores beyond."""
    return max(2, cores // 2 + 1)


def estimate_minutes(missing: Sequence[Piece], *, cores: int) -> float:
    """About how long building `missing` takes on `cores` cores: the measured work shared
    by the cores (compiling is what takes the time, and every piece compiles on all
    cores), never less than the longest piece alone."""
    if not missing:
        return 0.0
    scale = MEASURED_CORES / max(cores, 1)
    total = sum(piece.minutes for piece in missing) * scale
    return max(total, max(piece.minutes for piece in missing) * scale)


def build_all(*, cores: int | None = None, out=sys.stderr) -> list[Piece]:
    """Build every missing piece; return those built. The first failure is raised once
    the others have finished (a failed piece leaves nothing half-built behind)."""
    cores = cores or os.cpu_count() or 1
    missing = [piece for piece in pieces() if not piece.ready()]
    if not missing:
        return []
    workers = min(workers_for(cores), len(missing))
    print(f"testenv: first build of {len(missing)} piece{'s' if len(missing) != 1 else ''}: "
          f"{'; '.join(piece.name for piece in missing)}", file=out, flush=True)
    print(f"testenv: about {estimate_minutes(missing, cores=cores):.0f} minutes on this machine's {cores} "
          f"core{'s' if cores != 1 else ''}, {workers} at a time (only once: later runs reuse the cache; "
          f"each piece says every {build.PROGRESS_EVERY:.0f}s how far it is)", file=out, flush=True)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="testenv-build") as pool:
        futures = [(piece, pool.submit(piece.build)) for piece in missing]
        errors = [future.exception() for _, future in futures]
    failed = [(piece, error) for (piece, _), error in zip(futures, errors, strict=True) if error is not None]
    if failed:
        for piece, error in failed[1:]:
            print(f"testenv: {piece.name} failed too: {error}", file=out, flush=True)
        raise failed[0][1]
    print(f"testenv: first build done in {(time.monotonic() - started) / 60:.1f} minutes", file=out, flush=True)
    return missing
