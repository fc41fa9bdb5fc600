"""The request card (Slack's message of a request, App Home's and a click's fallback)
writes its window and expiry in the display zone, saying which, as `/gpu request` does."""

from __future__ import annotations

import datetime as dt
import zoneinfo

from bot.request_card import request_card
from tests.unit.test_handover_checklist import request_view

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def facts(reply) -> dict[str, str]:
    return {f.label: f.value for section in reply.sections for f in section.facts}


def test_the_request_card_writes_its_window_and_expiry_in_the_display_zone_with_the_zone():
    view = request_view("req-7f3a2c", state="pending", window_start=dt.datetime(2026, 12, 5, 19, 42, tzinfo=UTC),
                        expires_at=dt.datetime(2026, 12, 6, 12, 0, tzinfo=UTC))

    card = facts(request_card(view, now=NOW, zone=zoneinfo.ZoneInfo("Europe/Berlin")))

    assert card["Window"] == "Sat 2026-12-05 20:42 CET - Sat 2026-12-05 22:42 CET"
    assert card["Expires"] == "2026-12-06 13:00 CET"


def test_an_open_ended_drain_window_reads_as_every_view_writes_it():
    view = request_view("req-7f3a2c", state="pending", window_start=dt.datetime(2026, 12, 5, 19, 42, tzinfo=UTC),
                        expires_at=dt.datetime(2026, 12, 6, 12, 0, tzinfo=UTC))
    view = view.__class__(**{**{f: getattr(view, f) for f in view.__dataclass_fields__}, "window_end": None})

    card = facts(request_card(view, now=NOW))

    assert card["Window"] == "Sat 2026-12-05 19:42 UTC until `/gpu drain done`"


def test_a_request_thread_writes_an_open_ended_drain_window_as_the_card_does():
    from workflows.requests import messages as say

    start = dt.datetime(2026, 12, 5, 19, 42, tzinfo=UTC)
    missed = say.thread_missed(request_id="req-7f3a2c", requester_name="alice", window_start=start,
                               window_end=None, now=NOW, zone=UTC)
    assert "its window (2026-12-05 19:42 UTC until `/gpu drain done`)" in missed
    extended = say.thread_extended(request_id="req-7f3a2c", actor="alice", window_end=None, plan_hash="0" * 64,
                                   voided=1, zone=UTC)
    assert "the window now lasts until `/gpu drain done` (plan" in extended
