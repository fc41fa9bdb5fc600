"""When a rolling change of a pool (a driver upgrade, a MIG layout) may start: inside one
of the pool's maintenance windows, now, at a named time, or at the next window's start.
Time is an argument."""

from __future__ import annotations

import datetime as dt

from workflows.pools import messages as say
from workflows.pools.windows import WindowSet


class WindowRefused(Exception):
    def __init__(self, reason: str, *, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def start_window(windows: WindowSet, *, pool: str, now: dt.datetime, at: dt.datetime | None = None,
                 next_window: bool = False, what: str = "change") -> tuple[dt.datetime, dt.datetime | None]:
    """When the run may start and the end it must start before (None with `windows:
    always`): `at` when it is ahead and inside one of the pool's windows; the start of
    the next window with `next_window`; else now, inside a window, or the next window."""
    if windows.never:
        raise WindowRefused(say.no_windows_for(pool, what), code="windows")
    zone = windows.zone or dt.timezone.utc
    if at is not None:
        if at < now:
            raise WindowRefused(say.start_in_the_past(at, now, zone), code="past-start")
        if windows.always:
            return at, None
        found = windows.occurrence_containing(at)
        if found is None:
            following = windows.next_start(at)
            raise WindowRefused(say.start_outside_windows(pool, at, following, zone, what), code="outside-window")
        return at, found.end
    if windows.always:
        return now, None
    found = None if next_window else windows.occurrence_containing(now)
    if found is None:
        start = windows.next_start(now)
        assert start is not None  # a pool with windows always has a next one
        found = windows.occurrence_containing(start)
        assert found is not None
        return start, found.end
    return now, found.end
