"""A request as its Slack message (and the console) shows it: what it will do, who asked,
the approvals so far, and, while it waits, the Approve / Deny / Cancel buttons.

The buttons carry the request id and the plan hash shown on the card; approving
checks that hash again, so a card showing an old plan cannot approve a new one.
"""

from __future__ import annotations

import datetime as dt

from bot import messages as msg
from bot.intents import encode_value
from commands.preflight_view import preflight_sections
from commands.reply import Fact, Intent, Reply, Section
from workflows.requests import messages as say
from workflows.requests.views import RequestView
from workflows.wording import when


def _window(view: RequestView) -> str:
    if view.window_start is None:
        return msg.as_soon_as_approved()
    end = f" – {when(view.window_end)}" if view.window_end else ""
    return when(view.window_start) + end


def _targets(view: RequestView) -> str:
    targets = view.targets if isinstance(view.targets, (list, tuple)) else [view.targets]
    text = ", ".join(str(t) for t in targets)
    return text if len(text) <= 300 else text[:299] + "…"


def request_card(view: RequestView, *, now: dt.datetime) -> Reply:
    state = "expired" if view.is_expired(now) else view.state
    denial = view.denial
    facts = (
        Fact("State", say.state_phrase(state, denied_by=denial.approver_name if denial else None,
                                       deny_reason=denial.reason if denial else None)),
        Fact("Requested by", view.requester_name),
        *((Fact("Cluster", view.cluster),) if view.cluster else ()),
        Fact("Targets", _targets(view)),
        Fact("Window", _window(view)),
        Fact("Plan", msg.plan_line(view.short_hash, len(view.plan.nodes), len(view.plan.waves))),
        Fact("Approvals", msg.approvals_tally(view.approvals_counted, view.approvals_required,
                                             [a.approver_name for a in view.approvals if a.counts])),
        Fact("Expires", when(view.expires_at)),
    )
    intents: tuple[Intent, ...] = ()
    if state == "pending":
        value = encode_value(view.id, view.plan_hash)
        intents = (
            Intent(action="approve", label="Approve", value=value, style="primary"),
            Intent(action="deny", label="Deny", value=value, style="danger"),
            Intent(action="cancel", label="Cancel request", value=encode_value(view.id)),
        )
    notes = tuple(view.summary.notes)
    sections = [Section(facts=facts)]
    if notes:
        sections.append(Section(title="Plan notes", bullets=notes))
    sections += preflight_sections(view.summary)
    return Reply(title=msg.request_card_title(view.kind, view.id, view.pool), summary=view.reason,
                 sections=tuple(sections), intents=intents, visibility="in_channel")
