"""Driver upgrades: /gpu upgrade <pool> to <version> (request one) and /gpu rollback <run>
(request the version an upgrade run replaced back, for the nodes it changed).

One call to the upgrade use case (`UpgradeService.request`) checks the pool (the one
object that sets its driver version, host drivers, a shared ClusterPolicy or NVIDIADriver,
the version's form, same version, downgrade), plans canary and waves inside the pool's
window, and stores a pending request bound to the plan's hash; the reply shows the plan
with Approve/Deny. A refusal names the rule and what to do instead; nothing is stored.
Not built yet (issue 17 goes on): gating the operator's own upgrade (autoUpgrade on),
`at <time>`, the form, a Rollback button on a halted run and wave-by-wave progress in the
thread."""

from __future__ import annotations

from collections.abc import Callable

from commands import messages as msg
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import Fact, Reply, Section, Table, error_reply
from commands.requests import approval_intents
from workflows.access import AccessDenied, Role
from workflows.engine.runs import UnknownRun
from workflows.pools.windows import UTC
from workflows.requests.service import RequestRefused
from workflows.upgrade.plan import UpgradeAsk
from workflows.upgrade.scope import UpgradeRefused
from workflows.upgrade.service import UpgradeRequested, UpgradeService
from workflows.wording import local_time


def _upgrades(call: Call) -> UpgradeService:
    if call.services.upgrades is None:
        raise NotFoundError(msg.not_available("Requests"))
    return call.services.upgrades


def read_upgrade_words(args: list[str]) -> UpgradeAsk:
    """`<pool> to <version> [--downgrade] [reason...]`."""
    words = [w for w in args if w != "--downgrade"]
    if len(words) < 3 or words[1] != "to":
        raise UsageError(msg.upgrade_needs_words())
    return UpgradeAsk(pool=words[0], version=words[2], downgrade="--downgrade" in args, reason=" ".join(words[3:]))


def _reply(call: Call, done: UpgradeRequested) -> Reply:
    planned, view = done.planned, done.view
    scope = planned.scope
    zone = call.services.config.pools[view.pool].window_set.zone or UTC
    end = local_time(planned.window_end, zone) if planned.window_end else "none (windows: always)"
    facts = (
        Fact("Driver set by", f"{scope.manager.ref} (autoUpgrade {scope.manager.auto_upgrade.state}: "
                              f"{'gpuops gates the operator' if scope.mode == 'gates-operator' else 'gpuops drives'})"),
        Fact("Versions", msg.upgrade_versions(scope.current, scope.target.text)),
        Fact("Window", f"{local_time(planned.window_start, zone)} - {end}"),
        Fact("Canary", planned.order.canary),
    )
    fleet_nodes = call.services.fleet.fleet(call.now).nodes
    rows = tuple((str(w.index + 1), ", ".join(w.nodes),
                  str(sum((fleet_nodes[n].physical_gpus or 0) if n in fleet_nodes else 0 for n in w.nodes)))
                 for w in planned.plan.waves)
    sections = (
        Section(facts=facts),
        Section(title="Waves", table=Table(columns=msg.UPGRADE_WAVE_COLUMNS, rows=rows),
                bullets=planned.plan.summary.notes),
        Section(facts=(Fact("Request", view.id), Fact("Requested by", view.requester_name),
                       Fact("Reason", view.reason or "-"), Fact("Plan hash", view.plan_hash))),
    )
    return Reply(title=msg.upgrade_title(view.id, view.pool),
                 summary=msg.drain_summary(view.state, view.approvals_counted, view.approvals_required,
                                           view.short_hash),
                 sections=sections, intents=approval_intents(view, call.actor))


@REGISTRY.command("upgrade", usage=msg.UPGRADE_USAGE, role=Role.OPERATOR,
                  summary="Ask for a pool's driver upgrade: canary, then waves, after approvals",
                  examples=("/gpu upgrade serving-a to 580.105.08 security fix",))
def upgrade(call: Call, args: list[str]) -> Reply:
    ask = read_upgrade_words(args)
    fleet = call.services.fleet.fleet(call.now)
    return _answer(call, lambda: _upgrades(call).request(call.actor, ask, fleet=fleet, now=call.now,
                                                          channel=call.channel))


@REGISTRY.command("rollback", usage="rollback <run>", role=Role.OPERATOR,
                  summary="Ask to put back the driver version an upgrade run replaced, on the nodes it changed",
                  examples=("/gpu rollback run-4b1d9e",))
def rollback(call: Call, args: list[str]) -> Reply:
    if len(args) != 1:
        raise UsageError(msg.name_one("upgrade run, e.g. `/gpu rollback run-4b1d9e`"))
    if call.services.runs is None:
        raise NotFoundError(msg.not_available("Runs"))
    try:
        run = call.services.runs.get(args[0])
    except UnknownRun as err:
        raise NotFoundError(str(err)) from None
    fleet = call.services.fleet.fleet(call.now)
    return _answer(call, lambda: _upgrades(call).rollback(call.actor, run, fleet=fleet, now=call.now,
                                                           channel=call.channel))


def _answer(call: Call, planned: Callable[[], UpgradeRequested]) -> Reply:
    try:
        done = planned()
    except UpgradeRefused as err:
        return error_reply(msg.upgrade_refused_title(err.code), err.reason)
    except AccessDenied:
        raise
    except RequestRefused as err:
        return error_reply(msg.refused_title(), str(err))
    return _reply(call, done)
