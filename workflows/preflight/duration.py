"""Pre-flight: how long a run takes at its pool's pace, and whether that fits its window.

A run goes wave by wave (the engine starts a wave when the one before is done), and
within a wave its nodes in parallel, at most `engine.max_parallel_nodes` at once. So a
wave takes as long as its slowest node (times the rounds a wave larger than the engine's
parallel nodes needs), and the run the sum of its waves.

A node's time is the sum of its steps' expected times:
- a step kind the pool's last runs finished (`past_steps`, the last `LAST_RUNS` requests of
  the pool that ran): the median of that node's own times, else of the pool's;
- a `hold` (the canary's soak): the seconds the plan holds for;
- a `hold` until a time or until released (a drain's, `held_estimate`): not timed as a step;
  a wave takes its steps before it to go out and those after it to come back, and the hold
  lasts until its end (the drain's window, every wave to the same end) or until someone says
  `drain done` (for at most the pool's `open_drain_max`). So a drain fits when its one wave
  is out before the end: a second wave would start after the window ended, unless someone
  says `drain done` first;
- anything else: the step's own timeout from the plan (the pool's `drain_timeout`,
  `validate_timeout`, `mig_timeout`, the check pod's timeout, ...), an upper bound;
- a check running DCGM's diagnostics (`gpu-check` with `diag`) at least what its level
  takes (`DIAG_EXPECTED`: level 3 is half an hour a node), whatever a quicker check of
  the pool's past runs took;
- a step with neither (cordon, uncordon, a label written): no time.
Steps that run only when their wave fails (`on_failure`) are no part of the run's time.

The window: the engine starts no wave after the request's window has ended (it halts
before it), so the estimate says how many waves start inside it. A plan whose diagnostics
make it outgrow its window is refused (`refusing_note`: its note is critical, and a
request is not made of it): a level 3 check cut off by the window would leave nodes
cordoned half-checked. A plan that starts as
soon as it is approved (its summary carries no start: a dry run and its request must hash
alike, so nothing here reads the clock) says by when it must start to end in its window. Pure but for
`past_steps`, which reads the database; time is what the plan and the records say."""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from storage import codec
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import Database
from workflows.plans import NodeStep, Plan, PreflightNote
from workflows.pools.config import DIAG_EXPECTED
from workflows.preflight import check_messages as say
from workflows.preflight.facts import PastStep, PlanFacts

DURATION_CHECK = "duration"

# How many of the pool's last requests that ran set its pace.
LAST_RUNS = 5
# Requests are read newest first, this many at most, to find those LAST_RUNS.
_READ_AT_MOST = 50
_RAN: tuple[stored_requests.RequestState, ...] = ("done", "failed")
_HOLD = "hold"
_CHECK = "gpu-check"
# The codes of this check that refuse a plan rather than warn about it.
DIAG_OUTGROWS = "diag-outgrows-window"
REFUSING = frozenset({DIAG_OUTGROWS})
# Params that bound a step's time, in the order they are read.
_TIMEOUT_KEYS = ("timeout_s", "timeout_seconds", "pdb_timeout_s")

PaceSource = Literal["runs", "timeouts", "mixed"]


@dataclass(frozen=True, slots=True)
class RunEstimate:
    """How long a plan's run takes and where its waves start, against its window."""

    total: dt.timedelta
    waves: tuple[dt.timedelta, ...]
    slowest: str
    slowest_takes: dt.timedelta
    source: PaceSource
    # Step kinds timed by their timeouts because no past run of the pool finished one.
    unseen: tuple[str, ...]
    # The window's length (None: no end, or no start) and how many waves start inside it.
    window: dt.timedelta | None
    waves_started: int
    # When the window ends (None: no end).
    window_end: dt.datetime | None = None
    # The service-health watch after each wave but the last (the pool's longest `analysis`
    # `for`; zero without analysis), counted in `total`.
    between: dt.timedelta = dt.timedelta(0)

    @property
    def fits(self) -> bool:
        return self.window is None or self.total <= self.window


