"""Moving nodes from host drivers to the GPU Operator: /gpu migrate <pool|node...> to
operator (request it), /gpu migrate confirm <run> [node] (say the host driver is gone, as
the Host driver removed button does). `/gpu rollback <run>` of such a run restores each
node's snapshot (commands.upgrade dispatches on the run's kind).

One call to the use case (`MigrateService.request`) checks each node's driver owner,
plans the nodes one at a time inside the pool's window, and stores a pending request
bound to the plan's hash; the reply shows the plan with Approve/Deny. A refusal names the
rule and what to do instead; nothing is stored. `--dry-run` shows the plan and stores
nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from commands import messages as msg
from commands.preflight_view import preflight_sections
from commands.drain_grammar import read_start_words, take_include_option
from commands.kinds import answers
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import Fact, Reply, Section, Table, error_reply
from commands.requests import approval_intents
from workflows.access import AccessDenied, Role
from workflows.drain.plan import DrainRequestError
from workflows.engine.runs import PERSON_STEPS, RunRefused, UnknownRun
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName
from workflows.migrate.plan import MigrateAsk, MigratePlan, MigrateRefused, direction_of
from workflows.migrate.service import MigrateRequested, MigrateService
from workflows.plans import plan_hash
from workflows.pools.windows import UTC
from workflows.requests.errors import RequestRefused
from workflows.requests.views import RequestView
from workflows.wording import local_time


def _migrations(call: Call) -> MigrateService:
    migrations = call.services.change("migrate", MigrateService)
    if migrations is None:
        raise NotFoundError(msg.not_available("Requests"))
    return migrations


def read_migrate_words(args: list[str], *, call: Call, fleet: Fleet) -> MigrateAsk:
    """`<pool|node...> to operator [at <time> | next-window | in the next window] [reason...]`."""
    words, include = take_include_option([w for arg in args for w in arg.split() if w != "--dry-run"])
    if "to" not in words[1:]:
        raise UsageError(msg.migrate_needs_words())
    at = words.index("to", 1)
    targets, direction, rest = words[:at], words[at + 1] if at + 1 < len(words) else "", words[at + 2:]
    if direction not in ("operator", "host"):
        raise UsageError(msg.migrate_needs_words())
    node = fleet.nodes.get(NodeName(targets[0]))
    pool = targets[0] if fleet.pool(targets[0]) is not None else (node.pool if node is not None else "")
    policy = call.services.config.pools.get(pool)
    start, next_window, used = read_start_words(rest, zone=(policy.window_set.zone if policy else None) or UTC,
                                                now=call.now)
    to: Literal["operator", "host"] = "operator" if direction == "operator" else "host"
    return MigrateAsk(targets=tuple(targets), to=to, reason=" ".join(rest[used:]),
                      start=start, next_window=next_window, include=include)


def _reply(call: Call, planned: MigratePlan, view: RequestView | None = None) -> Reply:
    zone = call.services.config.pools[planned.pool].window_set.zone or call.services.config.display_zone
    end = local_time(planned.window_end, zone) if planned.window_end else None
    facts = (Fact("Pool", planned.pool), Fact("Nodes", ", ".join(planned.nodes)),
             Fact("Window", msg.request_window("migrate", local_time(planned.window_start, zone), end)))
    rows = tuple((str(w.index + 1), ", ".join(w.nodes)) for w in planned.plan.waves)
    waves = Section(title="One node at a time", table=Table(columns=msg.MIG_WAVE_COLUMNS, rows=rows),
                    bullets=planned.plan.summary.notes)
    if view is None:
        return Reply(title=msg.migrate_preview_title(planned.pool, direction_of(planned.plan)),
                     summary=msg.upgrade_preview_summary(plan_hash(planned.plan)[:8]),
                     sections=(Section(facts=facts), waves, *preflight_sections(planned.plan.summary)))
    return Reply(title=msg.migrate_title(view.id, view.pool, direction_of(planned.plan)),
                 summary=msg.drain_summary(view.state, view.approvals_counted, view.approvals_required,
                                           view.short_hash),
                 sections=(Section(facts=facts), waves, *preflight_sections(planned.plan.summary),
                           Section(facts=(Fact("Request", view.id), Fact("Requested by", view.requester_name),
                                          Fact("Reason", view.reason or "-"), Fact("Plan hash", view.plan_hash)))),
                 intents=approval_intents(view, call.actor))


@REGISTRY.command("migrate", usage=msg.MIGRATE_USAGE, role=Role.OPERATOR,
                  summary="Move nodes between host drivers and the GPU Operator, one at a time, after approvals",
                  examples=("/gpu migrate training-a to operator one driver source for the pool",
                            "/gpu migrate training-a to host back to host drivers"))
def migrate(call: Call, args: list[str]) -> Reply:
    fleet = call.services.fleet.fleet(call.now)
    try:
        ask = read_migrate_words(args, call=call, fleet=fleet)
    except DrainRequestError as err:
        return error_reply(msg.migrate_refused_title(err.code), str(err))
    if any(w == "--dry-run" for arg in args for w in arg.split()):
        try:
            return _reply(call, _migrations(call).preview(call.actor, ask, fleet=fleet, now=call.now))
        except MigrateRefused as err:
            return error_reply(msg.migrate_refused_title(err.code), err.reason)
    return _answer(call, lambda: _migrations(call).request(call.actor, ask, fleet=fleet, now=call.now,
                                                           channel=call.channel))


@REGISTRY.command("migrate confirm", usage="migrate confirm <run> [node]", role=Role.OPERATOR,
                  summary="Say the host driver is gone from the node a move to the operator waits on",
                  examples=("/gpu migrate confirm run-4b1d9e",))
def migrate_confirm(call: Call, args: list[str]) -> Reply:
    if len(args) not in (1, 2):
        raise UsageError(msg.name_one("run, e.g. `/gpu migrate confirm run-4b1d9e`"))
    return confirm_host_driver(call, args[0], node=args[1] if len(args) == 2 else None)


def confirm_host_driver(call: Call, run_id: str, *, node: str | None) -> Reply:
    """`/gpu migrate confirm <run> [node]` with its words read: the host driver is gone from
    `node` (None: the one node the run waits on)."""
    if call.services.runs is None:
        raise NotFoundError(msg.not_available("Runs"))
    try:
        run = call.services.runs.confirm_host_driver(call.actor, run_id, now=call.now, node=node)
    except UnknownRun as err:
        raise NotFoundError(str(err)) from None
    except RunRefused as err:
        return error_reply(msg.refused_title(), str(err))
    rows = tuple((str(s.wave + 1), s.node, s.kind, s.state) for s in run.steps if s.kind in PERSON_STEPS)
    return Reply(title=msg.migrate_confirmed_title(run.id), visibility="in_channel",
                 sections=(Section(table=Table(columns=msg.STEP_COLUMNS[:4], rows=rows)),))


@answers("migrate")
def _answer(call: Call, planned: Callable[[], MigrateRequested]) -> Reply:
    try:
        done = planned()
    except MigrateRefused as err:
        return error_reply(msg.migrate_refused_title(err.code), err.reason)
    except AccessDenied:
        raise
    except RequestRefused as err:
        return error_reply(msg.refused_title(), str(err))
    return _reply(call, done.planned, done.view)
