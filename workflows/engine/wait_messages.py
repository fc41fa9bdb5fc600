"""Why a request or its run waits (workflows.engine.waits): one sentence each, for
`/gpu request`, the request's card and App Home."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from workflows.wording import when


def waits_for_approvals(*, missing: int, counted: int, required: int, approvers: Sequence[str], pool: str) -> str:
    listed = list(approvers[:4]) + ([f"{len(approvers) - 4} more"] if len(approvers) > 4 else [])
    who = f"an approver of {pool}" if not listed else listed[0] if len(listed) == 1 else \
        f"{', '.join(listed[:-1])} or {listed[-1]}"
    more = "1 more approval" if missing == 1 else f"{missing} more approvals"
    return f"Waits for {more} ({counted}/{required} so far) from {who}."


def waits_for_window(start: dt.datetime, zone: dt.tzinfo) -> str:
    return f"Waits for its window, which opens at {when(start, zone)}; the run starts then."


def waits_paused(run_id: str) -> str:
    return (f"Waits for someone to resume run {run_id}: it is paused, steps in flight finish and nothing new "
            f"starts (`/gpu resume {run_id}`).")


def waits_on_step(node: str, kind: str, note: str, *, others: int) -> str:
    more = f" (and {others} more node{'s' if others != 1 else ''} under way)" if others else ""
    return f"Waits on {node} ({kind}){more}: {note.rstrip('.')}."