def past_steps(db: Database, *, pool: str, cluster: str | None = None, runs: int = LAST_RUNS) -> list[PastStep]:
    """The steps the pool's last `runs` requests that ran (not dry runs) finished `done`."""
    found: list[PastStep] = []
    counted = 0
    requests = stored_requests.in_states(db, states=_RAN, pool=pool, limit=_READ_AT_MOST,
                                         cluster=None if cluster is None else (cluster,))
    for request in requests:
        ran = [r for r in stored_runs.for_request(db, request_id=request.id) if not r.dry_run and r.finished]
        if not ran:
            continue
        for run in ran:
            for step in stored_steps.for_run(db, run_id=run.id):
                if step.state == "done" and step.started_at is not None and step.ended_at is not None:
                    found.append(PastStep(node=step.node, kind=step.kind, took=step.ended_at - step.started_at))
        counted += 1
        if counted >= runs:
            break
    return found


def _timeout(step: NodeStep) -> dt.timedelta | None:
    if step.kind == _HOLD and isinstance(step.params.get("seconds"), (int, float)):
        return dt.timedelta(seconds=step.params["seconds"])
    for key in _TIMEOUT_KEYS:
        value = step.params.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return dt.timedelta(seconds=value)
    return None


def _diag_least(step: NodeStep) -> dt.timedelta:
    """What a diagnostics check takes at the least at its level; zero for any other step."""
    level = step.params.get("diag") if step.kind == _CHECK else None
    return DIAG_EXPECTED.get(level, dt.timedelta(0)) if isinstance(level, int) else dt.timedelta(0)


def has_diag(plan: Plan) -> bool:
    return any(step.kind == _CHECK and step.params.get("diag") is not None for wave in plan.waves
               for step in wave.steps)


def refusing_note(plan: Plan) -> PreflightNote | None:
    """The pre-flight note that refuses `plan` (its diagnostics outgrow its window), if any."""
    return next((n for n in plan.summary.preflight if n.check == DURATION_CHECK and n.code in REFUSING), None)


def _median(times: Sequence[dt.timedelta]) -> dt.timedelta:
    return dt.timedelta(seconds=statistics.median(t.total_seconds() for t in times))


class _Pace:
    """What each step is expected to take at the pace of `past` (see the module docstring),
    noting which step kinds it learned from past runs and which it timed by their timeouts."""

    def __init__(self, past: Sequence[PastStep]) -> None:
        self.by_node: dict[tuple[str, str], list[dt.timedelta]] = {}
        self.by_kind: dict[str, list[dt.timedelta]] = {}
        for seen in past:
            self.by_node.setdefault((seen.node, seen.kind), []).append(seen.took)
            self.by_kind.setdefault(seen.kind, []).append(seen.took)
        self.learned: set[str] = set()
        self.unseen: set[str] = set()

    def expected(self, step: NodeStep) -> dt.timedelta:
        if step.kind == _HOLD:
            return _timeout(step) or dt.timedelta(0)
        times = self.by_node.get((step.node, step.kind)) or self.by_kind.get(step.kind)
        least = _diag_least(step)
        if times:
            self.learned.add(step.kind)
            return max(_median(times), least)
        bound = _timeout(step)
        if bound is None:
            return least
        self.unseen.add(step.kind)
        return max(bound, least)

    def of(self, steps: Sequence[NodeStep]) -> dt.timedelta:
        """The steps' expected time, those that run only when their wave fails left out."""
        return sum((self.expected(s) for s in steps if s.params.get("on_failure") is not True), dt.timedelta(0))

    @property
    def source(self) -> PaceSource:
        return "timeouts" if not self.learned else "mixed" if self.unseen else "runs"


