"""Drains: /gpu drain (request a drain window), /gpu drain done (end it early) and
/gpu drain extend (ask for more time: a drain not started yet is re-planned and approved
again; a running drain whose run holds its nodes gets a later window end, at once on a
pool that needs no approval for drains, else once the pool's approvers approve it).

The words of a drain are read by `commands.drain_grammar` into a `DrainAsk` (the drain
form submits one too, through `request_drain`); one call to the drain use case
(`DrainService.request`) plans it against the pool's policy and the open requests and
stores it as a pending request. The reply shows the plan first: nodes per wave, what
will be evicted and which PDBs select it, the capacity left while each wave is out, and
the window; then the request id with Approve/Deny. Bad words answer with usage; a drain
the policy forbids is refused naming the rule and what would fit. Nothing is stored then.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from commands import messages as msg
from commands.preflight_view import preflight_sections
from commands.drain_grammar import read_drain_words
from commands.kinds import RequestButton, request_button
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import REQUEST_DRAIN, Fact, Reply, Section, Table, error_reply
from commands.requests import approval_intents
from workflows.access import AccessDenied, Role
from workflows.drain.plan import DrainAsk, DrainPlan, DrainRefused, DrainRequestError
from workflows.drain.service import DrainRequested, DrainService
from workflows.durations import parse_duration
from workflows.fleet.summary import Fleet
from workflows.engine.runs import RunRefused, RunService
from workflows.requests import messages as request_say
from workflows.requests.errors import RequestRefused, UnknownRequest
from workflows.requests.views import RequestView
from workflows.wording import local_time, when


def _drains(call: Call) -> DrainService:
    drains = call.services.change("drain", DrainService)
    if drains is None:
        raise NotFoundError(msg.not_available("Requests"))
    return drains


def _runs(call: Call) -> RunService:
    if call.services.runs is None:
        raise NotFoundError(msg.not_available("Runs"))
    return call.services.runs


def _refused(err: DrainRefused) -> Reply:
    # The reason names the rule, the numbers and, when one was found, the first time
    # the same drain fits (`fits_at`).
    return error_reply(msg.drain_refused_title(err.code), err.reason)


def _drain_sections(planned: DrainPlan, *, workloads_known: bool) -> list[Section]:
    spec, preview = planned.spec, planned.preview
    end = local_time(spec.end, spec.zone) if spec.end is not None else None
    waves = Section(title="Waves", table=Table(columns=msg.DRAIN_WAVE_COLUMNS, rows=tuple(
        (str(w.index + 1), ", ".join(w.nodes), str(w.gpus_out),
         msg.drain_wave_capacity(w.unavailable_nodes, preview.allowed_unavailable),
         msg.drain_ready_gpus(w.ready_gpus, preview.min_ready_gpus))
        for w in preview.waves)), bullets=planned.plan.summary.notes)
    facts = (Fact("Window", msg.drain_window(local_time(spec.start, spec.zone), end)),
             Fact("Pool", f"{preview.pool}: {preview.pool_nodes} nodes, {preview.ready_gpus_now} GPUs ready now"))
    rows = tuple((n.node, w.ref, str(w.gpus), w.owner or "-", ", ".join(w.pdbs) or "-")
                 for n in preview.nodes for w in n.workloads)
    evicted = (Section(title="To be evicted", table=Table(columns=msg.DRAIN_WORKLOAD_COLUMNS, rows=rows))
               if rows else Section(title="To be evicted", text=msg.drain_no_workloads(workloads_known)))
    sections = [Section(facts=facts), waves, evicted, *preflight_sections(planned.plan.summary)]
    if preview.pdbs:
        sections.append(Section(title="PodDisruptionBudgets", bullets=tuple(
            msg.drain_pdb_line(p.ref, p.disruptions_allowed, len(p.pods), p.may_block) for p in preview.pdbs)))
    return sections


def _request_facts(view: RequestView) -> Section:
    return Section(facts=(Fact("Request", view.id), Fact("Requested by", view.requester_name),
                          Fact("Reason", view.reason or "-"), Fact("Plan hash", view.plan_hash)))


def _drain_reply(call: Call, done: DrainRequested, *, title: str | None = None) -> Reply:
    view = done.view
    sections = [*_drain_sections(done.planned, workloads_known=_drains(call).reads_workloads), _request_facts(view)]
    return Reply(title=title or msg.drain_title(view.id, view.pool),
                 summary=msg.drain_summary(view.state, view.approvals_counted, view.approvals_required,
                                           view.short_hash),
                 sections=tuple(sections), intents=approval_intents(view, call.actor))


def request_drain(call: Call, ask: DrainAsk) -> Reply:
    """Plan, check and store the drain `ask` describes, and the reply showing it: what
    `/gpu drain` does after reading its words, and what the drain form does with its fields."""
    fleet = call.services.fleet.fleet(call.now)
    return _answer(call, lambda: _drains(call).request(call.actor, ask, fleet=fleet, now=call.now,
                                                        channel=call.channel))


def _answer(call: Call, planned: Callable[[], DrainRequested], *, title: str | None = None) -> Reply:
    """The reply to a drain planned and stored by `planned`, or to its refusal: words
    that do not name a drain are a usage error, a policy or request refusal its reason;
    a missing role goes to the dispatcher's door."""
    try:
        done = planned()
    except DrainRequestError as err:
        raise UsageError(err.reason) from None
    except DrainRefused as err:
        return _refused(err)
    except AccessDenied:
        raise
    except RequestRefused as err:
        return error_reply(msg.refused_title(), str(err))
    return _drain_reply(call, done, title=title)


