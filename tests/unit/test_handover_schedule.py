"""When shifts change: cron rules read as wall-clock times in a rotation's zone, across
DST changes, and which handover is due when the bot looks (on time, late, after missing
some, after a restart)."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from workflows.handover.rotations import ON_TIME_WITHIN, RotationConfig, due_handovers, local_instant

UTC = dt.timezone.utc
MINUTE = dt.timedelta(minutes=1)


def rotation(zone: str, *shifts: tuple[str, str], **extra) -> RotationConfig:
    return RotationConfig.model_validate({
        "name": "gpu-oncall", "team": "GPU platform", "channel": "C0GPU", "timezone": zone,
        "shifts": [{"name": name, "starts": rule, "members": ["U0ALICE"]} for name, rule in shifts],
        **extra,
    })


def utc(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=UTC)


def local(zone: str, *parts: int, fold: int = 0) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=ZoneInfo(zone), fold=fold).astimezone(UTC)


def changes_on(rot: RotationConfig, zone: str, y: int, m: int, d: int) -> list[dt.datetime]:
    """The changes during one local calendar day."""
    start = local(zone, y, m, d)
    end = local(zone, y, m, d) + dt.timedelta(days=1)
    return [c.at for c in rot.shift_changes_between(start - dt.timedelta(microseconds=1), end)
            if c.at.astimezone(ZoneInfo(zone)).date() == dt.date(y, m, d)]


# ------------------------------------------------------------------ DST, table-driven


@pytest.mark.parametrize(
    ("zone", "rule", "day", "expected_utc"),
    [
        # Spring forward: 02:30 does not exist; the change happens when clocks jump (03:00).
        ("America/New_York", "30 2 * * *", (2025, 3, 9), [utc(2025, 3, 9, 7, 0)]),
        ("Europe/Berlin", "30 2 * * *", (2025, 3, 30), [utc(2025, 3, 30, 1, 0)]),
        # Fall back: 01:30 (New York) and 02:30 (Berlin) happen twice; the first counts.
        ("America/New_York", "30 1 * * *", (2025, 11, 2), [utc(2025, 11, 2, 5, 30)]),
        ("Europe/Berlin", "30 2 * * *", (2025, 10, 26), [utc(2025, 10, 26, 0, 30)]),
        # Times away from the jump keep their wall-clock time on both days.
        ("America/New_York", "0 8 * * *", (2025, 3, 9), [utc(2025, 3, 9, 12, 0)]),
        ("America/New_York", "0 8 * * *", (2025, 11, 2), [utc(2025, 11, 2, 13, 0)]),
        ("Europe/Berlin", "0 20 * * *", (2025, 10, 26), [utc(2025, 10, 26, 19, 0)]),
    ],
)
def test_a_shift_change_on_a_dst_day_happens_exactly_once(zone, rule, day, expected_utc):
    rot = rotation(zone, ("only", rule))

    assert changes_on(rot, zone, *day) == expected_utc


def test_a_change_in_the_spring_forward_gap_fires_when_the_clocks_jump():
    zone = ZoneInfo("America/New_York")

    assert local_instant(dt.datetime(2025, 3, 9, 2, 30), zone) == utc(2025, 3, 9, 7, 0)
    assert local_instant(dt.datetime(2025, 3, 9, 2, 0), zone) == utc(2025, 3, 9, 7, 0)
    assert local_instant(dt.datetime(2025, 3, 9, 1, 59), zone) == utc(2025, 3, 9, 6, 59)


def test_the_two_shifts_of_a_day_keep_their_local_times_across_the_fall_back_night():
    rot = rotation("Europe/Berlin", ("day", "0 8 * * *"), ("night", "0 20 * * *"))

    found = rot.shift_changes_between(utc(2025, 10, 25, 0, 0), utc(2025, 10, 27, 0, 0))

    assert [(c.at.astimezone(rot.zone).strftime("%a %H:%M %Z"), c.shift.name) for c in found] == [
        ("Sat 08:00 CEST", "day"), ("Sat 20:00 CEST", "night"),
        ("Sun 08:00 CET", "day"), ("Sun 20:00 CET", "night"),
    ]
    # The night across the change lasts 13 hours, and it is still one shift.
    assert found[2].at - found[1].at == dt.timedelta(hours=13)


def test_a_scheduler_ticking_every_minute_through_dst_nights_posts_each_change_once():
    for zone, rule, start in [
        ("America/New_York", "30 2 * * *", utc(2025, 3, 8, 12, 0)),
        ("America/New_York", "30 1 * * *", utc(2025, 11, 1, 12, 0)),
        ("Europe/Berlin", "30 2 * * *", utc(2025, 3, 29, 12, 0)),
        ("Europe/Berlin", "30 2 * * *", utc(2025, 10, 25, 12, 0)),
    ]:
        rot = rotation(zone, ("night", rule))
        last: dt.datetime | None = rot.current_shift(start).start
        posted = []
        now = start
        while now < start + dt.timedelta(hours=48):
            for due in due_handovers(rot, last, now):
                posted.append(due)
                last = due.shift_start
            now += MINUTE

        assert len(posted) == 2, (zone, rule, posted)
        assert not any(d.late for d in posted)
        assert len({d.shift_start for d in posted}) == 2


# ------------------------------------------------------------------ who is on shift


def test_the_current_shift_is_the_one_that_started_last_in_the_rotations_zone():
    rot = rotation("America/New_York", ("day", "0 8 * * mon-fri"), ("night", "0 20 * * mon-fri"),
                   ("weekend", "0 8 * * sat"))
    friday_late = local("America/New_York", 2025, 6, 6, 23, 0)
    sunday = local("America/New_York", 2025, 6, 8, 12, 0)
    monday_morning = local("America/New_York", 2025, 6, 9, 8, 0)

    assert rot.current_shift(friday_late).name == "night"
    weekend = rot.current_shift(sunday)
    assert weekend.name == "weekend"
    assert weekend.start == local("America/New_York", 2025, 6, 7, 8, 0)
    assert weekend.end == monday_morning
    assert rot.current_shift(monday_morning).name == "day"  # a change at `now` has happened
    assert rot.current_shift(monday_morning - MINUTE).name == "weekend"


def test_the_next_change_is_strictly_after_the_time_given():
    rot = rotation("Europe/Berlin", ("day", "0 8 * * *"), ("night", "0 20 * * *"))
    eight = local("Europe/Berlin", 2025, 6, 7, 8, 0)

    change = rot.next_shift_change(eight)

    assert change.at == local("Europe/Berlin", 2025, 6, 7, 20, 0)
    assert change.shift.name == "night"
    assert rot.next_shift_change(eight - MINUTE).shift.name == "day"


def test_the_incoming_shift_of_a_change_runs_until_the_next_change():
    rot = rotation("Asia/Tokyo", ("day", "0 9 * * *"), ("night", "0 21 * * *"))
    change = rot.next_shift_change(utc(2025, 6, 6, 23, 59))

    incoming = rot.incoming_shift(change)

    assert (incoming.name, incoming.start, incoming.end) == ("day", utc(2025, 6, 7, 0, 0), utc(2025, 6, 7, 12, 0))
    with pytest.raises(ValueError, match="no shift of rotation gpu-oncall starts at"):
        rot.incoming_shift(utc(2025, 6, 7, 1, 0))


def test_changes_between_two_times_include_the_end_and_exclude_the_start():
    rot = rotation("UTC", ("day", "0 8 * * *"), ("night", "0 20 * * *"))

    found = rot.shift_changes_between(utc(2025, 6, 7, 8, 0), utc(2025, 6, 8, 8, 0))

    assert [c.at for c in found] == [utc(2025, 6, 7, 20, 0), utc(2025, 6, 8, 8, 0)]


def test_times_without_a_zone_are_refused():
    rot = rotation("UTC", ("day", "0 8 * * *"))

    with pytest.raises(ValueError, match="timezone-aware"):
        rot.current_shift(dt.datetime(2025, 6, 7, 8, 0))


# ------------------------------------------------------------------ what is due


DAY_NIGHT = (("day", "0 8 * * *"), ("night", "0 20 * * *"))


def test_a_change_seen_within_a_few_minutes_is_due_on_time():
    rot = rotation("Europe/Berlin", *DAY_NIGHT)
    eight = local("Europe/Berlin", 2025, 6, 7, 8, 0)
    night_before = local("Europe/Berlin", 2025, 6, 6, 20, 0)

    assert due_handovers(rot, night_before, eight - MINUTE) == []
    (due,) = due_handovers(rot, night_before, eight + 2 * MINUTE)

    assert (due.shift_start, due.late, due.missed, due.shift.name) == (eight, False, 0, "day")


def test_a_change_missed_while_the_bot_was_down_is_due_late():
    rot = rotation("Europe/Berlin", *DAY_NIGHT)
    eight = local("Europe/Berlin", 2025, 6, 7, 8, 0)

    (due,) = due_handovers(rot, eight - dt.timedelta(hours=12), eight + ON_TIME_WITHIN + MINUTE)

    assert due.late and due.missed == 0 and due.shift_start == eight


def test_after_several_missed_changes_only_the_latest_is_due_saying_how_many_were_missed():
    rot = rotation("Europe/Berlin", *DAY_NIGHT)
    last_posted = local("Europe/Berlin", 2025, 6, 5, 8, 0)
    now = local("Europe/Berlin", 2025, 6, 7, 9, 30)

    due = due_handovers(rot, last_posted, now)

    assert [(d.shift_start, d.shift.name, d.late, d.missed) for d in due] == [
        (local("Europe/Berlin", 2025, 6, 7, 8, 0), "day", True, 3)
    ]


def test_nothing_is_due_when_the_current_shift_was_already_posted():
    rot = rotation("Europe/Berlin", *DAY_NIGHT)
    eight = local("Europe/Berlin", 2025, 6, 7, 8, 0)

    assert due_handovers(rot, eight, eight + dt.timedelta(hours=5)) == []


def test_a_new_rotation_gets_its_first_handover_at_a_change_not_for_the_past():
    rot = rotation("Europe/Berlin", *DAY_NIGHT)
    eight = local("Europe/Berlin", 2025, 6, 7, 8, 0)

    assert due_handovers(rot, None, eight + dt.timedelta(hours=3)) == []
    assert [d.shift_start for d in due_handovers(rot, None, eight + MINUTE)] == [eight]
