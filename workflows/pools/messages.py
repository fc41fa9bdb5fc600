"""Every sentence a person reads about a pool's policy: its windows, capacity rules and
selectors as configured (read by whoever runs gpuops), and the capacity checks a drain
or a wave must pass (read by the requester, the approvers and the run's thread). Each
says what is wrong, with the numbers, and what would work instead. Nothing here decides
anything."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from workflows.wording import closest_hint, local_time, names, plural, quoted, when


def unknown_day(text: str, *, closest: Sequence[str]) -> str:
    return (f"{text!r} is not a day; write mon, tue, wed, thu, fri, sat or sun, a range like "
            f"mon-fri, or daily{closest_hint(closest)}")


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
        return f"{text!r} is not an IANA time zone{closest_hint(closest)}"
    return f"{text!r} is not an IANA time zone; write a name such as Europe/Berlin, America/New_York or UTC"


def workload_namespace(value: str) -> str:
    return f"workloads namespaces must be namespace names (lower-case letters, digits, '-'), not {value!r}"


def check_namespace(value: str) -> str:
    return f"gpu_check.namespace must be a namespace name (lower-case letters, digits, '-'), not {value!r}"


def check_image(value: str) -> str:
    return f"gpu_check.image must be an image reference without spaces (e.g. nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04), not {value!r}"


def check_command() -> str:
    return "gpu_check.command must name a program to run, as a list (e.g. [nvidia-smi])"


def check_resource(value: str) -> str:
    return ("gpu_check.resource must be a GPU resource the device plugin advertises (nvidia.com/gpu, "
            f"nvidia.com/gpu.shared or nvidia.com/mig-<profile>), not {value!r}")


def check_diag_and_command() -> str:
    return ("gpu_check.diag runs DCGM's own command (dcgmi diag); remove gpu_check.command, or remove diag "
            "to run your command")


def check_count(value: object) -> str:
    return f"gpu_check.count must be a number of at least 1 or `all`, not {value!r}"


def check_timeout(value: object) -> str:
    return f"gpu_check.timeout must be at least 10s (a pod needs time to start), not {value}"


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


def unknown_change_kind(name: str, *, known: Sequence[str]) -> str:
    return f"{name!r} is no kind of change; use one of {', '.join(known)}"


def pool_name_reserved(name: str) -> str:
    return f"{quoted(name)} is reserved for GPU nodes that match no pool"


def pool_name_has_slash(name: str) -> str:
    return f"pool name {quoted(name)} has a '/', which separates a cluster from a pool"


def pool_name_not_a_label_value(name: str) -> str:
    # A node's pool is the value of its pool label: a name no label value can be names a
    # pool no node is ever in.
    return (f"pool name {quoted(name)} could never have a node: a node's pool is the value of its node label "
            "(cluster.pool_label), and a label value is at most 63 letters, digits, '-', '_' and '.', "
            "beginning and ending with a letter or digit")


def _held_by(concurrent: Sequence[str], count: int) -> str:
    if not concurrent:
        return ""
    return f"; up to {count} held by overlapping {'request' if len(concurrent) == 1 else 'requests'} " + \
        names(concurrent)


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
                         concurrent: Sequence[str], concurrent_nodes: int,
                         most_at_once: int, unavailable: int, allowed: int,
                         max_unavailable: str) -> str:
    return (f"max_unavailable: draining {names(nodes)} would leave {unavailable} of "
            f"{plural(pool_size, 'node')} in pool {pool} unavailable ({_already(already)}"
            f"{_held_by(concurrent, concurrent_nodes)}), but the pool allows "
            f"{allowed} at once (max_unavailable {max_unavailable}). "
            f"{_what_fits(most_at_once, nodes)}.")


def below_gpu_floor(*, pool: str, nodes: Sequence[str], pool_size: int, already: Sequence[str],
                    concurrent: Sequence[str], concurrent_nodes: int, most_at_once: int,
                    ready_now: int, ready_during: int, floor: int) -> str:
    held = (f" while {names(concurrent)} also "
            f"{'holds' if len(concurrent) == 1 else 'hold'} nodes") if concurrent else ""
    return (f"min_ready_gpus: draining {names(nodes)}{held} would leave {ready_during} Ready GPUs "
            f"in pool {pool} (of {ready_now} now), below its floor of {floor} (min_ready_gpus). "
            f"{_what_fits(most_at_once, nodes)}.")


def _wave(wave: int) -> str:
    return f"Wave {wave + 1}"


def wave_window_over(wave: int, window_end: dt.datetime, *, zone: dt.tzinfo) -> str:
    return f"{_wave(wave)} could not start before the window ended at {when(window_end, zone)}"


def wave_outside_windows(wave: int, pool: str) -> str:
    return f"{_wave(wave)} waits: pool {pool} allows no drain now (outside its windows)"


def wave_nodes_busy(wave: int, taken: Mapping[str, str]) -> str:
    held = ", ".join(f"{node} (in {run})" for node, run in sorted(taken.items()))
    return f"{_wave(wave)} waits: another unfinished run holds {held}"


def wave_does_not_fit(wave: int, reason: str) -> str:
    return (f"{_wave(wave)} waits (the pool changed since its plan was checked): {reason} "
            "It starts when it fits, or the run halts at the window's end")


def pool_gone(wave: int, pool: str) -> str:
    return f"{_wave(wave)} waits: {no_drain_policy(pool)}"


def no_policy_for(pool: str, *, rule: str) -> str:
    """A change refused in a pool without policy; `rule` says what the kind does only in
    configured pools."""
    return f"pool {pool} has no policy in the configuration (pools.{pool}): {rule}"


def nothing_to_roll_back(run: str, *, changed: str) -> str:
    """A rollback of a run that changed nothing; `changed` is what a run of its kind changes."""
    return f"run {run} changed no {changed}: there is nothing to roll back"


def no_drain_policy(pool: str) -> str:
    return (f"Pool {pool} is not in the gpuops configuration, so it has no drain policy; add it "
            "under pools: with its windows to drain it.")


def canary_not_in_scope(canary: str, nodes: Sequence[str], what: str) -> str:
    return f"the pool's canary node {canary} is not among the nodes this {what} changes ({names(nodes)})"


def node_below_gpu_floor(node: str, ready: int, gpus: int, floor: int) -> str:
    return (f"taking {node} out ({gpus} Ready GPUs) would leave the pool {ready - gpus} of its {ready} Ready GPUs, "
            f"below its min_ready_gpus of {floor}: lower the floor or add capacity first")


def start_in_the_past(at: dt.datetime, now: dt.datetime, zone: dt.tzinfo) -> str:
    return (f"{local_time(at, zone)} is in the past (now {local_time(now, zone)}): name a time ahead, or leave "
            "`at` out to start now")


def start_outside_windows(pool: str, at: dt.datetime, following: dt.datetime | None, zone: dt.tzinfo,
                          what: str) -> str:
    after = f"; the next one starts {local_time(following, zone)}" if following is not None else ""
    return (f"{local_time(at, zone)} is outside pool {pool}'s maintenance windows{after}: {_a(what)} starts "
            "inside one (or say `next-window`)")


def no_windows_for(pool: str, what: str) -> str:
    return f"pool {pool} has no maintenance windows, so no {what} may run: configure pools.{pool}.windows"


def _a(what: str) -> str:
    return ("an " if what[:1].lower() in "aeiou" else "a ") + what


def pods_moved_note(moved: Mapping[str, Any], *, by_operator: bool = False) -> list[str]:
    """Per node, the GPU pods a change waits for and those it moves off (`PodsMoved`)."""
    notes = []
    waited = "; ".join(f"{node}: {names(m.waited, at_most=4)}" for node, m in moved.items() if m.waited)
    evicted = "; ".join(f"{node}: {names(m.evicted, at_most=4)}" for node, m in moved.items() if m.evicted)
    if waited:
        notes.append(f"jobs waited for before the node goes (wait_for): {waited}")
    if evicted:
        how = ("deleted by the GPU Operator per its upgradePolicy" if by_operator
               else "evicted (PodDisruptionBudgets respected)")
        notes.append(f"GPU pods {how}: {evicted}")
    return notes


def no_targets(what: str) -> str:
    return f"name a pool, or nodes of one pool, for the {what}"


def unknown_target(word: str, closest: Sequence[str]) -> str:
    return f"no pool or GPU node `{word}`{closest_hint(closest)}"


def several_pools(pools: Sequence[str], what: str) -> str:
    return f"the nodes named are in {names(pools)}: {_a(what)} moves nodes of one pool (ask once per pool)"


# ------------------------------------------------------------------ change freezes


def _frozen_what(target: str, cluster: str | None = None) -> str:
    if target == "cluster":
        return f"cluster {cluster}" if cluster else "the cluster"
    return f"pool {target}" + (f" of cluster {cluster}" if cluster else "")


def freeze_line(*, target: str, by: str, until: dt.datetime, reason: str, let_running_finish: bool,
                zone: dt.tzinfo, cluster: str | None = None) -> str:
    """One freeze as status, the handover and App Home show it, its end in `zone`."""
    why = f": {reason}" if reason else " (no reason given)"
    runs = ("runs already going finish" if let_running_finish
            else "runs stop at their next node boundary")
    what = _frozen_what(target, cluster)
    return (f"{what[0].upper()}{what[1:]} is frozen by {by} until {when(until, zone)}{why}; "
            f"no new requests, no run starts, {runs}")


def frozen_refuses_request(*, kind: str, pool: str, target: str, by: str, until: dt.datetime, reason: str,
                           zone: dt.tzinfo, cluster: str | None = None) -> str:
    why = f" ({reason})" if reason else ""
    scope = "" if target == pool else " (the whole cluster is frozen)"
    flag = f" --cluster {cluster}" if cluster else ""
    return (f"No new {kind} request for {pool}: {_frozen_what(target, cluster)} is frozen by {by} until "
            f"{when(until, zone)}{why}{scope}. Ask again after that, or ask an admin to lift it with "
            f"`/gpu unfreeze {target}{flag}`.")


def frozen_refuses_run(*, request_id: str, pool: str, target: str, by: str, until: dt.datetime,
                       reason: str, zone: dt.tzinfo) -> str:
    why = f" ({reason})" if reason else ""
    return (f"The run of {request_id} does not start: {_frozen_what(target)} is frozen by {by} until "
            f"{when(until, zone)}{why}. The request stays approved; it can start when the freeze ends or is lifted "
            f"(`/gpu unfreeze {target}`).")


def freeze_unknown_target(target: str, *, closest: Sequence[str], pools: Sequence[str]) -> str:
    known = f"; pools: {names(pools)}" if pools else ""
    return f"{target!r} is neither `cluster` nor a configured pool{known}{closest_hint(closest)}"


def freeze_until_past(until: dt.datetime, *, now: dt.datetime, zone: dt.tzinfo) -> str:
    return (f"{when(until, zone)} is not in the future (it is {when(now, zone)} now); a freeze needs an end after now, "
            "e.g. until tomorrow 09:00.")


def freeze_nothing_to_lift(target: str, *, cluster_freeze: str | None, frozen_pools: Sequence[str]) -> str:
    if target != "cluster" and cluster_freeze is not None:
        return (f"Pool {target} has no freeze of its own; it is covered by the cluster's: {cluster_freeze}. "
                "Lift that one with `/gpu unfreeze cluster`.")
    if target == "cluster" and frozen_pools:
        return (f"The cluster is not frozen; pools with a freeze of their own: {names(frozen_pools)} "
                f"(lift each with `/gpu unfreeze <pool>`).")
    return f"{_frozen_what(target).capitalize()} is not frozen; nothing to lift (`/gpu freezes` lists them)."


def run_frozen(*, run_id: str, target: str, by: str, until: dt.datetime, reason: str,
               in_flight: Sequence[str], zone: dt.tzinfo) -> str:
    why = f" ({reason})" if reason else ""
    finishing = (f"{names(in_flight)} finish{'es' if len(in_flight) == 1 else ''} the steps under way; "
                 if in_flight else "")
    return (f"Run {run_id} stops at the next node boundary: {_frozen_what(target)} is frozen by {by} until "
            f"{when(until, zone)}{why}. {finishing}no further node or wave starts. It goes on by itself from there "
            f"when the freeze ends or is lifted (`/gpu unfreeze {target}`), or abort it (`/gpu abort {run_id}`).")


def run_waits_for_freeze(*, target: str, by: str, until: dt.datetime, reason: str, zone: dt.tzinfo,
                         cluster: str | None = None) -> str:
    """What a run a freeze holds waits for, in one sentence (the request view, App Home)."""
    why = f": {reason}" if reason else ""
    return (f"Waits for the freeze of {_frozen_what(target, cluster)} (by {by} until {when(until, zone)}{why}) to end; "
            "it goes on by itself then.")


def run_unfrozen(*, run_id: str, target: str) -> str:
    return f"The freeze of {_frozen_what(target)} is over: run {run_id} goes on from the node where it stopped."


def run_window_ended_while_frozen(*, run_id: str, target: str, window_end: dt.datetime, zone: dt.tzinfo) -> str:
    return (f"Run {run_id} halted: its window ended at {when(window_end, zone)} while {_frozen_what(target)} was frozen; "
            "the nodes it finished are given back, the rest were never touched. Ask again for a new window.")


def analysis_one_bound(name: str) -> str:
    return f"analysis {name}: give max (the highest value that passes) or min (the lowest), exactly one"


def analysis_for_range(name: str) -> str:
    return f"analysis {name}: `for` must be between 0s and 2h (the next wave waits that long after each wave)"


def analysis_name_twice(name: str) -> str:
    return f"analysis: two queries are named {name}; the thread names each by its name, so give each its own"


def analysis_needs_prometheus(pool: str, *, cluster: str | None, exporters: bool) -> str:
    where = f"clusters.{cluster}.pools.{pool}" if cluster else f"pools.{pool}"
    have = ("signals reads only the exporters' pages, which cannot answer a PromQL query"
            if exporters else "signals is not configured")
    return f"{where}.analysis needs signals.prometheus to read its queries: {have}"
