"""The sentences of the pre-flight checks of a plan's canary resource (`check`), its
duration against the window (`duration`) and what else it touches (`touches`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from workflows.wording import duration_text, names, plural, when

# ------------------------------------------------------------------ the canary's resource


def _offered(offered: Sequence[tuple[str, int]], nodes: int) -> str:
    if not offered:
        return "no GPU resource"
    return names(r if count == nodes else f"{r} (on {count} of {nodes} nodes)" for r, count in offered)


# No resource every checked node advertises: no one `resource` makes the check run.
_NONE_FITS = "no one resource is advertised by every node it checks: split the pool"


def _use(pool: str, fits: Sequence[str]) -> str:
    if not fits:
        return f"{_NONE_FITS} or set `pools.{pool}.gpu_check: {{enabled: false}}`"
    return (f"set `pools.{pool}.gpu_check.resource` to {names(fits)} (a pool's `gpu_check` replaces the fleet's "
            "whole: write the namespace, image and command it needs there too)")


def canary_resource_not_advertised(pool: str, resource: str, missing: Sequence[str], *,
                                   offered: Sequence[tuple[str, int]], fits: Sequence[str], nodes: int,
                                   configured_at: str) -> str:
    return (f"The canary pod ({configured_at}) asks for one {resource}, which {names(missing)} will not advertise "
            f"after this change: it would stay Pending until its timeout and halt the run with the node cordoned. "
            f"{pool}'s nodes advertise {_offered(offered, nodes)}; {_use(pool, fits)}")


def canary_resource_unset(pool: str, resource: str, missing: Sequence[str], *, offered: Sequence[tuple[str, int]],
                          fits: Sequence[str], nodes: int) -> str:
    return (f"The canary pod asks for one {resource} by default (no `gpu_check.resource` is configured), which "
            f"{names(missing)} will not advertise after this change: it would stay Pending until its timeout and halt "
            f"the run with the node cordoned. {pool}'s nodes advertise {_offered(offered, nodes)}: name the one the "
            f"check should use; {_use(pool, fits)}")


def canary_default_while_off(pool: str, resource: str, missing: Sequence[str], *,
                             offered: Sequence[tuple[str, int]], fits: Sequence[str], nodes: int,
                             configured_at: str) -> str:
    use = f"turn `{configured_at}` on (`enabled: true`) with `resource` set to {names(fits)}" if fits else _NONE_FITS
    return (f"The canary pod asks for one {resource} by default: `{configured_at}` is turned off (`enabled: false`), "
            f"and this change runs the default test pod then, which {names(missing)} will not advertise after this "
            f"change: it would stay Pending until its timeout and halt the run with the node cordoned. {pool}'s nodes "
            f"advertise {_offered(offered, nodes)}; {use}")


def canary_count_not_advertised(pool: str, resource: str, count: int, short: Mapping[str, int], *,
                                configured_at: str) -> str:
    have = names([f"{node} ({n})" for node, n in short.items()])
    return (f"The canary pod ({configured_at}) asks for {count} {resource}, more than {have} will advertise after "
            f"this change: it would stay Pending until its timeout and halt the run with the node cordoned. Set "
            f"`count` in {configured_at} to `all` (every one the node advertises) or to at most "
            f"{min(short.values())} for {pool}.")


def canary_resource_goes_away(pool: str, resource: str, after: Sequence[str]) -> str:
    return (f"{pool}'s canary pod asks for {resource}, which the pool will no longer advertise after this change: "
            f"its next driver upgrade or move is refused until `pools.{pool}.gpu_check.resource` names one it "
            f"advertises ({names(after)})")


# ------------------------------------------------------------------ duration and window


def run_takes(pool: str, *, total: dt.timedelta, waves: int, slowest: str, slowest_takes: dt.timedelta,
              source: str, unseen: Sequence[str]) -> str:
    shape = f"{plural(waves, 'wave')}, the slowest node {slowest} {duration_text(slowest_takes)}"
    if source == "timeouts":
        return (f"The run takes at most {duration_text(total)} at the configured timeouts ({shape}; no past run "
                f"of {pool} to learn its pace from)")
    learned = f"at the pace of {pool}'s last runs"
    if source == "mixed":
        learned += f" ({names(unseen)} at their configured timeouts: none finished in those runs)"
    return f"The run takes about {duration_text(total)} {learned} ({shape})"


def run_watches_between(between: dt.timedelta, *, waits: int) -> str:
    """The part of a run's time spent watching `analysis` queries between its waves."""
    return (f"including {duration_text(between * waits)} of service-health watch "
            f"({duration_text(between)} after each wave but the last)")


def run_fits_window(*, window: dt.timedelta, spare: dt.timedelta) -> str:
    return f"it fits the window ({duration_text(window)}, {duration_text(spare)} to spare)"


def run_no_window_end() -> str:
    return "the pool's windows are always open: no end to fit"


def run_starts_once_approved(*, end: dt.datetime, latest: dt.datetime) -> str:
    return (f"it starts once approved, and ends inside its window (which ends {when(end)}) if it starts by "
            f"{when(latest)}")


def diag_outgrows_window() -> str:
    return ("its DCGM diagnostics (the pool's gpu_check diag) make it outgrow the window, so it is refused: ask for "
            "a longer window or fewer nodes, or set a lower gpu_check.diag level")