def estimate(plan: Plan, past: Sequence[PastStep], *, parallel: int | None = None,
             between: dt.timedelta = dt.timedelta(0)) -> RunEstimate:
    """The time `plan`'s run takes at the pace of `past` (see the module docstring), with
    at most `parallel` nodes of a wave under way at once (None: all of them) and `between`
    waves the service-health watch (workflows.engine.wave_gates) before the next starts."""
    pace = _Pace(past)
    waves: list[dt.timedelta] = []
    slowest, slowest_takes = "", dt.timedelta(-1)
    for wave in plan.waves:
        nodes: dict[str, dt.timedelta] = {}
        for node in wave.nodes:
            nodes[node] = pace.of(wave.steps_for(node))
            if nodes[node] > slowest_takes:
                slowest, slowest_takes = node, nodes[node]
        rounds = math.ceil(len(wave.nodes) / parallel) if parallel and wave.nodes else 1
        waves.append(max(nodes.values(), default=dt.timedelta(0)) * rounds)
    window = (plan.summary.window_end - plan.summary.window_start
              if plan.summary.window_start is not None and plan.summary.window_end is not None else None)
    started, offset = 0, dt.timedelta(0)
    for took in waves:
        if window is not None and offset >= window:
            break
        started += 1
        offset += took + between
    watched = between * max(len(waves) - 1, 0)
    return RunEstimate(total=sum(waves, dt.timedelta(0)) + watched, waves=tuple(waves), slowest=slowest,
                       slowest_takes=max(slowest_takes, dt.timedelta(0)), source=pace.source,
                       unseen=tuple(sorted(pace.unseen)),
                       window=window, waves_started=started, window_end=plan.summary.window_end,
                       between=between if watched else dt.timedelta(0))


@dataclass(frozen=True, slots=True)
class HeldEstimate:
    """A run whose waves hold their nodes until a time or until someone releases them (a
    drain): how long the slowest node of a wave takes to go out (its steps before the hold)
    and to come back (after it), and how long the hold lasts."""

    out: dt.timedelta
    back: dt.timedelta
    waves: int
    slowest: str
    source: PaceSource
    unseen: tuple[str, ...]
    # When the hold ends (None: when someone says `drain done`), and at most how long an
    # open-ended hold lasts (the pool's open_drain_max).
    until: dt.datetime | None
    at_most: dt.timedelta | None
    # When the run starts (None: as soon as it is approved).
    start: dt.datetime | None

    @property
    def drained_by(self) -> dt.datetime | None:
        return None if self.start is None else self.start + self.out

    @property
    def fits(self) -> bool:
        """Every wave runs inside the window and its nodes are out before the hold ends."""
        if self.until is None:
            return True
        return self.waves == 1 and (self.drained_by is None or self.drained_by <= self.until)


@dataclass(frozen=True, slots=True)
class _Held:
    until: dt.datetime | None
    at_most: dt.timedelta | None


def _held(step: NodeStep) -> _Held | None:
    """When a hold ends that holds until a time (None: until released), not for seconds."""
    if step.kind != _HOLD or "until" not in step.params:
        return None
    until, at_most = step.params.get("until"), step.params.get("at_most_s")
    return _Held(until=codec.time_from_text(until) if isinstance(until, str) and until else None,
                 at_most=dt.timedelta(seconds=at_most) if isinstance(at_most, (int, float)) and at_most else None)


def held_estimate(plan: Plan, past: Sequence[PastStep]) -> HeldEstimate | None:
    """The time around the hold of a plan whose waves hold their nodes until a time or until
    released (a drain), at the pace of `past`; None for a plan with no such hold."""
    holds = [held for wave in plan.waves for step in wave.steps if (held := _held(step)) is not None]
    if not holds:
        return None
    pace = _Pace(past)
    out, back, slowest, slowest_takes = dt.timedelta(0), dt.timedelta(0), "", dt.timedelta(-1)
    for wave in plan.waves:
        for node in wave.nodes:
            steps = list(wave.steps_for(node))
            at = next((i for i, s in enumerate(steps) if _held(s) is not None), len(steps))
            before, after = pace.of(steps[:at]), pace.of(steps[at + 1:])
            if before + after > slowest_takes:
                slowest, slowest_takes = node, before + after
            out, back = max(out, before), max(back, after)
    first = holds[0]
    return HeldEstimate(out=out, back=back, waves=len(plan.waves), slowest=slowest, source=pace.source,
                        unseen=tuple(sorted(pace.unseen)), until=first.until, at_most=first.at_most,
                        start=plan.summary.window_start)


