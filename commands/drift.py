"""Drift and the pool's word: `/gpu compare <pool>` (its nodes against its majority),
`/gpu note <node> <text> [for <duration>]` (operators), and the pieces `/gpu status`,
`/gpu node` and the findings take from here: the pool's policy as the plans apply it,
the comparison as a section, a node's notes, and the restrictions nobody remembers.

`/gpu note` reads its words once: the node, the text, and an optional trailing `for
<duration>` (a word starting with a digit after a last-but-one `for`; "waiting for
parts" stays text). An unknown node, a duration that cannot be read or is out of range,
an empty text or a missing role each get their own sentence and store nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
from collections.abc import Sequence

from commands import messages as msg
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import Fact, Reply, Section, Table
from workflows.access import Role, public_name
from workflows.config import GpuopsConfig
from workflows.durations import parse_duration
from workflows.fleet import drift_messages as say
from workflows.fleet.assessment import NodeInventory
from workflows.fleet.compare import PoolComparison, compare_pool, node_objects
from workflows.fleet.findings import Finding, forgotten_restrictions, placement_tolerated, sort_findings
from workflows.fleet.first_seen import hand_set_age, restriction_ages
from workflows.fleet.notes import DEFAULT_NOTE_FOR, Note, NoteRefused
from workflows.fleet.pool import PoolInventory
from workflows.fleet.restrictions import (
    HandMark,
    PodsOnNodes,
    Restricted,
    cordon_state,
    hand_set_marks,
    marks_state,
    person_taints,
    restricted_nodes,
    tolerated_around,
)
from workflows.fleet.summary import Fleet
from workflows.kinds import KINDS
from workflows.kube.objects import NodeName
from workflows.pools.config import PoolConfig
from workflows.pools.windows import windows_text


# --------------------------------------------------------------------------------------
# /gpu note


def read_note_words(args: Sequence[str]) -> tuple[str, str, dt.timedelta]:
    """The node, the text and how long the note holds; UsageError saying what is wrong."""
    words = [word for arg in args for word in arg.split()]
    if not words:
        raise UsageError(msg.example("/gpu note gpu-a-01 waiting for a new PSU (ticket HW-123) for 3d"))
    node, rest = words[0], words[1:]
    lasts = DEFAULT_NOTE_FOR
    if len(rest) >= 2 and rest[-2].lower() == "for" and rest[-1][:1].isdigit():
        try:
            lasts = parse_duration(rest[-1])
        except ValueError:
            raise UsageError(say.note_bad_duration(rest[-1])) from None
        rest = rest[:-2]
    text = " ".join(rest).strip()
    if not text:
        raise UsageError(say.note_empty())
    return node, text, lasts


@REGISTRY.command("note", usage="note <node> <text> [for <duration>]", role=Role.OPERATOR,
                  summary="Say why a node is cordoned or tainted (7 days unless `for` says)",
                  examples=("/gpu note gpu-a-01 waiting for a new PSU (ticket HW-123) for 3d",))
def note(call: Call, args: list[str]) -> Reply:
    node_name, text, lasts = read_note_words(args)
    if call.services.notes is None:
        raise NotFoundError(msg.not_available("Notes"))
    fleet = call.services.fleet.fleet(call.now)
    inv = fleet.nodes.get(NodeName(node_name))
    if inv is None:
        names = sorted(fleet.nodes)
        raise NotFoundError(msg.unknown_name("GPU node", node_name,
                                             difflib.get_close_matches(node_name, names, n=3, cutoff=0.4), len(names)))
    try:
        written = call.services.notes.add(call.actor, node=inv.name, pool=inv.pool, text=text, lasts=lasts,
                                          now=call.now)
    except NoteRefused as err:
        raise UsageError(str(err)) from None
    silences = inv.cordoned or _has_taints(call, inv)
    return Reply(title=say.note_title(inv.name), visibility="in_channel",
                 summary=say.note_set(inv.name, written.text, until=written.until, silences=silences,
                                      zone=call.services.config.display_zone))


def _has_taints(call: Call, inv: NodeInventory) -> bool:
    objects = node_objects(call.services.fleet, [inv.name])
    return bool(objects and objects.get(inv.name) and objects[inv.name].taints)


def notes_in_force(call: Call) -> dict[NodeName, tuple[Note, ...]]:
    return call.services.notes.in_force(call.now) if call.services.notes is not None else {}


def notes_section(call: Call, node: NodeName) -> Section | None:
    """The notes in force on `node`, newest first; None without any."""
    found = notes_in_force(call).get(node, ())
    if not found:
        return None
    return Section(title=say.NOTES_TITLE, bullets=tuple(
        say.note_line(n.text, by=n.set_by_name, until=n.until, zone=call.services.config.display_zone)
        for n in found))


# --------------------------------------------------------------------------------------
# Restrictions nobody remembers


def forgotten_findings(call: Call, fleet: Fleet) -> tuple[Finding, ...]:
    """The `restriction-forgotten` findings: a person's cordon or taint older than
    `inventory.forgotten_after` with no unfinished run on the node and no note. Needs the
    database (gpuops' first-seen records); none without it."""
    database = call.services.database
    if database is None:
        return ()
    names = list(fleet.nodes)
    objects = node_objects(call.services.fleet, names)
    # Only the nodes with a person's restriction are aged (their records read one by one):
    # a command at 5,000 nodes does not read every first-seen record.
    candidates = [(fleet.nodes[n], objects.get(n) if objects is not None else None) for n in names]
    candidates = [(inv, obj) for inv, obj in candidates
                  if cordon_state(inv) is not None or (obj is not None and person_taints(obj))]
    if not candidates:
        return ()
    since = restriction_ages(database, candidates, now=call.now, cluster=_first_seen_cluster(call))
    restricted = restricted_nodes((inv for inv, _ in candidates), objects=objects,
                                  pools={p.name: p.nodes for p in fleet.pools}, since=since)
    return _forgotten(call, restricted)


def _forgotten(call: Call, restricted: Sequence[Restricted]) -> tuple[Finding, ...]:
    if not restricted:
        return ()
    runs = call.services.runs.unfinished() if call.services.runs is not None else ()
    busy = {s.node for r in runs for s in r.steps} | {n for r in runs for n in r.left_cordoned}
    return forgotten_restrictions(restricted, after=call.services.config.inventory.forgotten_after, now=call.now,
                                  nodes_in_runs=busy, noted=set(notes_in_force(call)))


def findings_on_node(call: Call, fleet: Fleet, inv: NodeInventory,
                  hand_set: Sequence[HandMark] | None) -> tuple[Finding, ...]:
    """The node's findings for `/gpu node`: `fleet`'s, with its `restriction-forgotten`
    counting also the labels and annotations a person's tool set (`hand_set`, from the
    node's managed fields as `/gpu node` read them; None: unknown, the fleet's finding
    stands). Their age is gpuops' first-seen record of them, written here (the watch cache
    keeps no managed fields: workflows.fleet.restrictions)."""
    found = fleet.findings_about(inv.name)
    database = call.services.database
    if hand_set is None or database is None:
        return found
    pool = fleet.pool(inv.pool)
    names = list(pool.nodes) if pool is not None else [inv.name]
    objects = node_objects(call.services.fleet, names)
    others = [o for o in (objects or {}).values()]
    marks = hand_set_marks(hand_set, pool_label=call.services.config.cluster.pool_label, pool_nodes=others)
    cluster = _first_seen_cluster(call)
    marks_since = hand_set_age(database, inv.name, marks_state(marks), now=call.now, cluster=cluster)
    if not marks:
        return found
    obj = objects.get(inv.name) if objects is not None else None
    since = restriction_ages(database, [(inv, obj)], now=call.now, cluster=cluster)
    restricted = restricted_nodes([inv], objects=objects, pools={inv.pool: names}, since=since)
    node = restricted[0] if restricted else Restricted(inv=inv, taints_known=objects is not None)
    forgotten = _forgotten(call, [dataclasses.replace(node, marks=marks, marks_since=marks_since)])
    if not forgotten:
        return found
    return sort_findings((*(f for f in found if f.code != "restriction-forgotten"), *forgotten))


def tolerated_findings(call: Call, fleet: Fleet) -> tuple[Finding, ...]:
    """The `placement-tolerated` findings: GPU pods a pool's `workloads` placement does not
    take that reach its nodes by tolerating their taints. Needs the node objects and pods
    the watch cache keeps; none from a fleet source without them."""
    source = call.services.fleet
    if not isinstance(source, PodsOnNodes):
        return ()
    found: list[Finding] = []
    # Only the nodes of pools with a placement: `/gpu status` asks on every render, and a
    # walk of every node would cost it most of its time at thousands of nodes.
    placed = {name: policy for name, policy in call.services.config.pools.items() if policy.workloads is not None}
    for pool in fleet.pools:
        policy = placed.get(pool.name)
        if policy is None or policy.workloads is None:
            continue
        for name in pool.nodes:
            inv = fleet.nodes.get(name)
            if inv is not None and inv.misplaced:
                found.extend(_tolerated_on(source, inv, policy))
    return tuple(found)


def _tolerated_on(source: PodsOnNodes, inv: NodeInventory, policy: PoolConfig) -> tuple[Finding, ...]:
    """The `placement-tolerated` findings of one node with misplaced GPU pods."""
    assert policy.workloads is not None
    objects = node_objects(source, [inv.name])
    if not objects:
        return ()
    rules = {use: rule.text() for use, rule in (("mig", policy.workloads.mig),
                                                ("full_gpu", policy.workloads.full_gpu)) if rule is not None}
    around = tolerated_around(inv, objects[inv.name], source.pods_on(inv.name))
    return tuple(placement_tolerated(inv, around, rules=rules))


def drift_findings(call: Call, fleet: Fleet) -> tuple[Finding, ...]:
    """What `/gpu status`, `/gpu node` and `/gpu findings` add from here."""
    return (*forgotten_findings(call, fleet), *tolerated_findings(call, fleet))


def _first_seen_cluster(call: Call) -> str | None:
    """The name gpuops' first-seen records of these nodes are kept under: the home
    cluster's plain (as `bot.wiring` keeps them), another cluster's by its name."""
    services = call.services
    if services.clusters is None or services.cluster in (None, services.clusters.home):
        return None
    return services.cluster


# --------------------------------------------------------------------------------------
# /gpu compare


def _pool_of(fleet: Fleet, name: str) -> PoolInventory:
    pool = fleet.pool(name)
    if pool is None:
        names = [p.name for p in fleet.pools]
        raise NotFoundError(msg.unknown_name("pool", name, difflib.get_close_matches(name, names, n=3, cutoff=0.4),
                                             len(names)))
    return pool


def comparison(call: Call, fleet: Fleet, pool: PoolInventory) -> PoolComparison:
    invs = [fleet.nodes[n] for n in pool.nodes if n in fleet.nodes]
    return compare_pool(pool.name, invs, node_objects(call.services.fleet, [i.name for i in invs]))


def compare_section(found: PoolComparison, *, title: str | None = None) -> Section:
    rows = tuple((d.name, d.majority if d.majority is not None else say.MIXED_MAJORITY,
                  say.differs_on([(value, list(nodes)) for value, nodes in d.others])) for d in found.drifts)
    text = say.compare_summary(found.pool, nodes=found.nodes, differing=len(found.differing),
                               properties=len(found.drifts))
    return Section(title=title, text=text,
                   table=Table(columns=say.COMPARE_COLUMNS, rows=rows) if rows else None)


@REGISTRY.command("compare", usage="compare <pool>", role=Role.VIEWER, changes=False,
                  summary="A pool's nodes that differ from its majority: labels, taints, driver, kernel, "
                          "runtime, MIG layout, operand versions",
                  examples=("/gpu compare serving-a",))
def compare(call: Call, args: list[str]) -> Reply:
    if len(args) != 1:
        raise UsageError("name one pool, e.g. `/gpu compare serving-a`")
    fleet = call.services.fleet.fleet(call.now)
    pool = _pool_of(fleet, args[0])
    if pool.nodes_total < 2:
        return Reply(title=say.compare_title(pool.name), summary=say.compare_too_few(pool.name, pool.nodes_total))
    found = comparison(call, fleet, pool)
    section = compare_section(found)
    return Reply(title=say.compare_title(pool.name), summary=section.text,
                 sections=(Section(table=section.table) if section.table else Section(),
                           Section(text=say.compare_source_note(node_objects=found.with_node_objects))))


# --------------------------------------------------------------------------------------
# The pool's policy as the plans apply it (workflows.pools.planning and the kinds' plans)


def policy_section(config: GpuopsConfig, policy: PoolConfig, pool: PoolInventory) -> Section:
    """What every plan of the pool reads from its configuration, as the plans read it:
    the windows (`window_set`), approvals per kind (`approvals_required`), who approves and
    operates, the nodes out at once (`unavailable_budget` of today's pool), the GPUs that
    stay Ready, the canary and its soak, the check pod (the pool's, else the fleet's)."""
    windows = policy.window_set
    if windows.always:
        window_text = say.any_time()
    elif not windows.windows:
        window_text = say.no_windows_set()
    else:
        window_text = windows_text(windows)
    approvals = say.approvals_required_line([(kind, policy.approvals_required(kind)) for kind in KINDS.names])
    names = config.names
    approvers = say.approvers_line([a.removeprefix("group:") + " (user group)" if a.startswith("group:")
                                    else public_name(a, names=names) for a in policy.approvers])
    check = policy.gpu_check or config.upgrades.gpu_check
    source = "the pool's gpu_check" if policy.gpu_check is not None else "upgrades.gpu_check"
    facts = (
        Fact("Windows", window_text),
        Fact("Approvals", approvals),
        Fact("Approvers", approvers),
        Fact("Max unavailable", say.max_unavailable_line(
            str(policy.unavailable_budget), nodes_now=policy.unavailable_budget.allowed(pool.nodes_total),
            total=pool.nodes_total)),
        Fact("Capacity floor", say.floor_line(policy.min_ready_gpus)),
        Fact("Canary", say.canary_line(policy.canary, policy.upgrade_soak)),
        Fact("GPU check", say.gpu_check_line(check.image if check is not None and check.enabled else None,
                                             check.command if check is not None else (), source=source)),
        Fact("Timeouts", say.timeouts_line(drain=policy.drain_timeout, action=policy.pdb_timeout_action,
                                           validate=policy.validate_timeout)),
    )
    return Section(title=say.POLICY_TITLE, facts=facts)


def pool_sections(call: Call, fleet: Fleet, pool: PoolInventory) -> tuple[Section, ...]:
    """What `/gpu status <pool>` adds from here: the policy (a configured pool) and the
    comparison of its nodes (two or more)."""
    sections = []
    policy = call.services.config.pools.get(pool.name)
    if policy is not None:
        sections.append(policy_section(call.services.config, policy, pool))
    if pool.nodes_total >= 2:
        found = comparison(call, fleet, pool)
        sections.append(compare_section(found, title=say.compare_title(pool.name)))
    return tuple(sections)

