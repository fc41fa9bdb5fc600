"""The sentences of /gpu freeze, /gpu unfreeze and /gpu freezes (commands/freezes.py)."""

from __future__ import annotations

FREEZE_FLAG = "--let-running-finish"
FREEZE_USAGE = f"freeze <pool|cluster> until <time> [{FREEZE_FLAG}] [reason]"
UNFREEZE_USAGE = "unfreeze <pool|cluster> [reason]"
FREEZE_COLUMNS = ("frozen", "until", "by", "runs in flight", "reason")


def freeze_needs_target() -> str:
    return f"Say what to freeze (`cluster` or a pool) and until when: /gpu {FREEZE_USAGE}"


def freeze_needs_until(word: str | None) -> str:
    got = f"got {word!r}" if word else "nothing follows the target"
    return (f"A freeze needs an end: `until <time>` after the target ({got}), e.g. "
            "`/gpu freeze serving-a until tomorrow 09:00 incident 4711`.")


def freeze_bad_time(text: str) -> str:
    got = f"Cannot read the time {text!r}" if text else "`until` needs a time"
    return (f"{got}; write until 2026-12-05 09:00, until sat 09:00, until tomorrow 09:00 or until 17:30, "
            "optionally followed by a zone such as Europe/Berlin.")


def freeze_unknown_flag(word: str) -> str:
    return f"Unknown option {word!r}; the one option is {FREEZE_FLAG} (runs already going finish)."


def unfreeze_needs_target() -> str:
    return f"Say which freeze to lift: /gpu {UNFREEZE_USAGE}"


def frozen_title(target: str) -> str:
    return "Froze the cluster" if target == "cluster" else f"Froze pool {target}"


def unfrozen_title(target: str) -> str:
    return "Lifted the cluster's freeze" if target == "cluster" else f"Lifted the freeze of pool {target}"


def freeze_replaced(line: str) -> str:
    return f"Replaces the freeze that was in force: {line}"


def freeze_held_runs(runs: list[str], *, let_running_finish: bool) -> str:
    what = "go on to their end" if let_running_finish else "stop at their next node boundary, then wait"
    return f"Runs in flight that {what}: {', '.join(runs)}"


def freeze_held_requests(requests: list[str]) -> str:
    return f"Approved requests that do not start while it is in force: {', '.join(requests)}"


def unfreeze_summary(*, by: str, set_by: str, until: str, reason: str) -> str:
    why = f": {reason}" if reason else ""
    return (f"{by} lifted the freeze set by {set_by} (it would have lasted until {until}){why}. New requests are "
            "accepted again and runs it held go on from where they stopped.")


def freezes_title(count: int) -> str:
    return "No freeze in force" if count == 0 else f"{count} freeze{'' if count == 1 else 's'} in force"


def freezes_none() -> str:
    return "Requests and runs go ahead as their pools' policies allow."


def freeze_runs_cell(runs: list[str], *, let_running_finish: bool) -> str:
    if not runs:
        return "-"
    return ", ".join(runs) + (" (finish)" if let_running_finish else " (stop at the next node)")
