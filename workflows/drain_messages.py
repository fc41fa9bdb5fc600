"""Every sentence a person reads about drain windows, capacity and drain requests.

Configuration errors (bad windows, budgets, selectors) are read by whoever runs gpuops;
refusals and plan notes by the requester and approvers. Each says what is wrong, with
the numbers, and what would work instead. Nothing here decides anything: `windows`,
`capacity` and `drain` choose which sentence applies. This module imports no other
gpuops module at run time, so all of them may use it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from workflows.capacity import CapacityCheck, ConcurrentWork
    from workflows.windows import MaintenanceWindow, WindowSet

_DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
USAGE = "/gpu drain <node...|pool> [at <time>|next-window] [for <duration>] [reason...]"
_LIST_AT_MOST = 6
_SEARCH_WEEKS = 4

# ------------------------------------------------------------------ small wording pieces


def names(items: Iterable[str], *, at_most: int = _LIST_AT_MOST) -> str:
    """"a", "a and b", "a, b and c", "a, b, c, … and 4 more"."""
    listed = list(items)
    if not listed:
        return "none"
    if len(listed) > at_most:
        shown = listed[:at_most - 1]
        return f"{', '.join(shown)} and {len(listed) - len(shown)} more"
    if len(listed) == 1:
        return listed[0]
    return f"{', '.join(listed[:-1])} and {listed[-1]}"


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    return f"{count} {noun if count == 1 else (plural_noun or noun + 's')}"


def duration_text(length: dt.timedelta) -> str:
    """timedelta(hours=1, minutes=30) -> "1h30m"; whole units only, seconds if any."""
    total = int(length.total_seconds())
    if total <= 0:
        return "0m"
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "",
             f"{minutes}m" if minutes else "", f"{seconds}s" if seconds else ""]
    return "".join(parts)


def zone_name(zone: dt.tzinfo) -> str:
    return getattr(zone, "key", None) or ("UTC" if zone.utcoffset(None) in (None, dt.timedelta(0)) else str(zone))


def local_time(at: dt.datetime, zone: dt.tzinfo) -> str:
    """"Sat 2026-12-05 02:00 CET": a time as the pool's people read it."""
    return at.astimezone(zone).strftime("%a %Y-%m-%d %H:%M %Z")


def at_words(at: dt.datetime, zone: dt.tzinfo) -> str:
    """The `at` clause that asks for exactly this time: "at 2026-12-05 02:00 Europe/Berlin"."""
    return f"at {at.astimezone(zone).strftime('%Y-%m-%d %H:%M')} {zone_name(zone)}"


def days_text(days: Iterable[int]) -> str:
    """{0,1,2,3,4} -> "mon-fri"; {5,6} -> "sat,sun"; every day -> "daily"."""
    chosen = sorted(set(days))
    if len(chosen) == 7:
        return "daily"
    runs: list[list[int]] = []
    for day in chosen:
        if runs and runs[-1][-1] == day - 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    return ",".join(f"{_DAY_NAMES[r[0]]}-{_DAY_NAMES[r[-1]]}" if len(r) >= 3
                    else ",".join(_DAY_NAMES[d] for d in r) for r in runs)


def window_text(window: MaintenanceWindow) -> str:
    """"sat,sun 02:00-06:00 Europe/Berlin"."""
    return (f"{days_text(window.days)} {window.start.strftime('%H:%M')}-"
            f"{window.end.strftime('%H:%M')} {window.zone.key}")


def windows_text(windows: WindowSet) -> str:
    if windows.always:
        return "any time"
    if not windows.windows:
        return "none configured"
    return "; ".join(window_text(w) for w in windows.windows)


def _closest(closest: Sequence[str]) -> str:
    return f"; did you mean {' or '.join(closest)}?" if closest else ""


# ------------------------------------------------------------------ configuration


def unknown_day(text: str, *, closest: Sequence[str]) -> str:
    return (f"{text!r} is not a day; write mon, tue, wed, thu, fri, sat or sun, a range like "
            f"mon-fri, or daily{_closest(closest)}")


