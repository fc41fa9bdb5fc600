"""Clicking a handover's Acknowledge button, through the same click path Slack and the
console use: someone on the incoming shift acknowledges it; anyone else is recorded
but does not count."""

from __future__ import annotations

import datetime as dt

from bot.clicks import Click, press
from bot.intents import action_id, action_of, encode_value
from commands.handover import handover_message
from storage import audit
from workflows.handover.service import HandoverService

UTC = dt.timezone.utc


def _posted(runtime, fleet, now):
    services = runtime.services()
    rotation = services.config.rotations[0]
    change = rotation.next_shift_change(now - dt.timedelta(days=1))
    shift = rotation.incoming_shift(change)
    handovers = HandoverService(services.database, services.config)
    checklist = handovers.checklist(rotation, shift, fleet=fleet, now=now)
    return handovers.post(rotation, shift.start, checklist, late=False, now=now), services


def test_the_incoming_shift_acknowledges_and_an_outsider_does_not_count(runtime, small_fleet):
    now = dt.datetime.now(UTC)
    view, services = _posted(runtime, small_fleet, now)
    members = next(s.members for s in services.config.rotations[0].shifts if s.name == view.shift)
    outsider = next(u for u in ("U0DAVE", "U0ALICE", "U0CAROL") if u not in members)
    reply = handover_message(view, services.config)
    (intent,) = [i for i in reply.intents if i.action == "handover-ack"]
    assert action_of(action_id(intent, 0)) == "handover-ack"

    by_outsider = press(Click(action="handover-ack", value=encode_value(intent.value),
                              actor=services.config.actor(outsider), now=now), services)
    assert by_outsider.ok and by_outsider.card is None
    assert "does not count" in by_outsider.notice.summary or "not on" in by_outsider.notice.summary

    by_member = press(Click(action="handover-ack", value=encode_value(intent.value),
                            actor=services.config.actor(members[0]), now=now), services)
    assert by_member.ok and by_member.card is not None
    stored = HandoverService(services.database, services.config).get(view.id)
    assert stored.acked_by == members[0]
    assert not any(i.action == "handover-ack" for i in by_member.card.intents)


def test_an_acknowledge_click_for_an_unknown_handover_is_refused(runtime):
    services = runtime.services()
    outcome = press(Click(action="handover-ack", value="999999", actor=services.config.actor("U0ALICE"),
                          now=dt.datetime.now(UTC)), services)
    assert not outcome.ok


def test_an_outsider_pressing_acknowledge_again_and_again_is_recorded_once(runtime, small_fleet):
    now = dt.datetime.now(UTC)
    view, services = _posted(runtime, small_fleet, now)
    members = next(s.members for s in services.config.rotations[0].shifts if s.name == view.shift)
    outsider = next(u for u in ("U0DAVE", "U0ALICE", "U0CAROL") if u not in members)
    audit_before = audit.head_of(services.database).seq

    outcomes = [press(Click(action="handover-ack", value=str(view.id), actor=services.config.actor(outsider),
                            now=now + dt.timedelta(seconds=i)), services) for i in range(5)]

    assert all(o.ok and "not on" in o.notice.summary for o in outcomes)
    stored = HandoverService(services.database, services.config).get(view.id)
    assert [(a.user, a.counted) for a in stored.acks] == [(outsider, False)]
    assert audit.head_of(services.database).seq == audit_before + 1
    assert [e.action for e in audit.recent(services.database, 1)] == ["handover.ack-recorded"]


def test_the_shift_acknowledging_twice_is_recorded_once_and_still_acknowledges(runtime, small_fleet):
    now = dt.datetime.now(UTC)
    view, services = _posted(runtime, small_fleet, now)
    member = next(s.members for s in services.config.rotations[0].shifts if s.name == view.shift)[0]

    first, again = (press(Click(action="handover-ack", value=str(view.id), actor=services.config.actor(member),
                                now=now), services) for _ in range(2))

    stored = HandoverService(services.database, services.config).get(view.id)
    assert stored.acked_by == member and [(a.user, a.counted) for a in stored.acks] == [(member, True)]
    assert first.card is not None and "acknowledged this handover already, at" in again.notice.summary
