"""Maintenance windows as values: tables of literal times in named zones, including
windows that cross midnight, wrap from Sunday into Monday, and span a DST change."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflows.pools.windows import MaintenanceWindow, Occurrence, WindowError, WindowSet

UTC = dt.timezone.utc
HOUR = dt.timedelta(hours=1)


def local(text: str, zone: str) -> dt.datetime:
    """A wall-clock time in a named zone (first pass if the clock shows it twice)."""
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=ZoneInfo(zone))


def utc(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)


def window(days, start: str, end: str, zone: str) -> MaintenanceWindow:
    return MaintenanceWindow.parse(days=days, start=start, end=end, timezone=zone)


WEEKEND_BERLIN = window(["sat", "sun"], "02:00", "06:00", "Europe/Berlin")
FRIDAY_NIGHT_NY = window(["fri"], "22:00", "04:00", "America/New_York")
SUNDAY_NIGHT_UTC = window(["sun"], "23:00", "01:00", "UTC")
NIGHTLY_NY = window("daily", "01:00", "03:00", "America/New_York")
NIGHTLY_BERLIN = window("daily", "01:00", "04:00", "Europe/Berlin")
SATURDAY_NIGHT_NY = window(["sat"], "22:00", "04:00", "America/New_York")


# ------------------------------------------------------------------ contains


@pytest.mark.parametrize(
    ("name", "w", "t", "inside"),
    [
        # sat,sun 02:00-06:00 Europe/Berlin (2026-12-05 is a Saturday)
        ("start is inside", WEEKEND_BERLIN, local("2026-12-05 02:00", "Europe/Berlin"), True),
        ("a minute before start", WEEKEND_BERLIN, local("2026-12-05 01:59", "Europe/Berlin"), False),
        ("last minute", WEEKEND_BERLIN, local("2026-12-06 05:59", "Europe/Berlin"), True),
        ("end is outside", WEEKEND_BERLIN, local("2026-12-06 06:00", "Europe/Berlin"), False),
        ("a weekday", WEEKEND_BERLIN, local("2026-12-07 03:00", "Europe/Berlin"), False),
        ("same instant written in UTC", WEEKEND_BERLIN, utc("2026-12-05 01:30"), True),
        ("same wall time in UTC is another instant", WEEKEND_BERLIN, utc("2026-12-05 05:30"), False),
        # fri 22:00-04:00 America/New_York: crosses midnight into Saturday
        ("friday late evening", FRIDAY_NIGHT_NY, local("2026-12-04 23:30", "America/New_York"), True),
        ("saturday small hours", FRIDAY_NIGHT_NY, local("2026-12-05 03:59", "America/New_York"), True),
        ("saturday at end", FRIDAY_NIGHT_NY, local("2026-12-05 04:00", "America/New_York"), False),
        ("friday small hours belong to thursday", FRIDAY_NIGHT_NY,
         local("2026-12-04 01:00", "America/New_York"), False),
        ("saturday late evening", FRIDAY_NIGHT_NY, local("2026-12-05 23:00", "America/New_York"), False),
        # sun 23:00-01:00 UTC: wraps from Sunday into Monday
        ("sunday 23:30", SUNDAY_NIGHT_UTC, utc("2026-12-06 23:30"), True),
        ("monday 00:30", SUNDAY_NIGHT_UTC, utc("2026-12-07 00:30"), True),
        ("monday 01:00", SUNDAY_NIGHT_UTC, utc("2026-12-07 01:00"), False),
        ("sunday 00:30 belongs to saturday", SUNDAY_NIGHT_UTC, utc("2026-12-06 00:30"), False),
        ("monday 23:30", SUNDAY_NIGHT_UTC, utc("2026-12-07 23:30"), False),
        # daily 01:00-03:00 America/New_York across both DST changes of 2026
        ("spring forward: 01:30 EST", NIGHTLY_NY, utc("2026-03-08 06:30"), True),
        ("spring forward: 03:00 EDT, one hour later", NIGHTLY_NY, utc("2026-03-08 07:00"), False),
        ("fall back: 01:30 EDT, first pass", NIGHTLY_NY, utc("2026-11-01 05:30"), True),
        ("fall back: 01:30 EST, second pass", NIGHTLY_NY, utc("2026-11-01 06:30"), True),
        ("fall back: 02:30 EST", NIGHTLY_NY, utc("2026-11-01 07:30"), True),
        ("fall back: 03:00 EST", NIGHTLY_NY, utc("2026-11-01 08:00"), False),
    ],
)
def test_a_window_contains_exactly_the_times_its_clock_shows_inside_it(name, w, t, inside):
    assert w.contains(t) is inside, name


# ------------------------------------------------------------------ occurrences and DST


@pytest.mark.parametrize(
    ("name", "w", "t", "start", "end", "length"),
    [
        ("an ordinary night", NIGHTLY_NY, utc("2026-06-10 06:00"),
         utc("2026-06-10 05:00"), utc("2026-06-10 07:00"), 2 * HOUR),
        ("New York spring forward is an hour shorter", NIGHTLY_NY, utc("2026-03-08 06:10"),
         utc("2026-03-08 06:00"), utc("2026-03-08 07:00"), 1 * HOUR),
        ("New York fall back is an hour longer", NIGHTLY_NY, utc("2026-11-01 07:00"),
         utc("2026-11-01 05:00"), utc("2026-11-01 08:00"), 3 * HOUR),
        ("Berlin spring forward is an hour shorter", NIGHTLY_BERLIN, utc("2026-03-29 01:00"),
         utc("2026-03-29 00:00"), utc("2026-03-29 02:00"), 2 * HOUR),
        ("Berlin fall back is an hour longer", NIGHTLY_BERLIN, utc("2026-10-25 01:00"),
         utc("2026-10-24 23:00"), utc("2026-10-25 03:00"), 4 * HOUR),
        ("a window across midnight spanning spring forward", SATURDAY_NIGHT_NY,
         local("2026-03-07 23:00", "America/New_York"),
         utc("2026-03-08 03:00"), utc("2026-03-08 08:00"), 5 * HOUR),
        ("a window across midnight spanning fall back", SATURDAY_NIGHT_NY,
         local("2026-10-31 23:00", "America/New_York"),
         utc("2026-11-01 02:00"), utc("2026-11-01 09:00"), 7 * HOUR),
        ("sunday into monday", SUNDAY_NIGHT_UTC, utc("2026-12-07 00:15"),
         utc("2026-12-06 23:00"), utc("2026-12-07 01:00"), 2 * HOUR),
    ],
)
def test_an_occurrence_keeps_its_wall_clock_times_and_changes_length_across_dst(
        name, w, t, start, end, length):
    found = w.occurrence_containing(t)
    assert found == Occurrence(start, end), name
    assert found.length == length, name


def test_a_start_the_clocks_skip_begins_when_they_jump():
    skipped = window(["sun"], "02:30", "04:00", "America/New_York")

    found = skipped.occurrence_containing(utc("2026-03-08 07:30"))

    # 02:30 does not exist on 2026-03-08; the clocks jump from 02:00 EST to 03:00 EDT.
    assert found == Occurrence(utc("2026-03-08 07:00"), utc("2026-03-08 08:00"))


def test_a_time_outside_every_occurrence_has_no_occurrence():
    assert WEEKEND_BERLIN.occurrence_containing(local("2026-12-07 03:00", "Europe/Berlin")) is None


# ------------------------------------------------------------------ next start and fits


@pytest.mark.parametrize(
    ("name", "w", "after", "expected"),
    [
        ("from a wednesday to saturday", WEEKEND_BERLIN, local("2026-12-02 10:00", "Europe/Berlin"),
         local("2026-12-05 02:00", "Europe/Berlin")),
        ("inside saturday's occurrence, sunday's is next", WEEKEND_BERLIN,
         local("2026-12-05 03:00", "Europe/Berlin"), local("2026-12-06 02:00", "Europe/Berlin")),
        ("exactly at a start, that start", WEEKEND_BERLIN, local("2026-12-05 02:00", "Europe/Berlin"),
         local("2026-12-05 02:00", "Europe/Berlin")),
        ("sunday afternoon wraps to next saturday", WEEKEND_BERLIN,
         local("2026-12-06 14:00", "Europe/Berlin"), local("2026-12-12 02:00", "Europe/Berlin")),
        ("monday after the wrap to next sunday", SUNDAY_NIGHT_UTC, utc("2026-12-07 00:30"),
         utc("2026-12-13 23:00")),
        ("the skipped start on spring-forward day", window(["sun"], "02:30", "04:00", "America/New_York"),
         local("2026-03-07 12:00", "America/New_York"), utc("2026-03-08 07:00")),
    ],
)
def test_next_start_is_the_first_occurrence_starting_at_or_after_the_time(name, w, after, expected):
    assert w.next_start(after) == expected, name


@pytest.mark.parametrize(
    ("name", "w", "start", "duration", "fits"),
    [
        ("two hours from the start of a four-hour window", WEEKEND_BERLIN,
         local("2026-12-05 02:00", "Europe/Berlin"), 2 * HOUR, True),
        ("ending exactly at the window end", WEEKEND_BERLIN,
         local("2026-12-05 04:00", "Europe/Berlin"), 2 * HOUR, True),
        ("a minute past the window end", WEEKEND_BERLIN,
         local("2026-12-05 04:01", "Europe/Berlin"), 2 * HOUR, False),
        ("starting outside any window", WEEKEND_BERLIN,
         local("2026-12-05 01:00", "Europe/Berlin"), HOUR, False),
        ("across midnight inside one occurrence", FRIDAY_NIGHT_NY,
         local("2026-12-04 23:00", "America/New_York"), 4 * HOUR, True),
        ("saturday and sunday occurrences are not one", WEEKEND_BERLIN,
         local("2026-12-05 05:00", "Europe/Berlin"), 22 * HOUR, False),
        ("2h30 fits the three-hour fall-back night", NIGHTLY_NY, utc("2026-11-01 05:00"),
         dt.timedelta(hours=2, minutes=30), True),
        ("1h30 does not fit the one-hour spring-forward night", NIGHTLY_NY, utc("2026-03-08 06:00"),
         dt.timedelta(hours=1, minutes=30), False),
    ],
)
def test_a_drain_fits_only_if_it_lies_inside_one_occurrence(name, w, start, duration, fits):
    assert w.fits(start, duration) is fits, name


def test_next_fit_skips_occurrences_too_short_for_the_drain():
    # The spring-forward night is one hour long; a 90-minute drain waits for the next.
    found = NIGHTLY_NY.next_fit(local("2026-03-07 12:00", "America/New_York"),
                                dt.timedelta(hours=1, minutes=30))

    assert found == local("2026-03-09 01:00", "America/New_York")


# ------------------------------------------------------------------ a pool's set


def test_touching_windows_of_a_set_make_one_span_a_long_drain_fits_in():
    windows = WindowSet(windows=(
        window(["sat"], "22:00", "24:00", "Europe/Berlin"),
        window(["sun"], "00:00", "06:00", "Europe/Berlin"),
    ))
    start = local("2026-12-05 22:00", "Europe/Berlin")

    assert windows.occurrence_containing(local("2026-12-06 01:00", "Europe/Berlin")) == Occurrence(
        utc("2026-12-05 21:00"), utc("2026-12-06 05:00"))
    assert windows.fits(start, 8 * HOUR)
    assert not windows.fits(start, 9 * HOUR)


def test_a_set_of_windows_in_different_zones_answers_with_the_earliest():
    windows = WindowSet(windows=(WEEKEND_BERLIN, FRIDAY_NIGHT_NY))

    # Berlin's Saturday 02:00 is 01:00 UTC; New York's Friday 22:00 is 03:00 UTC.
    assert windows.next_start(utc("2026-12-04 12:00")) == utc("2026-12-05 01:00")
    assert windows.contains(local("2026-12-04 23:00", "America/New_York"))
    assert windows.zone == ZoneInfo("Europe/Berlin")


def test_windows_covering_the_whole_week_still_answer():
    every_day = WindowSet(windows=(window("daily", "00:00", "00:00", "Asia/Kolkata"),))
    t = utc("2026-12-02 10:00")

    assert every_day.contains(t)
    assert every_day.fits(t, 48 * HOUR)
    assert every_day.next_fit(t, 48 * HOUR) == t


def test_no_windows_allow_nothing_and_always_allows_everything():
    never, always = WindowSet(), WindowSet.any_time()
    t = utc("2026-12-02 10:00")

    assert never.never and not never.contains(t) and never.next_start(t) is None
    assert not never.fits(t, HOUR) and never.next_fit(t, HOUR) is None
    assert always.contains(t) and always.next_start(t) == t
    assert always.fits(t, 1000 * HOUR) and always.next_fit(t, HOUR) == t


def test_window_questions_refuse_a_naive_time():
    with pytest.raises(ValueError, match="aware"):
        WEEKEND_BERLIN.contains(dt.datetime(2026, 12, 5, 3, 0))


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("days", "expected"),
    [
        (["sat", "sun"], {5, 6}),
        (["Saturday", "SUN"], {5, 6}),
        ("mon-fri", {0, 1, 2, 3, 4}),
        (["fri-mon"], {4, 5, 6, 0}),
        ("daily", set(range(7))),
        ("sat,sun", {5, 6}),
    ],
)
def test_days_are_read_as_names_ranges_or_daily(days, expected):
    assert window(days, "02:00", "04:00", "UTC").days == frozenset(expected)


@pytest.mark.parametrize(
    ("days", "start", "end", "zone", "says"),
    [
        (["sat"], 1350, "04:00", "UTC", 'quote the time, e.g. "22:30"'),
        (["sat"], "2am", "04:00", "UTC", "HH:MM on a 24-hour clock"),
        (["sat"], "24:00", "04:00", "UTC", "'24:00' is not a time of day"),
        (["sat"], "02:00", "04:60", "UTC", "'04:60' is not a time of day"),
        (["saturdy"], "02:00", "04:00", "UTC", "did you mean saturday?"),
        ([], "02:00", "04:00", "UTC", "at least one day"),
        (["sat"], "02:00", "04:00", "Europe/Berln", "did you mean Europe/Berlin"),
        (["sat"], "02:00", "04:00", "", "needs a timezone"),
    ],
)
def test_a_bad_window_is_refused_saying_what_to_write(days, start, end, zone, says):
    with pytest.raises(WindowError) as refused:
        window(days, start, end, zone)
    assert says in str(refused.value)


def test_an_end_of_2400_is_midnight_after_the_start_day_and_equal_times_make_a_whole_day():
    evening = window(["sat"], "22:00", "24:00", "UTC")
    whole_day = window(["sat"], "00:00", "00:00", "UTC")

    assert evening.occurrence_containing(utc("2026-12-05 23:00")) == Occurrence(
        utc("2026-12-05 22:00"), utc("2026-12-06 00:00"))
    assert whole_day.occurrence_containing(utc("2026-12-05 12:00")).length == 24 * HOUR


# ------------------------------------------------------------------ properties

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata")
clocks = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.sampled_from([0, 15, 30, 45]))
windows_strategy = st.builds(
    lambda days, start, end, zone: window(sorted(days), start, end, zone),
    st.sets(st.sampled_from(["mon", "tue", "wed", "thu", "fri", "sat", "sun"]), min_size=1),
    clocks, clocks, st.sampled_from(ZONES),
)
instants = st.datetimes(min_value=dt.datetime(2025, 1, 1), max_value=dt.datetime(2027, 12, 31),
                        timezones=st.just(UTC))


@settings(max_examples=300, deadline=None)
@given(w=windows_strategy, t=instants)
def test_every_answer_about_a_window_agrees_with_the_others(w, t):
    found = w.occurrence_containing(t)
    assert w.contains(t) is (found is not None)
    if found is not None:
        assert found.start <= t < found.end
        assert w.fits(t, found.end - t)
        assert not w.fits(t, found.end - t + dt.timedelta(minutes=1))
    upcoming = w.next_start(t)
    assert upcoming >= t and w.contains(upcoming)
    assert upcoming - t <= dt.timedelta(days=8)