def held_note(plan: Plan, found: HeldEstimate) -> str:
    """One sentence: how long a held run takes to take its nodes out and bring them back,
    how long it holds them, and whether its waves fit the window."""
    takes = say.held_run_takes(plan.pool, out=found.out, back=found.back, waves=found.waves, slowest=found.slowest,
                               source=found.source, unseen=found.unseen)
    if found.until is None:
        return f"{takes}; {say.held_until_done(at_most=found.at_most, waves=found.waves)}"
    if found.waves > 1:
        return f"{takes}; {say.held_waves_past_window(until=found.until, waves=found.waves)}"
    if found.drained_by is None:
        return f"{takes}; {say.held_starts_once_approved(until=found.until, latest=found.until - found.out)}"
    if found.drained_by > found.until:
        return f"{takes}; {say.held_outgrows_drain(until=found.until, drained_by=found.drained_by)}"
    return f"{takes}; {say.held_fits(until=found.until, drained_by=found.drained_by)}"


def duration_note(plan: Plan, found: RunEstimate) -> str:
    """One sentence: how long the run takes, at which pace, and whether it fits."""
    takes = say.run_takes(plan.pool, total=found.total, waves=len(found.waves), slowest=found.slowest,
                          slowest_takes=found.slowest_takes, source=found.source, unseen=found.unseen)
    if found.between:
        takes += f" {say.run_watches_between(found.between, waits=len(found.waves) - 1)}"
    if found.window_end is None:
        return f"{takes}; {say.run_no_window_end()}"
    if found.window is None:
        return f"{takes}; {say.run_starts_once_approved(end=found.window_end, latest=found.window_end - found.total)}"
    if found.fits:
        return f"{takes}; {say.run_fits_window(window=found.window, spare=found.window - found.total)}"
    return f"{takes}; {say.run_outgrows_window(window=found.window, started=found.waves_started, waves=len(found.waves))}"


def duration_notes(plan: Plan, facts: PlanFacts) -> tuple[PreflightNote, ...]:
    """The pre-flight check: the run's time at the pool's pace (`facts.past`, the steps of
    its last runs) against its window; a warning when it does not fit."""
    if not plan.waves:
        return ()
    holding = held_estimate(plan, facts.past)
    if holding is not None:
        code = ("held-until-done" if holding.until is None else "outgrows-window" if not holding.fits
                else "starts-once-approved" if holding.start is None else "fits-window")
        return (PreflightNote(check=DURATION_CHECK, code=code, severity="info" if holding.fits else "warning",
                              sentence=held_note(plan, holding)),)
    analysis = facts.policy.analysis if facts.policy is not None else ()
    between = max((q.for_ for q in analysis), default=dt.timedelta(0))
    found = estimate(plan, facts.past, parallel=facts.parallel, between=between)
    code = ("no-window-end" if found.window_end is None else "starts-once-approved" if found.window is None
            else "fits-window" if found.fits else "outgrows-window")
    if code == "outgrows-window" and has_diag(plan):
        return (PreflightNote(check=DURATION_CHECK, code=DIAG_OUTGROWS, severity="critical",
                              sentence=f"{duration_note(plan, found)}; {say.diag_outgrows_window()}"),)
    return (PreflightNote(check=DURATION_CHECK, code=code, severity="info" if found.fits else "warning",
                          sentence=duration_note(plan, found)),)
