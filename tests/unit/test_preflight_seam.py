"""The pre-flight seam: notes every check returns ride in the plan's summary, are part of
the hash, and plans stored before pre-flight still decode and hash as they did."""

from __future__ import annotations

import datetime as dt

from commands.preflight_view import preflight_sections
from workflows.plans import (
    NodeStep,
    Plan,
    PlanSummary,
    PreflightNote,
    Wave,
    plan_from_json,
    plan_hash,
    plan_to_json,
)

UTC = dt.timezone.utc


def _plan(summary: PlanSummary) -> Plan:
    return Plan(kind="drain", pool="serving-a", created_for="U0ALICE", summary=summary,
                waves=(Wave(0, ("n1",), (NodeStep("cordon", "n1", {}),)),))


def test_a_plan_stored_before_pre_flight_decodes_and_keeps_its_hash():
    old = _plan(PlanSummary(window_end=dt.datetime(2026, 12, 6, 4, tzinfo=UTC), notes=("one wave",)))
    stored = plan_to_json(old)
    assert "preflight" not in stored["summary"]  # what plans written before look like
    again = plan_from_json(stored)
    assert again.summary.preflight == ()
    assert plan_hash(again) == plan_hash(old)


def test_pre_flight_notes_round_trip_and_change_the_hash_an_approver_approves():
    note = PreflightNote(check="nodes", code="left-out", severity="critical", sentence="n2 is left out",
                         nodes=("n2",), details=("advertised-mismatch: 7 of 8",))
    bare = _plan(PlanSummary())
    checked = _plan(PlanSummary().with_preflight(note))
    assert plan_hash(checked) != plan_hash(bare)
    assert plan_from_json(plan_to_json(checked)) == checked
    assert plan_from_json(plan_to_json(checked)).summary.preflight == (note,)


def test_the_plan_view_shows_one_pre_flight_section_with_what_matters_marked():
    summary = PlanSummary().with_preflight(
        PreflightNote(check="nodes", code="left-out", severity="critical", sentence="n2 is left out"),
        PreflightNote(check="nodes", code="fixed-by-change", severity="info", sentence="n3 stays in"))
    (section,) = preflight_sections(summary)
    assert section.title == "Pre-flight"
    assert section.bullets == ("Critical: n2 is left out", "n3 stays in")
    assert preflight_sections(PlanSummary()) == ()
