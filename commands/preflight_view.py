"""The pre-flight of a plan as every kind's plan view shows it before approval (a dry
run's reply, the request's reply, its card and `/gpu request <id>`): one section, the
notes in the order the checks wrote them. Written once here so every kind shows the same."""

from __future__ import annotations

from commands.reply import Section
from workflows.plans import PlanSummary
from workflows.preflight import messages as say


def preflight_sections(summary: PlanSummary) -> tuple[Section, ...]:
    """The plan's pre-flight section; none for a plan whose checks found nothing."""
    if not summary.preflight:
        return ()
    return (Section(title=say.PREFLIGHT_TITLE,
                    bullets=tuple(say.preflight_line(note.severity, note.sentence) for note in summary.preflight)),)
