"""Shift handover rotations: who is on shift when, and which shift changes are due.

A rotation is configured once (`RotationConfig`, validated at start) and then asked
questions that take the time as an argument; nothing here reads the clock:

- `next_shift_change(after)`, `shift_changes_between(a, b)`: when shifts change;
- `current_shift(now)`, `incoming_shift(change)`: which shift is (or comes) on duty;
- `due_handovers(rotation, last_posted_shift_start, now)`: what the scheduler should post.

Each shift starts by a cron rule ("minute hour day-of-month month day-of-week", parsed by
APScheduler's `CronTrigger`) read as wall-clock time in the rotation's time zone.

The DST rule. Cron rules are matched against local wall-clock times; each matching wall
time becomes one instant:

- a wall time that happens twice (fall back: 01:30 in New York on the first Sunday of
  November) is the FIRST occurrence, so the change fires once, before the clocks go back;
- a wall time that never happens (spring forward: 02:30 in New York on the second Sunday
  of March) is the moment the clocks jump past it (03:00 local, the first instant at which
  the local clock reads the rule's time or later), so the change fires once, not never.

Two rules that land on the same instant make one change; the shift listed first wins.

Templates: a rotation may name its own Jinja2 template for its checklist (what it receives
and writes: `layout.ChecklistTemplate`); without one, gpuops lays the checklist out
itself. Each template is compiled and rendered once against a sample checklist when the
configuration loads, so a bad template stops the start with its file, line and reason.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from apscheduler.triggers.cron import CronTrigger
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from workflows.durations import Duration
from workflows.handover.layout import ChecklistTemplate, TemplateProblem, load_template
from workflows.pools.windows import UTC, parse_zone

# A handover posted within this long after its shift change is on time; later, it says
# it is late. The scheduler ticks every minute, so a few minutes of slack is enough.
ON_TIME_WITHIN = dt.timedelta(minutes=5)
# How far back `due_handovers` counts missed changes (after a month down, "missed" is
# a lower bound).
MISSED_LOOKBACK = dt.timedelta(days=31)
# How far back `current_shift` looks for the last change, widening until it finds one; a
# rule that fires less often than every four years is refused at start.
_CURRENT_LOOKBACKS = tuple(dt.timedelta(days=d) for d in (2, 9, 32, 367, 4 * 366 + 1))
# Rotation names share `/gpu handover <rotation>` with this subcommand.
RESERVED_ROTATION_NAMES = frozenset({"history"})
# Wall-time searches start this much before the wall time of the instant asked about, so
# a rule matching just before a DST jump (which can map to a later instant) is not missed.
_DST_MARGIN = dt.timedelta(hours=3)
GROUP_PREFIX = "group:"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_MEMBER = re.compile(r"^(group:)?[A-Z0-9][A-Z0-9_-]*$")



class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------
# Configuration


class ShiftConfig(_Model):
    """One shift of a rotation: when it starts and who is on it."""

    name: str = Field(description=(
        "The shift's name, as the checklist says it."))
    # Cron rule for the shift's start, in the rotation's time zone: "0 8 * * mon-fri".
    starts: str
    # Slack user ids ("U0ALICE") and user groups ("group:S0NIGHT"); only their
    # acknowledgement counts for a handover to this shift.
    members: tuple[str, ...]

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("a shift needs a name")
        return name.strip()

    @field_validator("starts")
    @classmethod
    def _cron(cls, rule: str) -> str:
        _parse_cron(rule)
        return rule

    @field_validator("members")
    @classmethod
    def _members(cls, members: tuple[str, ...]) -> tuple[str, ...]:
        if not members:
            raise ValueError("a shift needs at least one member, or nobody's acknowledgement counts")
        for member in members:
            if not _MEMBER.match(member):
                raise ValueError(
                    f"{member!r} is neither a Slack user id (U0ALICE) nor a user group (group:S0NIGHT)"
                )
        return members

    def includes(self, user_id: str, groups: Iterable[str] = ()) -> bool:
        """Whether this user (in these Slack user groups) is on the shift."""
        return is_member(self.members, user_id, groups)

    def wall_starts_from(self, wall: dt.datetime) -> Iterator[dt.datetime]:
        """Naive wall-clock start times at or after the naive wall time `wall`, in order."""
        # Naive wall times are evaluated as if in UTC, which has no DST: every wall time
        # exists exactly once there, and the rotation's zone is applied afterwards.
        trigger = _parse_cron(self.starts)
        cursor = wall.replace(tzinfo=UTC)
        while True:
            fire = trigger.get_next_fire_time(None, cursor)
            if fire is None:
                return
            yield fire.replace(tzinfo=None)
            cursor = fire + dt.timedelta(seconds=1)


class RotationConfig(_Model):
    """A team's on-call rotation: where its handovers go and how they are chased."""

    name: str = Field(description=(
        "The rotation's name (`/gpu handover <rotation>`)."))
    team: str = Field(description=(
        "The team the rotation belongs to, as the checklist names it."))
    # The Slack channel the checklist is posted to (an id like C0GPUOPS).
    channel: str
    # An IANA zone; shift rules are read as wall-clock times there.
    timezone: str = "UTC"
    shifts: tuple[ShiftConfig, ...] = Field(min_length=1, description=(
        "The rotation's shifts, at least one."))
    # Nobody on the incoming shift acknowledged this long after the post: remind them in
    # the thread; still nobody `escalate_after` the reminder: mention `escalation`.
    ack_timeout: Duration = dt.timedelta(minutes=30)
    escalate_after: Duration = Field(default=dt.timedelta(minutes=30), description=(
        "How long after the reminder nobody acknowledged before `escalation` is mentioned."))
    # A Slack user id or "group:S0123"; None: remind only.
    escalation: str | None = None
    # A Jinja2 template for the checklist (absolute, or relative to the configuration
    # file's folder when the loader says where that is, else to the working directory).
    template: Path | None = None

    _zone: zoneinfo.ZoneInfo = PrivateAttr()
    _template: ChecklistTemplate | None = PrivateAttr()

    @field_validator("name")
    @classmethod
    def _rotation_name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(
                f"{name!r} is not a rotation name: use lower-case letters, digits and dashes"
            )
        if name in RESERVED_ROTATION_NAMES:
            raise ValueError(f"{name!r} is a /gpu handover subcommand; name the rotation otherwise")
        return name

    @field_validator("timezone")
    @classmethod
    def _zone_name(cls, name: str) -> str:
        parse_zone(name)
        return name

    @field_validator("ack_timeout", "escalate_after")
    @classmethod
    def _positive(cls, value: dt.timedelta) -> dt.timedelta:
        if value <= dt.timedelta(0):
            raise ValueError("must be longer than zero")
        return value

    @field_validator("escalation")
    @classmethod
    def _target(cls, target: str | None) -> str | None:
        if target is not None and not _MEMBER.match(target):
            raise ValueError(
                f"{target!r} is neither a Slack user id (U0LEAD) nor a user group (group:S0LEADS)"
            )
        return target

    @field_validator("template")
    @classmethod
    def _template_path(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        if path is None:
            return path
        if not path.is_absolute():
            folder = (info.context or {}).get("config_dir")
            path = Path(folder) / path if folder else path
        try:
            load_template(path)  # compiled once; `model_post_init` takes it from the cache
        except TemplateProblem as problem:
            raise ValueError(str(problem)) from None
        return path

    @model_validator(mode="after")
    def _shift_names_unique(self) -> RotationConfig:
        names = [s.name for s in self.shifts]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"shift names must be unique; repeated: {', '.join(repeated)}")
        return self

    def model_post_init(self, context: Any) -> None:
        self._zone = parse_zone(self.timezone)
        self._template = None if self.template is None else load_template(self.template)

    # -------------------------------------------------------------- reading

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return self._zone

    @property
    def checklist_template(self) -> ChecklistTemplate | None:
        """The rotation's own compiled checklist template; None: gpuops's own layout."""
        return self._template

    def shift_named(self, name: str) -> ShiftConfig | None:
        return next((s for s in self.shifts if s.name == name), None)

    # -------------------------------------------------------------- the schedule

    def next_shift_change(self, after: dt.datetime) -> ShiftChange:
        """The first shift change strictly after `after`."""
        _aware(after, "after")
        best: ShiftChange | None = None
        for shift in self.shifts:
            for wall in shift.wall_starts_from(self._wall(after) - _DST_MARGIN):
                at = local_instant(wall, self._zone)
                if at > after:
                    if best is None or at < best.at:  # on a tie the shift listed first stays
                        best = ShiftChange(at=at, shift=shift)
                    break
        if best is None:  # pragma: no cover - configuration refuses rules that never fire
            raise ValueError(f"rotation {self.name} has no shift change after {after.isoformat()}")
        return best

    def shift_changes_between(self, a: dt.datetime, b: dt.datetime) -> list[ShiftChange]:
        """Every shift change `c` with a < c.at <= b, oldest first, one per instant."""
        _aware(a, "a")
        _aware(b, "b")
        found: dict[dt.datetime, ShiftChange] = {}
        for shift in self.shifts:  # listed order: the first shift keeps a shared instant
            for wall in shift.wall_starts_from(self._wall(a) - _DST_MARGIN):
                at = local_instant(wall, self._zone)
                if at > b:
                    break
                if at > a:
                    found.setdefault(at, ShiftChange(at=at, shift=shift))
        return [found[at] for at in sorted(found)]

    def current_shift(self, now: dt.datetime) -> ShiftOnDuty:
        """The shift on duty at `now`: the one that started at the last change <= now."""
        _aware(now, "now")
        for lookback in _CURRENT_LOOKBACKS:
            changes = self.shift_changes_between(now - lookback, now)
            if changes:
                return self.incoming_shift(changes[-1])
        raise ValueError(f"rotation {self.name} had no shift change in the four years before {now}")

    def incoming_shift(self, change: ShiftChange | dt.datetime) -> ShiftOnDuty:
        """The shift that takes over at `change` (a change, or the instant of one), with
        the instant it hands over to the next."""
        at = change.at if isinstance(change, ShiftChange) else change
        _aware(at, "change")
        found = self.shift_changes_between(at - dt.timedelta(microseconds=1), at)
        if not found:
            raise ValueError(f"no shift of rotation {self.name} starts at {at.isoformat()}")
        return ShiftOnDuty(shift=found[0].shift, start=at, end=self.next_shift_change(at).at)

    def _wall(self, at: dt.datetime) -> dt.datetime:
        return at.astimezone(self._zone).replace(tzinfo=None)


