"""Requests, their runs and the audit log: /gpu requests, request, approve, deny, cancel,
pause, resume, continue (a halted run, as a new request: workflows.engine.continuing),
abort and audit.

Each command checks the role the registry names at the door; the services check the
rest (the two-person rule, pool-scoped approvers, requester-or-admin) and their refusals
are shown verbatim. Approving needs the plan's hash: `/gpu approve <id>` alone shows the
plan and the exact command to approve it, so nobody approves a plan they have not seen.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from commands import messages as msg
from commands.preflight_view import preflight_sections
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import HOST_DRIVER_REMOVED, Fact, Intent, Notice, Reply, Section, Table, error_reply
from commands.services import Services
from storage.audit import AuditEntry
from workflows.access import AccessDenied, Actor, Role, effective_roles
from workflows.engine.continuing import ContinueRefused, ContinueService
from workflows.engine.runs import PERSON_STEPS, RunRefused, RunService, RunView, UnknownRun, step_note
from workflows.kinds import kinds_in_force
from workflows.engine.waits import why_waiting
from workflows.pools.freezes import Freeze, covering, freeze_sentence, holds_run
from workflows.requests.errors import RequestRefused, UnknownRequest
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView
from workflows.wording import local_time, when

AUDIT_DEFAULT = 20
AUDIT_LIMIT = 200


def _requests(call: Call) -> RequestService:
    service = call.services.requests
    if service is None:
        raise NotFoundError(msg.not_available("Requests"))
    return service


def _runs(call: Call) -> RunService:
    service = call.services.runs
    if service is None:
        raise NotFoundError(msg.not_available("Runs"))
    return service


def _one(args: list[str], what: str) -> str:
    if len(args) != 1:
        raise UsageError(msg.name_one(what))
    return args[0]


def _refused(err: Exception) -> Reply:
    return error_reply(msg.refused_title(), str(err))


def _row(view: RequestView, zone: dt.tzinfo) -> tuple[str, ...]:
    return (view.id, view.kind, view.pool, view.state, view.requester_name,
            f"{view.approvals_counted}/{view.approvals_required}", view.short_hash,
            when(view.expires_at, zone, style="table") if view.state == "pending" else "-")


def approval_intents(view: RequestView, viewer: Actor) -> tuple[Intent, ...]:
    """The buttons of a pending request in a reply only `viewer` sees: Approve and Deny
    (bound to its current plan), or for its requester, who may not approve her own
    request, Cancel."""
    if view.state == "running" and view.extension is not None:
        return () if viewer.user_id == view.requester else _extension_intents(view)
    if view.state != "pending":
        return ()
    if viewer.user_id == view.requester:
        return (_cancel(view),)
    return _decide_intents(view)


def _extension_intents(view: RequestView) -> tuple[Intent, ...]:
    """Approve a running drain's later window end, bound to the extension's plan hash (not
    approved by its deadline, it lapses: there is nothing to deny)."""
    assert view.extension is not None
    return (Intent(action="approve", label="Approve", value=f"{view.id}/{view.extension.plan_hash}",
                   style="primary"),)


def _decide_intents(view: RequestView) -> tuple[Intent, ...]:
    value = f"{view.id}/{view.plan_hash}"  # as bot.intents encodes a button value
    return (Intent(action="approve", label="Approve", value=value, style="primary"),
            Intent(action="deny", label="Deny", value=value, style="danger"))


def _cancel(view: RequestView) -> Intent:
    return Intent(action="cancel", label="Cancel request", value=view.id, style="danger")


def card_intents(view: RequestView, open_to: frozenset[str] | None = None) -> tuple[Intent, ...]:
    """The buttons of a pending request's message everyone sees (the channel card):
    Approve and Deny for approvers, Cancel for the requester. Given `open_to` (a reply
    only one person sees, `/gpu request`), only the buttons that person may press."""
    if view.state == "running" and view.extension is not None:
        intents = _extension_intents(view)
    else:
        intents = (*_decide_intents(view), _cancel(view)) if view.state == "pending" else ()
    return intents if open_to is None else tuple(i for i in intents if i.action in open_to)


def rollback_intent(view: RequestView, runs: list[RunView]) -> tuple[Intent, ...]:
    """A Roll back button on an upgrade or MIG change whose run halted (it asks for the
    rollback; the rollback itself waits for the pool's approvals like any request)."""
    halted = [r for r in runs if r.state == "failed" and not r.run.dry_run]
    kind = kinds_in_force().get(view.kind)
    if kind is None or not kind.rollback or not halted:
        return ()
    return (Intent(action="rollback", label="Roll back", value=halted[-1].id),)


def continue_intent(view: RequestView, runs: list[RunView]) -> tuple[Intent, ...]:
    """A Continue button on a request whose run halted (it asks for what the run did not
    finish, `/gpu continue`; that waits for the pool's approvals like any request)."""
    halted = [r for r in runs if r.state == "failed" and not r.run.dry_run]
    if not runs or runs[-1] not in halted:
        return ()
    return (Intent(action="continue", label="Continue", value=halted[-1].id),)


def host_driver_intent(view: RequestView, runs: list[RunView]) -> tuple[Intent, ...]:
    """A Host driver removed (or installed) button per node a move waits on for a person
    at its host driver (each names its node: pressing one confirms that node only)."""
    kind = kinds_in_force().get(view.kind)
    if kind is None or not kind.confirmation:
        return ()
    for run in runs:
        waiting = [s for s in run.steps if s.kind in PERSON_STEPS and s.state == "running"]
        if waiting and run.state in ("running", "paused"):
            return tuple(Intent(action=HOST_DRIVER_REMOVED, value=f"{run.id}@{s.node}", style="primary",
                                label=msg.host_driver_by_hand_label(s.node, install=s.kind == "host-driver-installed"))
                         for s in waiting)
    return ()


def _plan_section(view: RequestView) -> tuple[Section, ...]:
    rows = tuple(
        (str(wave.index + 1), ", ".join(wave.nodes),
         " → ".join(step.kind for step in wave.steps_for(wave.nodes[0])) if wave.nodes else "-")
        for wave in view.plan.waves)
    return (Section(title=f"Plan {view.short_hash}", table=Table(columns=msg.WAVE_COLUMNS, rows=rows),
                    bullets=view.summary.notes), *preflight_sections(view.summary))


def _freeze_over(call: Call, pool: str, *, started: bool) -> Freeze | None:
    """The change freeze that holds a run of `pool` now (`started`: the run has a step
    under way or done), if any."""
    return _freeze_holding(call.services, pool, now=call.now, started=started)


def _freeze_holding(services: Services, pool: str, *, now: dt.datetime, started: bool) -> Freeze | None:
    if services.freezes is None:
        return None
    held = [f for f in covering(services.freezes.in_force(now), pool,
                                cluster=services.config.cluster_name) if holds_run(f, started=started)]
    return max(held, key=lambda f: f.until) if held else None


def _started(run: RunView) -> bool:
    return run.state != "pending" and any(s.state != "pending" for s in run.steps)


def _held_by(call: Call, run: RunView) -> Freeze | None:
    if run.state not in ("pending", "running"):
        return None
    return _freeze_over(call, run.pool, started=_started(run))


def _approver_names(services: Services, view: RequestView) -> list[str]:
    """Who could approve `view` now and has not: users with the approver role (for its
    pool or everywhere), then user groups that give it; never its requester."""
    config = services.config
    policy = config.pools.get(view.pool)
    pool_approvers = policy.approvers if policy is not None else ()
    users = set(config.access.users) | {a for a in pool_approvers if not a.startswith("group:")}
    done = set(view.approvers) | {view.requester}
    names = sorted(config.access.names.get(u, u) for u in users - done
                   if config.actor(u).has(Role.APPROVER, pool=view.pool))
    groups = {g for g, roles in config.access.usergroups.items() if Role.APPROVER in effective_roles(roles)}
    groups |= {a.removeprefix("group:") for a in pool_approvers if a.startswith("group:")}
    return names + [msg.approver_group(config.access.names.get(g, g)) for g in sorted(groups)]


def request_waits(services: Services, view: RequestView, *, now: dt.datetime,
                  runs: list[RunView] | None = None) -> str | None:
    """Why `view` waits now, in the one sentence `/gpu request`, the console and App Home
    show (workflows.engine.waits); None when it waits for nothing."""
    if runs is None:
        runs = services.runs.for_request(view.id) if services.runs is not None else []
    current = next((r for r in reversed(runs) if not r.run.finished), None)
    freeze = _freeze_holding(services, view.pool, now=now, started=current is not None and _started(current))
    return why_waiting(view, runs, now=now, freeze=freeze,
                       approvers=_approver_names(services, view) if view.state == "pending" else (),
                       zone=services.config.display_zone)


def open_waits(services: Services, *, now: dt.datetime) -> list[tuple[RequestView, str]]:
    """The open requests that wait for something, each with why (App Home lists them)."""
    if services.requests is None:
        return []
    found = []
    for view in services.requests.open_requests():
        why = request_waits(services, view, now=now)
        if why is not None:
            found.append((view, why))
    return found


def _run_section(run: RunView, *, held_by: Freeze | None = None, zone: dt.tzinfo = dt.timezone.utc) -> Section:
    # A run that ended early: the nodes it never started are one line, not a row per step.
    untouched: set[str] = set()
    if run.state in ("failed", "aborted"):
        by_node: dict[str, list[Any]] = {}
        for s in run.steps:
            by_node.setdefault(s.node, []).append(s)
        untouched = {node for node, steps in by_node.items()
                     if all(s.state == "skipped" and s.started_at is None for s in steps)}
    rows = tuple((str(s.wave + 1), s.node, s.kind, s.state, s.error or step_note(s) or "")
                 for s in run.steps if s.node not in untouched)
    bullets = []
    if held_by is not None:
        bullets.append(msg.run_held_by_freeze(freeze_sentence(held_by, zone=zone)))
    if run.run.halted_reason:
        bullets.append(run.run.halted_reason)
    if untouched:
        waves = sorted({s.wave + 1 for s in run.steps if s.node in untouched})
        bullets.append(msg.run_not_started([n for n in dict.fromkeys(s.node for s in run.steps) if n in untouched],
                                           first_wave=waves[0], last_wave=waves[-1]))
    if run.left_cordoned and run.state in ("failed", "aborted"):
        bullets.append(msg.run_left_cordoned(run.left_cordoned))
    return Section(title=msg.run_section_title(run.id, run.state, run.run.dry_run),
                   table=Table(columns=msg.STEP_COLUMNS, rows=rows) if rows else None, bullets=tuple(bullets))


def _request_reply(call: Call, view: RequestView, *, title: str | None = None, for_channel: bool = False) -> Reply:
    """The request as `call.actor` reads it; `for_channel`, as the channel card everyone
    reads (its buttons are for whoever may press them)."""
    zone = call.services.config.display_zone
    facts = (
        Fact("Requested by", view.requester_name),
        *((Fact("Cluster", view.cluster),) if view.cluster else ()),
        Fact("Reason", view.reason),
        Fact("Window", msg.request_window(view.kind, *(local_time(t, zone) if t else None
                                                        for t in (view.window_start, view.window_end)))),
        Fact("Plan hash", view.plan_hash),
        *((Fact("Extension", msg.request_extension(
            window_end=local_time(view.extension.window_end, zone), counted=len(view.extension.approvers),
            required=view.approvals_required, short_hash=view.extension.short_hash,
            lapses=local_time(view.extension.expires_at, zone))),) if view.extension else ()),
    )
    runs = call.services.runs.for_request(view.id) if call.services.runs is not None else []
    waits = request_waits(call.services, view, now=call.now, runs=runs)
    if waits is not None:
        facts = (*facts, Fact(msg.WAITS_LABEL, waits))
    sections = [Section(facts=facts), *_plan_section(view)]
    if view.approvals:
        sections.append(Section(title="Decisions", bullets=tuple(
            msg.approvals_line(a.approver_name, a.decision, a.plan_hash[:8], a.counts, a.reason)
            for a in view.approvals)))
    sections.extend(_run_section(run, held_by=_held_by(call, run), zone=call.services.config.display_zone) for run in runs)
    if view.state in ("approved", "scheduled") and (freeze := _freeze_over(call, view.pool, started=False)):
        sections.append(Section(notices=(Notice(severity="warning", text=freeze_sentence(freeze, zone=call.services.config.display_zone),
                                                subject=freeze.target, command="/gpu freezes"),)))
    return Reply(title=title or msg.request_title(view.id, view.kind, view.pool),
                 summary=msg.request_summary(view.state, view.approvals_counted, view.approvals_required,
                                             view.short_hash),
                 sections=tuple(sections),
                 intents=card_intents(view, None if for_channel else _requests(call).decisions_open_to(
                     call.actor, view.id, now=call.now)) + rollback_intent(view, runs) + continue_intent(view, runs)
                 + host_driver_intent(view, runs))


@REGISTRY.command("requests", usage="requests [pool]", role=Role.VIEWER, changes=False,
                  summary="Open requests (pending, approved, scheduled, running)",
                  examples=("/gpu requests", "/gpu requests serving-a"))
def list_requests(call: Call, args: list[str]) -> Reply:
    if len(args) > 1:
        raise UsageError(msg.at_most_one_pool())
    pool = args[0] if args else None
    service = _requests(call)
    views = service.open_requests(pool)
    if not views:
        return Reply(title=msg.requests_title(pool), summary=msg.no_open_requests(pool))
    waiting = {v.id for v in service.waiting_for(call.actor, now=call.now)}
    return Reply(title=msg.requests_title(pool),
                 summary=msg.open_requests_summary(len(views), len(waiting & {v.id for v in views})),
                 sections=(Section(table=Table(columns=msg.REQUEST_COLUMNS, rows=tuple(_row(v, call.services.config.display_zone) for v in views))),))


@REGISTRY.command("request", usage="request <id>", role=Role.VIEWER, changes=False,
                  summary="One request: its plan, decisions and runs step by step",
                  examples=("/gpu request req-7f3a2c",))
def show_request(call: Call, args: list[str]) -> Reply:
    return request_reply(call, _one(args, "request, e.g. `/gpu request req-7f3a2c`"))


def request_reply(call: Call, request_id: str, *, for_channel: bool = False) -> Reply:
    """`/gpu request <id>` with its id read: the request, its plan, decisions and runs
    (`for_channel`: as its channel card, whose buttons are for everyone who may press them)."""
    try:
        view = _requests(call).get(request_id)
    except UnknownRequest as err:
        raise NotFoundError(str(err)) from None
    return _request_reply(call, view, for_channel=for_channel)


@REGISTRY.command("approve", usage="approve <id> [plan-hash]", role=Role.APPROVER,
                  summary="Approve one exact plan of a request (two-person rule)",
                  examples=("/gpu approve req-7f3a2c", "/gpu approve req-7f3a2c 3f9a1c0e"))
def approve(call: Call, args: list[str]) -> Reply:
    if len(args) not in (1, 2):
        raise UsageError(msg.approve_usage())
    service = _requests(call)
    if len(args) == 1:
        try:
            view = service.get(args[0])
        except UnknownRequest as err:
            raise NotFoundError(str(err)) from None
        shown = _request_reply(call, view, title=msg.approve_title(view.id))
        return Reply(title=shown.title, summary=msg.approve_needs_hash(view.id, view.short_hash),
                     sections=shown.sections, intents=shown.intents)
    return _decide(call, lambda: service.approve(call.actor, args[0], plan_hash=args[1], now=call.now),
                   msg.approved_title)


def _decide(call: Call, decision: Callable[[], RequestView], title: Callable[[str], str]) -> Reply:
    """Carry out an approval, denial or cancellation: a refusal is an answer, not an error."""
    try:
        view = decision()
    except UnknownRequest as err:
        raise NotFoundError(str(err)) from None
    except AccessDenied:
        raise
    except RequestRefused as err:
        return _refused(err)
    return _request_reply(call, view, title=title(view.id))


@REGISTRY.command("deny", usage="deny <id> <reason>", role=Role.APPROVER,
                  summary="Deny a pending request, saying why",
                  examples=('/gpu deny req-7f3a2c "clashes with the launch"',))
def deny(call: Call, args: list[str]) -> Reply:
    if len(args) < 2:
        raise UsageError(msg.deny_needs_reason())
    return _decide(call, lambda: _requests(call).deny(call.actor, args[0], reason=" ".join(args[1:]), now=call.now),
                   msg.denied_title)


@REGISTRY.command("cancel", usage="cancel <id>", role=Role.OPERATOR,
                  summary="Withdraw a request before it runs (requester or admin)",
                  examples=("/gpu cancel req-7f3a2c",))
def cancel(call: Call, args: list[str]) -> Reply:
    request_id = _one(args, "request to cancel")
    return _decide(call, lambda: _requests(call).cancel(call.actor, request_id, now=call.now), msg.cancelled_title)


def _control(call: Call, args: list[str], action: str) -> Reply:
    run_id = _one(args, "run, e.g. run-9b01de")
    service = _runs(call)
    try:
        view = getattr(service, {"paused": "pause", "resumed": "resume", "aborted": "abort"}[action])(
            call.actor, run_id, now=call.now)
    except UnknownRun as err:
        raise NotFoundError(str(err)) from None
    except RunRefused as err:
        return _refused(err)
    return Reply(title=msg.run_control_title(view.id, action), summary=view.run.halted_reason
                 if action == "aborted" else None, sections=(_run_section(view),), visibility="in_channel")


@REGISTRY.command("pause", usage="pause <run>", role=Role.OPERATOR,
                  summary="Pause a run: steps in flight finish, nothing new starts",
                  examples=("/gpu pause run-9b01de",))
def pause(call: Call, args: list[str]) -> Reply:
    return _control(call, args, "paused")


@REGISTRY.command("resume", usage="resume <run>", role=Role.OPERATOR,
                  summary="Resume a paused run", examples=("/gpu resume run-9b01de",))
def resume(call: Call, args: list[str]) -> Reply:
    return _control(call, args, "resumed")


def read_continue_words(args: list[str]) -> tuple[str, str | None]:
    """`<run> [--skip <node>]` (or `--skip=<node>`): the run and the node to leave out."""
    words = [w for arg in args for w in arg.split()]
    run_id: str | None = None
    skip: str | None = None
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--skip" or word.startswith("--skip="):
            named = word.partition("=")[2]
            if not named:
                index += 1
                named = words[index] if index < len(words) else ""
            if not named or named.startswith("--") or skip is not None:
                raise UsageError(msg.continue_skip_one_node())
            skip = named
        elif run_id is None and not word.startswith("--"):
            run_id = word
        else:
            raise UsageError(msg.continue_usage_words(word))
        index += 1
    if run_id is None:
        raise UsageError(msg.name_one("halted run, e.g. `/gpu continue run-4b1d9e`"))
    return run_id, skip


@REGISTRY.command("continue", usage=msg.CONTINUE_USAGE, role=Role.OPERATOR,
                  summary="Ask to finish a halted run after its cause is fixed: nodes done stay done",
                  examples=("/gpu continue run-4b1d9e", "/gpu continue run-4b1d9e --skip gpu-07"))
def continue_run(call: Call, args: list[str]) -> Reply:
    run_id, skip = read_continue_words(args)
    return continue_halted(call, run_id, skip=skip)


def continue_halted(call: Call, run_id: str, *, skip: str | None = None) -> Reply:
    """`/gpu continue <run> [--skip <node>]` with its words read: ask to finish the halted run."""
    requests = _requests(call)
    try:
        run = _runs(call).get(run_id)
    except UnknownRun as err:
        raise NotFoundError(str(err)) from None
    fleet = call.services.fleet.fleet(call.now)
    try:
        done = ContinueService(requests, pools=call.services.config.pools).request(
            call.actor, run, fleet=fleet, now=call.now, skip=skip, channel=call.channel)
    except ContinueRefused as err:
        return error_reply(msg.continue_refused_title(err.code), err.reason)
    except AccessDenied:
        raise
    except RequestRefused as err:
        return _refused(err)
    view = done.view
    facts = (Fact("Request", view.id), Fact("Continues", msg.continue_of(done.run, run.request_id)),
             Fact("Requested by", view.requester_name), Fact("Plan hash", view.plan_hash))
    return Reply(title=msg.continue_title(view.id, view.pool, view.kind),
                 summary=msg.drain_summary(view.state, view.approvals_counted, view.approvals_required,
                                           view.short_hash),
                 sections=(Section(facts=facts), *_plan_section(view)), intents=approval_intents(view, call.actor))


@REGISTRY.command("abort", usage="abort <run>", role=Role.OPERATOR, confirm=True,
                  summary="Stop a run now; nodes stay as they are (cordoned ones stay cordoned)",
                  examples=("/gpu abort run-9b01de",))
def abort(call: Call, args: list[str]) -> Reply:
    return _control(call, args, "aborted")


def _audit_row(entry: AuditEntry, names: dict[str, str], zone: dt.tzinfo) -> tuple[str, ...]:
    detail: Any = entry.detail if isinstance(entry.detail, dict) else {}
    what = detail.get("text") or detail.get("note") or detail.get("reason") or ""
    if not what and (entry.before is not None or entry.after is not None):
        what = f"{entry.before} → {entry.after}"
    who = names.get(entry.actor, entry.actor) + (f" as {entry.k8s_identity}" if entry.k8s_identity else "")
    step = detail.get("kind") if entry.action.startswith("step.") else None
    return (str(entry.seq), when(entry.at, zone, style="table"), who, entry.action, entry.target,
            msg.audit_what(str(what), step=str(step) if step else None))


@REGISTRY.command("audit", usage="audit [n | request-id]", role=Role.VIEWER, changes=False,
                  summary="The audit log: the newest n entries, or everything about one request",
                  examples=("/gpu audit", "/gpu audit 50", "/gpu audit req-7f3a2c"))
def audit_log(call: Call, args: list[str]) -> Reply:
    if len(args) > 1:
        raise UsageError(msg.audit_usage())
    service = _runs(call)
    scope: str | None = None
    if args and args[0].isdigit() and not args[0].isascii():
        raise UsageError(msg.audit_usage())
    if args and not (args[0].isascii() and args[0].isdigit()):
        scope = args[0]
        try:
            _requests(call).get(scope)
        except UnknownRequest as err:
            raise NotFoundError(str(err)) from None
        entries = service.request_audit(scope)
        newest_first = False
    else:
        n = int(args[0]) if args else AUDIT_DEFAULT
        if not 1 <= n <= AUDIT_LIMIT:
            raise UsageError(msg.audit_count_limit(AUDIT_LIMIT))
        entries = service.recent_audit(n)
        newest_first = True
    if not entries:
        return Reply(title=msg.audit_title(scope), summary=msg.audit_empty(scope))
    names = call.services.config.access.names
    return Reply(title=msg.audit_title(scope), summary=msg.audit_summary(len(entries), newest_first),
                 sections=(Section(table=Table(columns=msg.AUDIT_COLUMNS,
                                               rows=tuple(_audit_row(e, names, call.services.config.display_zone) for e in entries))),))
