"""MIG layout changes: /gpu mig <pool|node...> <layout> (request one). `/gpu rollback
<run>` of a MIG run asks for the layouts it replaced back (commands.upgrade dispatches on
the run's kind).

One call to the MIG use case (`MigService.request`) reads the MIG manager's layouts from
its config and the cluster's GPU pods, checks the layout against every node's GPUs and
the pool's MIG strategy, plans the capacity change (per resource, before and after, per
node and for the pool; the floor in the new units; evictions; workloads left without
their resource) and its waves inside the pool's window, and stores a pending request
bound to the plan's hash; the reply shows the plan with Approve/Deny. A refusal names
the rule and what to do instead; nothing is stored. `--dry-run` shows the plan and
stores nothing."""

from __future__ import annotations

from collections.abc import Callable

from commands import messages as msg
from commands.preflight_view import preflight_sections
from commands.drain_grammar import read_start_words, take_include_option
from commands.kinds import RequestButton, answers, request_button
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import REQUEST_MIG, Fact, Reply, Section, Table, error_reply
from commands.requests import approval_intents
from workflows.access import AccessDenied, Role
from workflows.drain.plan import DrainRequestError
from workflows.fleet.pool import PoolInventory
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName
from workflows.mig.layouts import MigRefused
from workflows.mig.messages import resources_text
from workflows.mig.plan import MigAsk, MigPlan
from workflows.mig.service import MigRequested, MigService
from workflows.plans import plan_hash
from workflows.pools.windows import UTC
from workflows.requests.errors import RequestRefused
from workflows.requests.views import RequestView
from workflows.wording import local_time


def _migs(call: Call) -> MigService:
    migs = call.services.change("mig", MigService)
    if migs is None:
        raise NotFoundError(msg.not_available("Requests"))
    return migs


def read_mig_words(args: list[str], *, call: Call, fleet: Fleet) -> MigAsk:
    """`<pool|node...> <layout> [at <time> | next-window | in the next window] [reason...]`:
    the leading words that name a pool or GPU nodes are the targets, the next the layout."""
    words, include = take_include_option([w for arg in args for w in arg.split() if w != "--dry-run"])
    targets: list[str] = []
    while len(targets) < len(words) and (fleet.pool(words[len(targets)]) is not None
                                         or words[len(targets)] in fleet.nodes):
        targets.append(words[len(targets)])
    if not targets:
        if not words:
            raise UsageError(msg.mig_needs_words())
        return MigAsk(targets=(words[0],), layout="")  # the plan names the unknown target
    if len(words) == len(targets):
        raise UsageError(msg.mig_needs_words())
    layout, rest = words[len(targets)], words[len(targets) + 1:]
    node = fleet.nodes.get(NodeName(targets[0]))
    pool = targets[0] if fleet.pool(targets[0]) is not None else (node.pool if node is not None else "")
    policy = call.services.config.pools.get(pool)
    start, next_window, used = read_start_words(rest, zone=(policy.window_set.zone if policy else None) or UTC,
                                                now=call.now)
    return MigAsk(targets=tuple(targets), layout=layout, reason=" ".join(rest[used:]), start=start,
                  next_window=next_window, include=include)


def _reply(call: Call, planned: MigPlan, view: RequestView | None = None) -> Reply:
    """The plan as an approver reads it: the capacity change first, then the waves; with
    the stored request (`view`), its id, who asked and the approval buttons."""
    zone = call.services.config.pools[planned.pool].window_set.zone or call.services.config.display_zone
    end = local_time(planned.window_end, zone) if planned.window_end else None
    layouts = sorted({c.layout for c in planned.changes})
    facts = (
        Fact("Layout", ", ".join(layouts)),
        Fact("Pool", f"{resources_text(planned.pool_before)} -> {resources_text(planned.pool_after)}"),
        Fact("Window", msg.request_window("mig", local_time(planned.window_start, zone), end)),
        Fact("First", planned.order.canary),
    )
    capacity = Section(title="Capacity", table=Table(columns=msg.MIG_NODE_COLUMNS, rows=tuple(
        (str(c.node), resources_text(c.before), resources_text(c.after),
         str(len(planned.moved[c.node].evicted) + len(planned.moved[c.node].waited)))
        for c in planned.changes)))
    rows = tuple((str(w.index + 1), ", ".join(w.nodes)) for w in planned.plan.waves)
    waves = Section(title="Waves", table=Table(columns=msg.MIG_WAVE_COLUMNS, rows=rows),
                    bullets=planned.plan.summary.notes)
    if view is None:
        return Reply(title=msg.mig_preview_title(planned.pool),
                     summary=msg.upgrade_preview_summary(plan_hash(planned.plan)[:8]),
                     sections=(Section(facts=facts), capacity, waves, *preflight_sections(planned.plan.summary)))
    return Reply(title=msg.mig_title(view.id, view.pool),
                 summary=msg.drain_summary(view.state, view.approvals_counted, view.approvals_required,
                                           view.short_hash),
                 sections=(Section(facts=facts), capacity, waves, *preflight_sections(planned.plan.summary),
                           Section(facts=(Fact("Request", view.id), Fact("Requested by", view.requester_name),
                                          Fact("Reason", view.reason or "-"), Fact("Plan hash", view.plan_hash)))),
                 intents=approval_intents(view, call.actor))


def _mig_capable(pool: PoolInventory, fleet: Fleet) -> bool:
    """A pool with MIG-capable GPUs (the MIG form is offered for it)."""
    return any(fleet.nodes[n].mig.capable for n in pool.nodes if n in fleet.nodes)


request_button(RequestButton(kind="mig", action=REQUEST_MIG, label=msg.request_mig_label(), offered=_mig_capable))


@REGISTRY.command("mig", usage=msg.MIG_USAGE, role=Role.OPERATOR,
                  summary="Ask to change the MIG layout of a pool's nodes: a capacity change, after approvals",
                  examples=("/gpu mig inference-mig all-2g.20gb more memory per replica",))
def mig(call: Call, args: list[str]) -> Reply:
    fleet = call.services.fleet.fleet(call.now)
    try:
        ask = read_mig_words(args, call=call, fleet=fleet)
    except DrainRequestError as err:
        return error_reply(msg.mig_refused_title(err.code), str(err))
    if any(w == "--dry-run" for arg in args for w in arg.split()):
        try:
            return _reply(call, _migs(call).preview(call.actor, ask, fleet=fleet, now=call.now))
        except MigRefused as err:
            return error_reply(msg.mig_refused_title(err.code), err.reason)
    return request_mig(call, ask)


def request_mig(call: Call, ask: MigAsk) -> Reply:
    """Plan, check and store the MIG change `ask` describes, and the reply showing it: what
    `/gpu mig` does after reading its words, and what the MIG form does with its fields."""
    fleet = call.services.fleet.fleet(call.now)
    return _answer(call, lambda: _migs(call).request(call.actor, ask, fleet=fleet, now=call.now,
                                                     channel=call.channel))


@answers("mig")
def _answer(call: Call, planned: Callable[[], MigRequested]) -> Reply:
    try:
        done = planned()
    except MigRefused as err:
        return error_reply(msg.mig_refused_title(err.code), err.reason)
    except AccessDenied:
        raise
    except RequestRefused as err:
        return error_reply(msg.refused_title(), str(err))
    return _reply(call, done.planned, done.view)
