"""Every sentence of notes on nodes, `/gpu compare` and the pool's policy in `/gpu status
<pool>`, in one place. (The findings' own sentences live in `workflows.fleet.findings`.)"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from workflows.wording import when

# --- notes on nodes


def note_empty() -> str:
    return "say why in the note, e.g. `/gpu note gpu-a-01 waiting for a new PSU (ticket HW-123) for 3d`"


def note_bad_length(lasts: dt.timedelta, *, longest: dt.timedelta) -> str:
    return (f"a note holds for more than nothing and at most {_days(longest)} (asked: {_span(lasts)}); "
            "for longer, write it again when it ends")


def note_bad_duration(text: str) -> str:
    return f"`{text}` after `for` is not a duration; write it like 12h, 3d or 2d12h"


def note_set(node: str, text: str, *, until: dt.datetime, silences: bool, zone: dt.tzinfo) -> str:
    quiet = " Until then it is not reported as forgotten." if silences else ""
    return f"Note on {node} until {when(until, zone)}: \"{text}\".{quiet}"


def note_title(node: str) -> str:
    return f"Note on {node}"


def note_line(text: str, *, by: str, until: dt.datetime, zone: dt.tzinfo) -> str:
    return f"\"{text}\" ({by}, until {when(until, zone)})"


def note_in_handover(node: str, text: str, *, by: str, until: dt.datetime, zone: dt.tzinfo) -> str:
    return f"{node}: note \"{text}\" ({by}, until {when(until, zone, style='day')})"


NOTES_TITLE = "Notes"


def _days(span: dt.timedelta) -> str:
    return f"{span.days} days" if span.days != 1 else "1 day"


def _span(span: dt.timedelta) -> str:
    if span <= dt.timedelta(0):
        return "0s"
    days, rest = span.days, span.seconds
    hours, minutes = rest // 3600, rest % 3600 // 60
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    return "".join(parts) or f"{rest}s"


# --- /gpu compare


COMPARE_COLUMNS = ("property", "pool's majority", "differs on")


def compare_title(pool: str) -> str:
    return f"Drift in pool {pool}"


def compare_summary(pool: str, *, nodes: int, differing: int, properties: int) -> str:
    if not differing:
        return f"the {nodes} nodes of {pool} agree on every property compared"
    return (f"{differing} of {nodes} nodes of {pool} differ from the pool's majority in "
            f"{properties} propert{'y' if properties == 1 else 'ies'}")


def compare_too_few(pool: str, nodes: int) -> str:
    return f"pool {pool} has {nodes} node{'' if nodes == 1 else 's'}: nothing to compare"


def compare_source_note(*, node_objects: bool) -> str:
    if node_objects:
        return ("read from gpuops' watch cache of the nodes and their operand pods; labels set per node "
                "(hostname, instance ids, GFD's per-node timestamps) are left out")
    return ("labels and taints are not compared here: this fleet source keeps no node objects, only "
            "the inventory (driver, kernel, runtime, MIG layout, operand versions)")


def differs_on(values: Sequence[tuple[str, Sequence[str]]]) -> str:
    return "; ".join(f"{value} on {_names(nodes)}" for value, nodes in values)


def _names(nodes: Sequence[str], *, shown: int = 5) -> str:
    return ", ".join(nodes[:shown]) + (f" and {len(nodes) - shown} more" if len(nodes) > shown else "")


NONE_VALUE = "(none)"
MIXED_MAJORITY = "(no majority)"


# --- the pool's policy in /gpu status <pool>


POLICY_TITLE = "Policy (as plans apply it)"


def policy_windows(text: str) -> str:
    return text


def no_windows_set() -> str:
    return "none: no drain or change may start (write windows, or `windows: always`)"


def any_time() -> str:
    return "any time (windows: always)"


def approvals_required_line(parts: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in parts)


def approvers_line(own: Sequence[str]) -> str:
    return (", ".join(own) + " and the fleet's approvers") if own else "the fleet's approvers"


def max_unavailable_line(budget: str, *, nodes_now: int, total: int) -> str:
    return f"{budget} ({nodes_now} of {total} nodes now)"


def floor_line(min_ready_gpus: int) -> str:
    return f"{min_ready_gpus} GPUs stay Ready" if min_ready_gpus else "none (min_ready_gpus: 0)"


def canary_line(canary: str | None, soak: dt.timedelta) -> str:
    first = canary or "the node running the fewest GPU pods"
    return f"{first} first, then {_span(soak)} soak before the next wave"


def gpu_check_line(image: str | None, command: Sequence[str], *, source: str) -> str:
    if image is None:
        return "none: upgraded nodes are given back on the validator's word"
    return f"`{' '.join(command)}` in {image} ({source})"


def timeouts_line(*, drain: dt.timedelta, action: str, validate: dt.timedelta) -> str:
    return f"eviction held by a budget {_span(drain)} then {action}; node back within {_span(validate)}"
