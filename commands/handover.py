"""Shift handover: /gpu handover [rotation] shows the checklist for the shift on duty now;
/gpu handover history [rotation] [n] lists past handovers and who acknowledged them.

`render_checklist` turns a checklist into the Reply the bot posts at each shift change
(with the Acknowledge button): straight from the checklist's values in gpuops's own
layout, or from the lines a rotation's own template writes (`ChecklistTemplate` documents
them); `handover_message` does it for a stored handover, which is what the notifier needs
for the post and for the update after the acknowledgement.
Read-only towards the cluster; the commands need the viewer role.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from commands import messages as msg
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import Intent, Notice, Reply, Section, Table
from workflows.access import Role
from workflows.config import GpuopsConfig
from workflows.handover import messages as say
from workflows.handover.checklist import Checklist, ChecklistItem
from workflows.handover.layout import ChecklistTemplate, TemplateProblem
from workflows.handover.rotations import RotationConfig
from workflows.handover.service import HandoverService, HandoverView, UnknownRotation
from workflows.wording import when

ACK_ACTION = "handover-ack"
HISTORY_DEFAULT = 10
HISTORY_MOST = 100
HISTORY_COLUMNS = ("shift start", "shift", "posted", "acknowledged by", "at", "acks")

log = logging.getLogger("gpuops.commands.handover")

_ITEM = re.compile(r"^\*\s*(critical|warning|info):\s*(.*)$")


# --------------------------------------------------------------------------------------
# The checklist as a Reply


@dataclass
class _Layout:
    """The checklist as a message, before the acknowledgement is added."""

    title: str
    summary: list[str] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    footer: list[str] = field(default_factory=list)


def render_checklist(
    checklist: Checklist, template: ChecklistTemplate | None = None, *, handover: HandoverView | None = None,
    runbook: Callable[[str | None], str | None] | None = None,
) -> Reply:
    """The checklist as its message: in gpuops's own layout, or in the lines a rotation's
    own `template` writes (what it receives and writes: `ChecklistTemplate`). A template
    that fails on this checklist is not the shift's problem: the checklist is shown in
    gpuops's own layout, saying the template failed and why. With the stored `handover`,
    the reply carries the Acknowledge button until someone on the incoming shift has
    acknowledged, and says who did. `runbook` gives a finding's runbook link from its code
    (`GpuopsConfig.finding_runbook_url`), in gpuops's own layout."""
    if template is None:
        layout = _own_layout(checklist, runbook=runbook)
    else:
        try:
            layout = _template_layout(checklist, template)
        except TemplateProblem as problem:
            log.error(say.template_failed_log(checklist.rotation, str(problem)))
            layout = _own_layout(checklist, runbook=runbook)
            layout.sections.insert(0, Section(notices=(
                Notice(severity="warning", text=say.template_failed(str(problem))),)))
    footer = layout.footer
    intents: tuple[Intent, ...] = ()
    if handover is not None:
        zone = checklist.zone
        if handover.acked_by_name is not None and handover.acked_at is not None:
            footer.insert(0, say.acknowledged_footer(name=handover.acked_by_name,
                                                     at=handover.acked_at, zone=zone))
        else:
            footer.insert(0, say.not_acknowledged_footer(shift=handover.shift))
            intents = (Intent(action=ACK_ACTION, label="Acknowledge", value=str(handover.id),
                              style="primary"),)
        if handover.audit_head is not None:
            footer.append(say.audit_head_footer(handover.audit_head))
    return Reply(
        title=layout.title,
        summary="\n".join(layout.summary) or None,
        sections=tuple(layout.sections),
        intents=intents,
        visibility="in_channel",
        footer=" · ".join(footer) or None,
        extra={"handover_id": handover.id} if handover is not None else {},
    )


