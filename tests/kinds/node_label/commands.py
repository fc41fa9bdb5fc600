"""`/gpu label <pool|node...> <key>=<value> [reason...]`: ask to set a node label (after the
pool's approvals, inside its window); `/gpu rollback <run>` of a label run finds this
module's answer through `@answers`."""

from __future__ import annotations

from collections.abc import Callable

from commands.kinds import RequestButton, answers, request_button
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import Fact, Reply, Section, error_reply
from commands.requests import approval_intents
from tests.kinds.node_label import KIND
from tests.kinds.node_label.plan import LabelAsk, LabelRefused
from tests.kinds.node_label.service import LabelRequested, LabelService
from workflows.access import AccessDenied, Role
from workflows.requests.errors import RequestRefused

USAGE = "/gpu label <pool|node...> <key>=<value> [reason...]"


def _labels(call: Call) -> LabelService:
    found = call.services.change(KIND.name, LabelService)
    if found is None:
        raise NotFoundError("Node labels are not available here.")
    return found


@REGISTRY.command("label", usage=USAGE, role=Role.OPERATOR, summary="Ask to set a label on a pool's nodes",
                  kind=KIND.name)
def label(call: Call, args: list[str]) -> Reply:
    words = [w for arg in args for w in arg.split()]
    at = next((i for i, w in enumerate(words) if "=" in w), None)
    if not at:
        raise UsageError("Name the nodes (or their pool) and the label, e.g. `/gpu label inf tier=gold`.")
    key, _, value = words[at].partition("=")
    ask = LabelAsk(targets=tuple(words[:at]), key=key, value=value or None, reason=" ".join(words[at + 1:]))
    return request_label(call, ask)


def request_label(call: Call, ask: LabelAsk) -> Reply:
    """What `/gpu label` does after reading its words, and what the label form does with its fields."""
    fleet = call.services.fleet.fleet(call.now)
    return answer(call, lambda: _labels(call).request(call.actor, ask, fleet=fleet, now=call.now,
                                                       channel=call.channel))


request_button(RequestButton(kind=KIND.name, action="request-label", label="Request a node label"))


@answers(KIND.name)
def answer(call: Call, planned: Callable[[], LabelRequested]) -> Reply:
    try:
        done = planned()
    except LabelRefused as err:
        return error_reply("Node label refused", err.reason)
    except AccessDenied:
        raise
    except RequestRefused as err:
        return error_reply("Refused", str(err))
    view = done.view
    return Reply(title=f"Node label request {view.id} · {view.pool}", summary=view.state,
                 sections=(Section(facts=(Fact("Request", view.id), Fact("Nodes", ", ".join(done.planned.plan.nodes)),
                                          Fact("Plan hash", view.plan_hash))),),
                 intents=approval_intents(view, call.actor))