@dataclass(frozen=True, slots=True)
class ShiftChange:
    """The instant (UTC) one shift hands over to `shift`."""

    at: dt.datetime
    shift: ShiftConfig


@dataclass(frozen=True, slots=True)
class ShiftOnDuty:
    """A shift's stint: from `start` until the next change at `end`."""

    shift: ShiftConfig
    start: dt.datetime
    end: dt.datetime

    @property
    def name(self) -> str:
        return self.shift.name

    def contains(self, at: dt.datetime) -> bool:
        return self.start <= at < self.end


@dataclass(frozen=True, slots=True)
class DueHandover:
    """A handover the scheduler should post now. `late`: posted more than
    `ON_TIME_WITHIN` after its shift change; `missed`: earlier changes since the last
    post that get no checklist of their own."""

    shift_start: dt.datetime
    late: bool
    shift: ShiftOnDuty
    missed: int = 0


def due_handovers(
    rotation: RotationConfig, last_posted_shift_start: dt.datetime | None, now: dt.datetime
) -> list[DueHandover]:
    """What to post for `rotation` at `now`, given the latest shift start already stored.

    At most one: if several changes were missed (the bot was down), only the latest is
    posted, and it says how many were missed. With nothing stored yet (a new rotation),
    only a change that happened within `ON_TIME_WITHIN` is due: gpuops cannot have
    missed changes from before it ran the rotation.
    """
    _aware(now, "now")
    if last_posted_shift_start is None:
        since = now - ON_TIME_WITHIN
    else:
        since = max(last_posted_shift_start, now - MISSED_LOOKBACK)
    changes = rotation.shift_changes_between(since, now)
    if not changes:
        return []
    latest = changes[-1]
    return [
        DueHandover(
            shift_start=latest.at,
            late=now - latest.at > ON_TIME_WITHIN,
            shift=rotation.incoming_shift(latest),
            missed=len(changes) - 1,
        )
    ]