def _own_layout(checklist: Checklist, *, runbook: Callable[[str | None], str | None] | None = None) -> _Layout:
    """gpuops's own layout, from the checklist's values: what needs action first, then
    what went wrong, what is in flight, this shift's windows, what changed, the rest."""
    zone = checklist.zone
    summary = [say.checklist_counts(
        needs_action=len(checklist.needs_action), gone_wrong=len(checklist.failures),
        in_flight=len(checklist.in_flight), windows=len(checklist.coming_up),
        start=checklist.shift_start, end=checklist.shift_end, zone=zone)]
    if checklist.late:
        summary.append(say.posted_late(shift_start=checklist.shift_start, generated_at=checklist.generated_at,
                                       missed=checklist.missed, zone=zone))
    elif checklist.missed:
        summary.append(say.handovers_missed(checklist.missed))

    def items(title: str, listed: tuple[ChecklistItem, ...]) -> list[Section]:
        return [Section(title=title, notices=tuple(
            Notice(severity=i.severity, text=i.text, command=i.command or None,
                   runbook=runbook(i.code) if runbook is not None and i.kind == "finding" else None)
            for i in listed))] if listed else []

    changes = checklist.changes
    if changes is None:
        changed = [say.no_earlier_handover()]
    elif not (changes.new or changes.resolved):
        changed = [say.no_changes_since(changes.since, zone)]
    else:
        changed = [*(say.finding_new(code=i.code, subject=i.subject, command=i.command) for i in changes.new),
                   *(say.finding_resolved(i.text) for i in changes.resolved)]
    drains = [say.pool_last_drain(pool=d.pool, text=d.text, command=d.command) for d in checklist.last_drains]
    cluster = checklist.cluster
    sections = [
        *items(say.NEEDS_ACTION, checklist.needs_action),
        *items(say.GONE_WRONG, checklist.failures),
        *items(say.IN_FLIGHT, checklist.in_flight),
        *items(say.WINDOWS, checklist.coming_up),
        Section(title=say.SINCE_LAST, bullets=tuple(changed)),
        *items(say.ALSO_WORTH_KNOWING, checklist.for_information),
        Section(title=say.LAST_DRAINS, bullets=tuple(drains or [say.no_pools()])),
        Section(title=say.CLUSTER_TITLE, bullets=(say.cluster_line(
            operator=cluster.operator, cluster_policy=cluster.cluster_policy, owner=cluster.owner),)),
    ]
    return _Layout(title=say.checklist_title(shift=checklist.shift, team=checklist.team), summary=summary,
                   sections=sections, footer=[say.past_handovers(checklist.history_command)])


def _template_layout(checklist: Checklist, template: ChecklistTemplate) -> _Layout:
    """The lines a rotation's own template writes, read as `ChecklistTemplate` documents
    them. Raises TemplateProblem when the template fails on this checklist."""
    layout = _Layout(title=say.default_title(checklist.shift))
    drafts: list[_SectionDraft] = []
    for raw in template.render(checklist).splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("## "):
            drafts.append(_SectionDraft(title=line[3:].strip()))
        elif line.startswith("# "):
            layout.title = line[2:].strip()
        elif line.startswith("~ "):
            layout.footer.append(line[2:].strip())
        elif not drafts:
            layout.summary.append(line)
        else:
            drafts[-1].add(line)
    layout.sections = [d.section() for d in drafts]
    return layout


class _SectionDraft:
    def __init__(self, title: str) -> None:
        self.title = title
        self.text: list[str] = []
        self.notices: list[Notice] = []
        self.bullets: list[str] = []

    def add(self, line: str) -> None:
        item = _ITEM.match(line)
        if item is not None:
            severity, rest = item.groups()
            text, _, command = rest.rpartition(" | ")
            if not text or not command.startswith("/gpu"):
                text, command = rest, ""
            self.notices.append(Notice(severity=severity, text=text.strip(),  # type: ignore[arg-type]  # _ITEM matches a Severity only
                                       command=command.strip() or None))
        elif line.startswith("- "):
            self.bullets.append(line[2:].strip())
        else:
            self.text.append(line)

    def section(self) -> Section:
        return Section(title=self.title, text="\n".join(self.text) or None,
                       notices=tuple(self.notices), bullets=tuple(self.bullets))