# "Request a drain" of a pool, or of one node.
request_button(RequestButton(kind="drain", action=REQUEST_DRAIN, label=msg.request_drain_label(), on_nodes=True))

@REGISTRY.command("drain", usage=msg.DRAIN_USAGE,
                  role=Role.OPERATOR, summary="Ask for a drain window: plan, policy check, then approvals",
                  examples=("/gpu drain gpu-a-01 gpu-a-02 at sat 02:00 for 2h NIC swap",
                            "/gpu drain train-a next-window firmware"), kind="drain")
def drain(call: Call, args: list[str]) -> Reply:
    if not args:
        raise UsageError(msg.drain_needs_target())
    fleet = call.services.fleet.fleet(call.now)
    try:
        ask = read_drain_words(args, fleet=fleet, pools=call.services.config.pools, now=call.now)
    except DrainRequestError as err:
        raise UsageError(err.reason) from None
    return request_drain(call, ask)


@REGISTRY.command("drain done", usage="drain done <id>", role=Role.OPERATOR,
                  summary="End a drain window early: the nodes are validated and uncordoned",
                  examples=("/gpu drain done req-7f3a2c",), kind="drain")
def drain_done(call: Call, args: list[str]) -> Reply:
    # The run service checks the rest: the requester, an operator of the pool or an admin.
    if len(args) != 1:
        raise UsageError(msg.name_one("drain request, e.g. `/gpu drain done req-7f3a2c`"))
    request = _drain_request(call, args[0])
    try:
        run = _runs(call).release_hold(call.actor, request.id, now=call.now)
    except AccessDenied:
        raise  # the dispatcher says who may act on the pool
    except RunRefused as err:
        return error_reply(msg.refused_title(), str(err))
    rows = tuple((str(s.wave + 1), s.node, s.kind, s.state) for s in run.steps if s.kind == "hold")
    return Reply(title=msg.drain_done_title(run.id), visibility="in_channel",
                 sections=(Section(table=Table(columns=msg.STEP_COLUMNS[:4], rows=rows)),))


@REGISTRY.command("drain extend", usage="drain extend <id> <duration>", role=Role.OPERATOR,
                  summary="Ask for more time: re-planned before the run; while it holds, a later end as the pool approves",
                  examples=("/gpu drain extend req-7f3a2c 2h",), kind="drain")
def drain_extend(call: Call, args: list[str]) -> Reply:
    if len(args) != 2:
        raise UsageError(msg.drain_extend_usage())
    request = _drain_request(call, args[0])
    if request.state not in ("pending", "approved", "scheduled", "running"):
        return error_reply(msg.refused_title(), request_say.not_extendable(request.id, state=request.state))
    try:
        more = parse_duration(args[1])
    except ValueError:
        raise UsageError(msg.bad_duration(args[1])) from None
    if more <= dt.timedelta(0):
        raise UsageError(msg.bad_duration(args[1]))
    if request.window_end is None or request.window_start is None:
        return error_reply(msg.refused_title(), msg.drain_extend_open_ended(request.id))
    fleet = call.services.fleet.fleet(call.now)
    if request.state == "running":
        return _extend_running(call, request, more, fleet=fleet)
    return _answer(call, lambda: _drains(call).extend(call.actor, request, more, fleet=fleet, now=call.now),
                   title=msg.drain_extended_title(request.id))


def _extend_running(call: Call, request: RequestView, more: dt.timedelta, *, fleet: Fleet) -> Reply:
    """A running drain held longer: at once on a pool that needs no approval, else the
    later end waits for approval (Approve buttons for approvers on its own plan hash)."""
    try:
        view = _drains(call).extend_running(call.actor, request, more, fleet=fleet, now=call.now)
    except DrainRefused as err:
        return _refused(err)
    except AccessDenied:
        raise
    except RequestRefused as err:
        return error_reply(msg.refused_title(), str(err))
    assert request.window_end is not None and view.window_end is not None
    zone = call.services.config.display_zone
    if view.extension is None:
        return Reply(title=msg.drain_held_longer_title(view.id), visibility="in_channel",
                     summary=msg.drain_extended_summary(was=when(request.window_end, zone, style="second"),
                                                        window_end=when(view.window_end, zone, style="second")))
    extension = view.extension
    return Reply(title=msg.drain_extended_title(view.id), visibility="in_channel",
                 summary=msg.drain_extension_summary(
                     window_end=when(view.window_end, zone, style="second"),
                     extended_to=when(extension.window_end, zone, style="second"), counted=len(extension.approvers),
                     required=view.approvals_required, short_hash=extension.short_hash),
                 sections=(_request_facts(view),), intents=approval_intents(view, call.actor))


def _drain_request(call: Call, request_id: str) -> RequestView:
    if call.services.requests is None:
        raise NotFoundError(msg.not_available("Requests"))
    try:
        view = call.services.requests.get(request_id)
    except UnknownRequest as err:
        raise NotFoundError(str(err)) from None
    if view.kind != "drain":
        raise UsageError(msg.drain_not_a_drain(view.id, view.kind))
    return view
