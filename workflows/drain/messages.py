"""Every sentence a person reads about drain windows, capacity and drain requests.

Configuration errors (bad windows, budgets, selectors) are read by whoever runs gpuops;
refusals and plan notes by the requester and approvers. Each says what is wrong, with
the numbers, and what would work instead. Nothing here decides anything: `windows`,
`capacity` and `drain` choose which sentence applies. This module imports no other
gpuops module at run time, so all of them may use it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from workflows.kube.objects import PoolName
from workflows.pools.capacity import CapacityCheck
from workflows.pools.windows import WindowSet, windows_text
from workflows.wording import at_words, closest_hint, duration_text, local_time, names, plural

_LIST_AT_MOST = 6
_SEARCH_WEEKS = 4

# ------------------------------------------------------------------ small wording pieces


# ------------------------------------------------------------------ configuration


# ------------------------------------------------------------------ capacity


# ------------------------------------------------------------------ before a wave (the engine asks again)


# ------------------------------------------------------------------ reading a drain request


def nodes_left_pool(nodes: Sequence[str], *, pool: str) -> str:
    what = "is no longer a GPU node" if len(nodes) == 1 else "are no longer GPU nodes"
    return (f"{names(nodes)} {what} of pool {pool} in the inventory; ask again with the nodes as "
            "they are now.")


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


# ------------------------------------------------------------------ extending a running drain


def extend_outside_window(request_id: str, *, pool: str, windows: WindowSet, now: dt.datetime,
                          zone: dt.tzinfo) -> str:
    return (f"windows: it is now {local_time(now, zone)}, outside pool {pool}'s maintenance windows "
            f"({windows_text(windows)}), so {request_id} cannot be held any longer than its window end.")


def extend_past_window(request_id: str, *, end: dt.datetime, pool: str, window_end: dt.datetime,
                       current_end: dt.datetime, zone: dt.tzinfo) -> str:
    most = window_end - current_end
    more = (f" Ask for at most {duration_text(most)} more." if most > dt.timedelta(0)
            else " Its window end cannot move later.")
    return (f"windows: {request_id} cannot be held until {local_time(end, zone)}: pool {pool}'s "
            f"window ends at {local_time(window_end, zone)}." + more)


def extend_capacity_refused(request_id: str, *, end: dt.datetime, check: CapacityCheck, zone: dt.tzinfo) -> str:
    reasons = " ".join(r.reason for r in check.refusals)
    return f"{request_id} cannot hold its nodes until {local_time(end, zone)}: {reasons}"


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
    "halt": "halts the run with the node cordoned, for a person to decide",
    "wait": "halts the run with the node cordoned, for a person to decide",
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


def nothing_named_to_drain() -> str:
    return "Say which nodes or pool to drain."


def no_node_or_pool_named(name: str, *, closest: Sequence[str], pool: bool) -> str:
    what = "pool" if pool else "GPU node or pool"
    if closest:
        return f"There is no {what} named {name}{closest_hint(closest)}"
    return f"There is no {what} named {name}; /gpu status lists the pools and nodes."


def empty_pool(pool: str) -> str:
    return f"Pool {pool} has no GPU nodes right now, so there is nothing to drain."


def mixed_pools(by_pool: Mapping[PoolName, Sequence[str]]) -> str:
    parts = "; ".join(f"{names(nodes)} in {pool}" for pool, nodes in sorted(by_pool.items()))
    return (f"A drain covers one pool, but these nodes are in {len(by_pool)} pools: {parts}. "
            "Send one request per pool.")


def node_in_no_pool(nodes: Sequence[str]) -> str:
    return (f"{names(nodes)} {'is' if len(nodes) == 1 else 'are'} in no pool (no pool label), so "
            "no drain policy applies; label the node into a configured pool first.")


# --- when a pool was last drained: `/gpu status` and the shift handover say it one way

LAST_DRAINED = "last drained"


def drained_by(*, request_id: str, kind: str, outcome: str) -> str:
    """The request whose run last drained nodes of a pool: "req-7f3a2c (upgrade, done)"."""
    return f"{request_id} ({kind}, {outcome})"