def handover_message(view: HandoverView, config: GpuopsConfig) -> Reply:
    """A stored handover as its Slack message: the checklist as posted, and its
    acknowledgement as it stands now."""
    rotation = next((r for r in config.rotations if r.name == view.rotation), None)
    template = rotation.checklist_template if rotation is not None else None
    return render_checklist(view.checklist, template, handover=view, runbook=config.finding_runbook_url)


# --------------------------------------------------------------------------------------
# Commands


@REGISTRY.command("handover", usage="handover [rotation]", role=Role.VIEWER, changes=False,
                  summary="The shift handover checklist now: what needs action, what is in flight",
                  examples=("/gpu handover", "/gpu handover gpu-oncall"))
def handover(call: Call, args: list[str]) -> Reply:
    if len(args) > 1:
        raise UsageError(say.handover_usage(len(args)))
    service = _service(call)
    rotation = _rotation(service, args[0] if args else None)
    shift = rotation.current_shift(call.now)
    fleet = call.services.fleet.fleet(call.now)
    checklist = service.checklist(rotation, shift, fleet=fleet, now=call.now)
    return render_checklist(checklist, rotation.checklist_template,
                            handover=service.for_shift(rotation.name, shift.start),
                            runbook=call.services.config.finding_runbook_url)


@REGISTRY.command("handover history", usage="handover history [rotation] [n]", role=Role.VIEWER, changes=False,
                  summary="Past handovers: when, late or not, who acknowledged",
                  examples=("/gpu handover history", "/gpu handover history gpu-oncall 20"))
def history(call: Call, args: list[str]) -> Reply:
    name: str | None = None
    count = HISTORY_DEFAULT
    for arg in args:
        if arg.isdigit() and not arg.isascii():
            raise UsageError(say.history_usage())
        if arg.isascii() and arg.isdigit():
            count = int(arg)
            if not 1 <= count <= HISTORY_MOST:
                raise UsageError(say.history_count(count, most=HISTORY_MOST))
        elif name is None:
            name = arg
        else:
            raise UsageError(say.history_usage())
    service = _service(call)
    rotation = _rotation(service, name)
    views = service.history(rotation.name, count)
    title = say.history_title(rotation.name)
    if not views:
        return Reply(title=title, summary=say.no_history())
    rows = tuple(_history_row(v, rotation) for v in views)
    acked = sum(v.acknowledged for v in views)
    late = sum(v.late for v in views)
    return Reply(title=title,
                 summary=say.history_summary(len(views), acknowledged=acked, late=late),
                 sections=(Section(table=Table(columns=HISTORY_COLUMNS, rows=rows)),))


def _history_row(view: HandoverView, rotation: RotationConfig) -> tuple[str, ...]:
    acked_at = when(view.acked_at, rotation.zone, style="day") if view.acked_at else "-"
    return (when(view.shift_start, rotation.zone, style="day"), view.shift,
            say.history_posted(late=view.late, missed=view.missed, in_slack=view.ts is not None),
            view.acked_by_name or say.nobody_yet(), acked_at,
            say.history_acks(counted=view.counted_acks, not_counted=len(view.acks) - view.counted_acks))


def _service(call: Call) -> HandoverService:
    services = call.services
    service = getattr(services, "handovers", None)
    if service is not None:
        return service
    database = getattr(services, "database", None)
    if database is None:
        raise NotFoundError(msg.not_available("Handovers"))
    return HandoverService(database, services.config, signals=services.signals,
                           others=services.clusters.others if services.clusters is not None else None)


def _rotation(service: HandoverService, name: str | None) -> RotationConfig:
    try:
        return service.rotation(name)
    except UnknownRotation as err:
        raise NotFoundError(str(err)) from None
