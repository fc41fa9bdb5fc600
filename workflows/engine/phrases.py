"""The two phrasings every sentence module of the engine shares: a list of names cut at a
few (`listed`), and a length of time in its largest sensible unit (`span`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable


def span(length: dt.timedelta | None) -> str:
    """90s, 12m, 3h05m; "no limit" for None."""
    if length is None:
        return "no limit"
    seconds = int(length.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def listed(items: Iterable[str], limit: int = 5) -> str:
    """The first `limit` items, then how many more."""
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