def run_outgrows_window(*, window: dt.timedelta, started: int, waves: int) -> str:
    if started >= waves:
        return (f"it does not fit the window ({duration_text(window)}): every wave starts inside it, the last "
                "ends after it")
    return (f"it does not fit the window ({duration_text(window)}): {plural(started, 'wave')} of {waves} start "
            f"inside it, and the run halts before wave {started + 1} (ask for a longer window, fewer nodes, or "
            "a larger max_unavailable)")


# ------------------------------------------------------------------ what else it touches


def shared_driver(ref: str, pools: Sequence[tuple[str, int]]) -> str:
    listed = names(f"{pool} ({plural(nodes, 'node')})" for pool, nodes in pools)
    return f"{ref} also sets the driver of {listed}: their nodes take the new version too"


def quota_no_longer_fits(namespace: str, resource: str, *, hard: int, before: int, after: int,
                         pools: Sequence[str]) -> str:
    return (f"namespace {namespace}'s quota of {hard} {resource} no longer fits: {names(pools)} advertise "
            f"{after} after this change ({before} now)")


def quotas_unread(why: str) -> str:
    return (f"GPU quotas could not be read, so this plan names none that would no longer fit after the change: "
            f"{why}")


def workloads_lose_resource(pool: str, resource: str, pods: Sequence[str], *, elsewhere: Sequence[str]) -> str:
    where = (f"only {names(elsewhere)} still advertise it" if elsewhere
             else "no GPU node of the cluster advertises it afterwards: they will not schedule")
    return (f"{plural(len(pods), 'pod')} ask for {resource}, which {pool} will no longer advertise: "
            f"{names(pods)}; {where}")


# ------------------------------------------------------------------ a run that holds its nodes (a drain)


def held_run_takes(pool: str, *, out: dt.timedelta, back: dt.timedelta, waves: int, slowest: str, source: str,
                   unseen: Sequence[str]) -> str:
    shape = f"{plural(waves, 'wave')}, the slowest node {slowest}"
    if source == "timeouts":
        return (f"A wave takes at most {duration_text(out)} to drain its nodes, and {duration_text(back)} after the "
                f"hold to validate and uncordon them, at the configured timeouts ({shape}; no past run of {pool} to "
                "learn its pace from)")
    learned = f"at the pace of {pool}'s last runs"
    if source == "mixed":
        learned += f" ({names(unseen)} at their configured timeouts: none finished in those runs)"
    return (f"A wave takes about {duration_text(out)} to drain its nodes, and {duration_text(back)} after the hold "
            f"to validate and uncordon them, {learned} ({shape})")


def held_until_done(*, at_most: dt.timedelta | None, waves: int) -> str:
    limit = f", or for at most {duration_text(at_most)} (the pool's open_drain_max)" if at_most is not None else ""
    each = "each wave's nodes stay" if waves > 1 else "its nodes stay"
    return f"{each} drained until someone says `/gpu drain done`{limit}: the run ends only then"


def held_fits(*, until: dt.datetime, drained_by: dt.datetime) -> str:
    return (f"its nodes are drained by {when(drained_by)} and held until the window ends ({when(until)}), then "
            "validated and uncordoned")


def held_starts_once_approved(*, until: dt.datetime, latest: dt.datetime) -> str:
    return (f"it starts once approved, and its nodes are drained before its window ends ({when(until)}) if it "
            f"starts by {when(latest)}")


def held_outgrows_drain(*, until: dt.datetime, drained_by: dt.datetime) -> str:
    return (f"draining its nodes may take until {when(drained_by)}, after its window ends ({when(until)}): they "
            "are held for no time at all (ask for a longer drain)")


def held_waves_past_window(*, until: dt.datetime, waves: int) -> str:
    return (f"the first wave's nodes are held until the window ends ({when(until)}), so unless someone says "
            f"`/gpu drain done` before then, only 1 wave of {waves} starts inside it and the run halts before wave 2 "
            "(ask for one drain per wave, one after another, or a larger max_unavailable so they fit in one wave)")


# ------------------------------------------------------------------ the gates between waves


def health_query(name: str, query: str, *, max_value: float | None, min_value: float | None,
                 length: dt.timedelta) -> str:
    bound = f"at most {max_value:.6g}" if max_value is not None else f"at least {(min_value or 0.0):.6g}"
    return f"{name}: {bound} for {duration_text(length)} ({query})"


def health_between_waves(pool: str, *, waits: int, longest: dt.timedelta) -> str:
    return (f"After each wave but the last, the service health of {pool} must hold before the next wave starts "
            f"({plural(waits, 'wait')} of up to {duration_text(longest)}, read through Prometheus). A query past its "
            "bound, or one that cannot be read, halts the run before the next wave.")


def health_one_wave(pool: str) -> str:
    return (f"The service health of {pool} is held between waves; this plan has one wave, so its queries are not "
            "asked.")


def gpu_signals_off() -> str:
    return ("GPU signals are not configured (`signals`): no node's XIDs, double-bit ECC errors or row-remap failures "
            "are compared before and after its change; that gate is off.")


def gpu_signals_compared(source: str) -> str:
    via = "Prometheus" if source == "prometheus" else "the dcgm-exporter pods"
    return (f"Each node's XIDs, double-bit ECC errors and row-remap failures are read ({via}) before it is cordoned and "
            "after its check; a new one keeps it cordoned and halts the run.")