# --------------------------------------------------------------------------------------
# Members: Slack user ids ("U0ALICE") and user groups ("group:S0NIGHT")


def is_member(members: Iterable[str], user_id: str, groups: Iterable[str] = ()) -> bool:
    """Whether a user, in these Slack user groups, is one of `members`."""
    users, member_groups = split_members(members)
    return user_id in users or any(g in member_groups for g in groups)


def split_members(members: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(user ids, user group ids) of a member list."""
    listed = tuple(members)
    return (tuple(m for m in listed if not m.startswith(GROUP_PREFIX)),
            tuple(m.removeprefix(GROUP_PREFIX) for m in listed if m.startswith(GROUP_PREFIX)))


# --------------------------------------------------------------------------------------
# Time zones and cron rules


def local_instant(wall: dt.datetime, zone: zoneinfo.ZoneInfo) -> dt.datetime:
    """The UTC instant of naive wall-clock time `wall` in `zone`, by the DST rule in the
    module docstring: the first of two, or the jump past a wall time that never happens."""
    first = wall.replace(tzinfo=zone, fold=0)
    at = first.astimezone(UTC)
    if at.astimezone(zone).replace(tzinfo=None) == wall:
        return at
    # In a spring-forward gap (PEP 495): fold=1 reads the wall time with the offset in
    # force after the jump, which lands before it; fold=0 with the earlier offset, after it.
    # Between them, find the first second whose wall time is `wall` or later: the jump.
    low = int(wall.replace(tzinfo=zone, fold=1).astimezone(UTC).timestamp())
    high = int(at.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if dt.datetime.fromtimestamp(middle, zone).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle
    return dt.datetime.fromtimestamp(high, UTC)


@lru_cache(maxsize=256)
def _parse_cron(rule: str) -> CronTrigger:
    fields = rule.split()
    if len(fields) != 5:
        raise ValueError(
            f"{rule!r} is not a cron rule: write 5 fields, minute hour day-of-month month "
            'day-of-week, e.g. "0 8 * * mon-fri"'
        )
    if any(ch.isdigit() for ch in fields[4]):
        # APScheduler numbers weekdays from Monday (0), cron from Sunday (0): a number
        # would silently move every shift by a day.
        raise ValueError(
            f"{rule!r}: write the day of week with names (mon-fri, sat,sun), not numbers: "
            "cron and APScheduler number the days differently"
        )
    try:
        trigger = CronTrigger.from_crontab(rule, timezone=UTC)
    except ValueError as err:
        raise ValueError(f"{rule!r} is not a cron rule: {err}") from None
    probe = dt.datetime(2000, 1, 1, tzinfo=UTC)
    first = trigger.get_next_fire_time(None, probe)
    if first is None or first - probe > dt.timedelta(days=4 * 366 + 1):
        raise ValueError(f"{rule!r} never fires (check the day and month)")
    return trigger


EXAMPLE_TEMPLATE = Path(__file__).with_name("templates") / "handover.md.j2"


def example_template() -> ChecklistTemplate:
    """gpuops's own layout written as a rotation's template would write it: where a team's
    own template can start (a test keeps the two the same)."""
    return load_template(EXAMPLE_TEMPLATE)


def _aware(at: dt.datetime, what: str) -> None:
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, not {at!r}")