def days_not_a_list(value: object) -> str:
    return f"days must be a list of day names like [sat, sun] or a range like mon-fri, not {value!r}"


def no_days() -> str:
    return "a window needs at least one day, e.g. days: [sat, sun]"


def clock_not_text(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        # YAML 1.1 reads unquoted 22:30 as 22 * 60 + 30; show the time it most likely was.
        meant = f"{value // 60:02d}:{value % 60:02d}" if 0 <= value <= 24 * 60 else "02:00"
        return (f"{value} is a number, not a time of day: quote the time, e.g. \"{meant}\" "
                f"(YAML reads an unquoted {meant} as the number {value})")
    return f"a time of day is written \"HH:MM\" on a 24-hour clock, e.g. \"02:00\", not {value!r}"


def bad_clock(value: object) -> str:
    return (f"{value!r} is not a time of day; write HH:MM on a 24-hour clock, e.g. \"02:00\" or "
            "\"22:30\" (\"24:00\" for midnight at the end of a window)")


def zone_missing() -> str:
    return "a window needs a timezone: an IANA name such as Europe/Berlin, America/New_York or UTC"


def unknown_zone(text: str, *, closest: Sequence[str]) -> str:
    if closest:
        return f"{text!r} is not an IANA time zone{_closest(closest)}"
    return f"{text!r} is not an IANA time zone; write a name such as Europe/Berlin, America/New_York or UTC"


def windows_word(value: object) -> str:
    return ("windows must be a list of windows, each {days, start, end, timezone}, or the word "
            f"always (drains at any time), not {value!r}")


def delete_not_allowed() -> str:
    return ("pdb_timeout_action: delete removes pods in spite of their PodDisruptionBudget; set "
            "allow_delete: true on this pool to allow that, or use wait or skip")


def bad_max_unavailable(value: object) -> str:
    return (f"max_unavailable must be a count of nodes (e.g. 2) or a percent of the pool's nodes "
            f"from 0% to 100% (e.g. \"25%\"), not {value!r}")


def empty_selector() -> str:
    return ("wait_for.selector is empty, which would wait for every pod; write a label selector "
            "such as \"gpuops.io/must-finish=true\"")


def bad_selector_part(part: str) -> str:
    return (f"cannot read {part.strip()!r} in the label selector; write key=value, key!=value, "
            "key in (a,b), key notin (a,b), key or !key, separated by commas")


# ------------------------------------------------------------------ capacity


def _held_by(concurrent: Sequence[ConcurrentWork], count: int) -> str:
    if not concurrent:
        return ""
    return f"; up to {count} held by overlapping {'request' if len(concurrent) == 1 else 'requests'} " + \
        names(w.label for w in concurrent)


def _already(already: Sequence[str]) -> str:
    if not already:
        return "none already cordoned or not Ready"
    return f"{len(already)} already cordoned or not Ready: {names(already)}"


def _what_fits(most_at_once: int, nodes: Sequence[str]) -> str:
    if most_at_once == 0:
        return ("None of these nodes can be out at this time" if len(nodes) > 1
                else "This node cannot be out at this time")
    return f"Drain at most {most_at_once} of these nodes at once"


def too_many_unavailable(*, pool: str, nodes: Sequence[str], pool_size: int, already: Sequence[str],
                         concurrent: Sequence[ConcurrentWork], concurrent_nodes: int,
                         most_at_once: int, unavailable: int, allowed: int,
                         max_unavailable: str) -> str:
    return (f"max_unavailable: draining {names(nodes)} would leave {unavailable} of "
            f"{plural(pool_size, 'node')} in pool {pool} unavailable ({_already(already)}"
            f"{_held_by(concurrent, concurrent_nodes)}), but the pool allows "
            f"{allowed} at once (max_unavailable {max_unavailable}). "
            f"{_what_fits(most_at_once, nodes)}.")


def below_gpu_floor(*, pool: str, nodes: Sequence[str], pool_size: int, already: Sequence[str],
                    concurrent: Sequence[ConcurrentWork], concurrent_nodes: int, most_at_once: int,
                    ready_now: int, ready_during: int, floor: int) -> str:
    held = (f" while {names(w.label for w in concurrent)} also "
            f"{'holds' if len(concurrent) == 1 else 'hold'} nodes") if concurrent else ""
    return (f"min_ready_gpus: draining {names(nodes)}{held} would leave {ready_during} Ready GPUs "
            f"in pool {pool} (of {ready_now} now), below its floor of {floor} (min_ready_gpus). "
            f"{_what_fits(most_at_once, nodes)}.")


# ------------------------------------------------------------------ before a wave (the engine asks again)


def _wave(wave: int) -> str:
    return f"Wave {wave + 1}"


def wave_window_over(wave: int, window_end: dt.datetime) -> str:
    return (f"{_wave(wave)} could not start before the window ended at "
            f"{window_end.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")


def wave_outside_windows(wave: int, pool: str) -> str:
    return f"{_wave(wave)} waits: pool {pool} allows no drain now (outside its windows)"


def wave_nodes_busy(wave: int, taken: Mapping[str, str]) -> str:
    held = ", ".join(f"{node} (in {run})" for node, run in sorted(taken.items()))
    return f"{_wave(wave)} waits: another unfinished run holds {held}"


def wave_does_not_fit(wave: int, reason: str) -> str:
    return (f"{_wave(wave)} waits (the pool changed since its plan was checked): {reason} "
            "It starts when it fits, or the run halts at the window's end")


def pool_gone(wave: int, pool: str) -> str:
    return f"{_wave(wave)} waits: {pool_not_configured(pool)}"


# ------------------------------------------------------------------ reading a drain request


def drain_needs_target() -> str:
    return f"Say which nodes or pool to drain: {USAGE}"


def unknown_target(name: str, *, closest: Sequence[str], pool: bool) -> str:
    what = "pool" if pool else "GPU node or pool"
    if closest:
        return f"There is no {what} named {name}{_closest(closest)}"
    return f"There is no {what} named {name}; /gpu status lists the pools and nodes."


def empty_pool(pool: str) -> str:
    return f"Pool {pool} has no GPU nodes right now, so there is nothing to drain."


def mixed_pools(by_pool: Mapping[str, Sequence[str]]) -> str:
    parts = "; ".join(f"{names(nodes)} in {pool}" for pool, nodes in sorted(by_pool.items()))
    return (f"A drain covers one pool, but these nodes are in {len(by_pool)} pools: {parts}. "
            "Send one request per pool.")


def node_in_no_pool(nodes: Sequence[str]) -> str:
    return (f"{names(nodes)} {'is' if len(nodes) == 1 else 'are'} in no pool (no pool label), so "
            "no drain policy applies; label the node into a configured pool first.")


def pool_not_configured(pool: str) -> str:
    return (f"Pool {pool} is not in the gpuops configuration, so it has no drain policy; add it "
            "under pools: with its windows to drain it.")


def nodes_left_pool(nodes: Sequence[str], *, pool: str) -> str:
    what = "is no longer a GPU node" if len(nodes) == 1 else "are no longer GPU nodes"
    return (f"{names(nodes)} {what} of pool {pool} in the inventory; ask again with the nodes as "
            "they are now.")


def repeated_clause(word: str) -> str:
    return f"Say `{word}` once: {USAGE}"


def bad_duration(text: str) -> str:
    got = f", not {text!r}" if text else ""
    return f"`for` needs how long the drain lasts, like 2h, 90m or 1h30m{got}."


def bad_time(text: str) -> str:
    got = f"Cannot read the time {text!r}" if text else "`at` needs a time"
    return (f"{got}; write at 2026-12-05 02:00, at sat 02:00, at tomorrow 03:00 or next-window, "
            "optionally followed by a zone such as Europe/Berlin.")


def time_in_past(start: dt.datetime, *, zone: dt.tzinfo, now: dt.datetime) -> str:
    return (f"{local_time(start, zone)} is in the past (it is now {local_time(now, zone)}); "
            "pick a later time, or next-window.")


# ------------------------------------------------------------------ policy refusals


def no_windows(pool: str) -> str:
    return (f"windows: pool {pool} has no maintenance windows configured, so gpuops allows no "
            "drain there. Add windows to the pool in the configuration, e.g. windows: [{days: "
            "[sat], start: \"02:00\", end: \"06:00\", timezone: Europe/Berlin}], or write "
            "windows: always to allow drains at any time.")


def no_window_long_enough(pool: str, *, duration: dt.timedelta, longest: dt.timedelta) -> str:
    return (f"windows: no window of pool {pool} in the next {_SEARCH_WEEKS} weeks is long enough "
            f"for a {duration_text(duration)} drain (the longest is {duration_text(longest)}); "
            "ask for less time with `for`.")


def _fit_hint(fits_at: dt.datetime | None, zone: dt.tzinfo) -> str:
    if fits_at is None:
        return (f" Nothing in the next {_SEARCH_WEEKS} weeks fits: drain fewer nodes, shorten it "
                "with `for`, or ask the pool's owners about its windows and limits.")
    return f" The first time it fits is {local_time(fits_at, zone)}: ask with `{at_words(fits_at, zone)}`."


def outside_window(start: dt.datetime, *, pool: str, windows: WindowSet, zone: dt.tzinfo,
                   fits_at: dt.datetime | None, duration: dt.timedelta | None) -> str:
    length = f" a {duration_text(duration)} drain" if duration else " the drain"
    return (f"windows: {local_time(start, zone)} is outside pool {pool}'s maintenance windows "
            f"({windows_text(windows)}), so{length} cannot start then."
            + _fit_hint(fits_at, zone))


def window_too_short(start: dt.datetime, end: dt.datetime, *, pool: str, window_end: dt.datetime,
                     zone: dt.tzinfo, fits_at: dt.datetime | None) -> str:
    return (f"windows: a drain from {local_time(start, zone)} to {local_time(end, zone)} would run "
            f"past the end of pool {pool}'s window at {local_time(window_end, zone)}."
            + _fit_hint(fits_at, zone))


def capacity_refused(check: CapacityCheck, *, zone: dt.tzinfo, fits_at: dt.datetime | None) -> str:
    reasons = " ".join(r.reason for r in check.refusals)
    if fits_at is not None and fits_at <= check.start:
        return reasons
    return reasons + _fit_hint(fits_at, zone)


# ------------------------------------------------------------------ plan notes


def note_waves(waves: int, *, largest: int, end: dt.datetime | None, zone: dt.tzinfo,
               at_most: dt.timedelta | None = None) -> str:
    until = (f"the window ends at {local_time(end, zone)}" if end is not None else None)
    if at_most is not None:
        until = f"{duration_text(at_most)} have passed (the pool's open_drain_max)"
    release = f"someone says `drain done` or {until}" if until else "someone says `drain done`"
    if waves == 1:
        return (f"One wave of {plural(largest, 'node')}: it stays drained until {release}, then is "
                "validated and uncordoned.")
    return (f"{waves} waves of at most {plural(largest, 'node')}, one after another: each stays "
            f"drained until {release}, and is validated and uncordoned before the next starts.")


def note_stays_cordoned(node: str) -> str:
    return f"{node} was already cordoned (not by gpuops) and stays cordoned after the drain."


_PDB_ACTIONS = {
    "wait": "waits for a person to act",
    "skip": "leaves the node out of the drain (uncordoned, its pods keep running)",
    "delete": "deletes the pods in spite of the PDB",
}


def note_pdb_may_block(pdb: str, *, allowed: int, needed: int, timeout: dt.timedelta,
                       action: str) -> str:
    return (f"PDB {pdb} allows {plural(allowed, 'disruption')} now but a wave evicts {needed} of "
            f"its pods: eviction retries for up to {duration_text(timeout)}, then "
            f"{_PDB_ACTIONS.get(action, action)}.")


def note_waits_for(count: int, *, selector: str, timeout: dt.timedelta) -> str:
    return (f"{plural(count, 'pod')} {'matches' if count == 1 else 'match'} wait_for ({selector}): "
            f"the drain waits up to {duration_text(timeout)} for them to finish before evicting.")
