"""Fleet commands: /gpu status, /gpu node, /gpu findings (read-only), and /gpu uncordon."""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
from collections.abc import Sequence

from commands import messages as msg
from commands.clusters import clusters_section
from commands.drift import drift_findings, findings_on_node, notes_section, pool_sections
from commands.kinds import buttons_in_force
from commands.pictures import CHART_SPAN, CHART_STEP, CapacityChart, capacity_chart
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import Fact, Intent, Notice, Reply, Section, Table, error_reply
from storage import capacity
from storage.capacity import CapacitySample
from workflows.access import Role
from workflows.drain.history import drain_history, last_drains
from workflows.drain.messages import drained_by
from workflows.engine.cordons import UncordonRefused
from workflows.engine.runs import RunView
from workflows.fleet.assessment import NodeInventory
from workflows.fleet.pool import PoolInventory
from workflows.fleet.clusters import ClusterUnreachable
from workflows.fleet.node_detail import NodeDetail, read_node_detail
from workflows.fleet.findings import Finding, cordons_left_behind, format_age, sort_findings
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName
from workflows.pools.config import PoolConfig, Workloads
from workflows.pools.freezes import CLUSTER, freeze_sentence
from workflows.signals import messages as health_msg
from workflows.prometheus.client import Endpoint, PrometheusUnavailable, range_query
from workflows.prometheus.fetching import Deadline
from workflows.signals.service import PrometheusSeries, Reading
from workflows.wording import plural, when

FINDINGS_IN_STATUS = 8
CHART_FLAG = "--chart"  # `status <pool> --chart`: the pool's capacity over the last day, as a picture


def _notice(finding: Finding, *, runbook: str | None) -> Notice:
    return Notice(severity=finding.severity, text=finding.message, subject=finding.subject, command=finding.command,
                  runbook=runbook)


def _fleet(call: Call) -> Fleet:
    """The fleet, with the findings that need gpuops' runs too: nodes a finished run left
    cordoned."""
    fleet = _with_forgotten(call, call.services.fleet.fleet(call.now))
    if call.services.runs is None:
        return fleet
    left = cordons_left_behind(fleet.cordoned_nodes(), now=call.now,
                               unfinished_runs=[str(view.id) for view in call.services.runs.unfinished()])
    return dataclasses.replace(fleet, findings=sort_findings((*fleet.findings, *left))) if left else fleet


def _with_forgotten(call: Call, fleet: Fleet) -> Fleet:
    """`fleet` with the restrictions a person left and nobody remembers, and the pods that
    tolerate their way around a pool's placement (commands.drift)."""
    forgotten = drift_findings(call, fleet)
    return dataclasses.replace(fleet, findings=sort_findings((*fleet.findings, *forgotten))) if forgotten else fleet


def _closest(name: str, names: Sequence[str]) -> list[str]:
    return difflib.get_close_matches(name, names, n=3, cutoff=0.4)


def _cluster_facts(fleet: Fleet) -> tuple[Fact, ...]:
    cluster = fleet.cluster
    if not cluster.operator_found:
        return (Fact("GPU Operator", msg.no_operator()),)
    policy = cluster.cluster_policy or "none"
    if cluster.cluster_policy_state:
        policy += f" ({cluster.cluster_policy_state})"
    facts = [
        Fact("GPU Operator", f"{cluster.operator_version or 'unknown version'} in {cluster.operator_namespace}"),
        Fact("ClusterPolicy", policy),
        Fact("Driver managed by", "NVIDIADriver CRs: " + ", ".join(cluster.nvidia_drivers)
             if cluster.uses_nvidia_driver_crds else "ClusterPolicy"),
        Fact("ClusterPolicy owner", cluster.cluster_policy_owner or "not set (configure cluster.cluster_policy_owner)"),
    ]
    if cluster.kubernetes_version:
        facts.append(Fact("Kubernetes", cluster.kubernetes_version))
    if cluster.duplicate_cluster_policies:
        facts.append(Fact("Duplicate ClusterPolicies", ", ".join(cluster.duplicate_cluster_policies)))
    return tuple(facts)


def _versions(pool: PoolInventory) -> str:
    if not pool.driver_versions:
        return "-"
    if len(pool.driver_versions) == 1:
        text = next(iter(pool.driver_versions))
    else:
        text = " + ".join(f"{v} ({n})" for v, n in pool.driver_versions.items()) + " MIXED"
    behind = "; ".join(f"{plural(len(nodes), 'pod')} behind ({version} next)"
                       for version, nodes in pool.driver_pods_behind.items())
    return f"{text}; {behind}" if behind else text


def _pool_row(pool: PoolInventory, problems: int) -> tuple[str, ...]:
    upgrade = pool.auto_upgrade.state + (" (default)" if pool.auto_upgrade.defaulted else "")
    return (pool.name, pool.kind or "-", f"{pool.nodes_ready}/{pool.nodes_total}",
            f"{pool.gpus_advertised}/{pool.gpus_expected}", str(pool.gpus_requested), _versions(pool),
            upgrade, str(problems) if problems else "-")


def _node_state(node: NodeInventory) -> str:
    states = []
    if node.upgrade.state:
        states.append(f"upgrade: {node.upgrade.state}")
    if node.upgrade.held_by:
        states.append(msg.held_from_operator_upgrade(node.upgrade.held_by))
    elif node.upgrade.skip:
        states.append(msg.operator_upgrade_skipped_by_person())
    if node.mig.config:
        states.append(f"MIG {node.mig.config} ({node.mig.config_state or '?'})")
    states.extend(f"{operand} {value}" for operand, value in node.paused_operands.items())
    return ", ".join(states) or "-"


def _cordon(node: NodeInventory) -> str:
    if not node.cordoned:
        return "-"
    return msg.cordon_cell(by=node.cordoned_by, run=node.cordon_run, by_hand=node.cordoned_before_run)


def _node_row(node: NodeInventory) -> tuple[str, ...]:
    expected = node.expected_advertised
    ready = {True: "Ready", False: "NotReady", None: "unknown"}[node.ready]
    return (node.name, ready, _cordon(node), f"{node.advertised_gpus}/{expected if expected is not None else '?'}",
            str(node.requested_gpus), node.effective_driver_version or "-", node.driver.owner, _node_state(node))


def _findings_section(call: Call, findings: tuple[Finding, ...], *, limit: int | None,
                      title: str | None = "Findings") -> Section:
    shown = findings if limit is None else findings[:limit]
    config = call.services.config
    notices = tuple(_notice(f, runbook=config.finding_runbook_url(f.code)) for f in shown)
    more = len(findings) - len(shown)
    return Section(title=title, notices=notices, text=msg.more_findings(more) if more > 0 else None)


def _form_buttons(call: Call, fleet: Fleet, *, pool: str, node: str | None = None) -> tuple[Intent, ...]:
    """Each kind's "Request a ..." button for `pool` (or for one `node` of it: the kinds
    asked for node by node), in the kinds' order, for whoever that kind's command would
    let ask (it checks again when asked); none for a pool without a policy."""
    inventory = fleet.pool(pool)
    buttons = buttons_in_force()
    return tuple(intent for button in buttons
                 if (node is None or button.on_nodes)
                 and (button.offered is None or (inventory is not None and button.offered(inventory, fleet)))
                 for intent in _form_button(call, button.kind, pool=pool, action=button.action, label=button.label,
                                            value=node or pool))


def _form_button(call: Call, command: str, *, pool: str, action: str, label: str, value: str) -> tuple[Intent, ...]:
    spec = REGISTRY.commands.get((command,))
    if spec is None or pool not in call.services.config.pools or not call.actor.has(spec.role, pool=pool):
        return ()
    return (Intent(action=action, label=label, value=value),)


def _find_pool(fleet: Fleet, name: str) -> PoolInventory:
    pool = fleet.pool(name)
    if pool is None:
        names = [p.name for p in fleet.pools]
        raise NotFoundError(msg.unknown_name("pool", name, _closest(name, names), len(names)))
    return pool


@REGISTRY.command("status", usage="status [pool] [--chart]", role=Role.VIEWER, changes=False,
                  summary="Every pool at a glance, findings first; or one pool's nodes",
                  examples=("/gpu status", "/gpu status serving-a", "/gpu status serving-a --chart"))
def status(call: Call, args: list[str]) -> Reply:
    chart = CHART_FLAG in args
    words = [a for a in args if a != CHART_FLAG]
    if len(words) > 1:
        raise UsageError(f"status takes at most one pool name, got {len(words)} words")
    if chart and not words:
        raise UsageError(msg.chart_needs_pool())
    reply = fleet_status(call, words[0] if words else None)
    if chart and reply.ok:
        return dataclasses.replace(reply, picture=pool_capacity_chart(call, words[0]))
    return reply


def pool_capacity_chart(call: Call, pool: str) -> CapacityChart:
    """The pool's GPUs advertised and out over the last day, with its floor
    (min_ready_gpus): from Prometheus where one is configured (`signals.prometheus`) and
    has gpuops' series, else from the samples the leader keeps (none without a database:
    an empty chart)."""
    policy = call.services.config.pools.get(pool)
    floor = policy.min_ready_gpus if policy is not None and policy.min_ready_gpus else None
    reader = call.services.signals.reader if call.services.signals is not None else None
    why = None
    if isinstance(reader, PrometheusSeries):
        try:
            samples = _prometheus_capacity(call, reader.endpoint, pool)
        except PrometheusUnavailable as err:
            samples, why = [], str(err)
        if samples:
            return capacity_chart(samples, pool=pool, until=call.now, floor=floor,
                                  source=msg.chart_from_prometheus(reader.endpoint.shown_url))
        why = why or msg.chart_no_prometheus_series()
    db = call.services.database
    samples = [] if db is None else capacity.of_pool(db, cluster=call.services.config.cluster_name or "", pool=pool,
                                                      since=call.now - CHART_SPAN)
    return capacity_chart(samples, pool=pool, until=call.now, floor=floor, source=msg.chart_from_samples(why))


def _prometheus_capacity(call: Call, endpoint: Endpoint, pool: str) -> list[CapacitySample]:
    """gpuops' own gauges (`gpuops_pool_gpus`, `gpuops_pool_gpus_out`) over the chart's span,
    as Prometheus scraped them; labelled by cluster where gpuops serves several."""
    labels = f'pool="{_promql_text(pool)}"'
    if call.services.clusters is not None and call.services.config.cluster_name:
        labels += f', cluster="{_promql_text(call.services.config.cluster_name)}"'
    # Whole seconds: Prometheus answers times in milliseconds, and the last point must not
    # land after `now` by a rounding.
    end = float(int(call.now.timestamp()))
    start, step = end - CHART_SPAN.total_seconds(), CHART_STEP.total_seconds()
    deadline = Deadline.within(endpoint.timeout_seconds)  # one for both queries
    advertised = range_query(endpoint, f'sum(gpuops_pool_gpus{{{labels}, state="advertised"}})', start=start,
                             end=end, step=step, deadline=deadline)
    out = range_query(endpoint, f"sum(gpuops_pool_gpus_out{{{labels}}})", start=start, end=end, step=step,
                      deadline=deadline)
    outs = {at: value for series in out for at, value in series.points}
    return [CapacitySample(pool=pool, at=dt.datetime.fromtimestamp(at, dt.timezone.utc), advertised=int(value),
                           out=int(outs.get(at, 0))) for series in advertised for at, value in series.points]


def _promql_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def fleet_status(call: Call, pool_name: str | None = None) -> Reply:
    """`/gpu status [pool]` with its pool read: every pool at a glance (None), or one pool's nodes."""
    clusters = None if pool_name is not None else clusters_section(call.services, now=call.now)
    try:
        fleet = _fleet(call)
    except ClusterUnreachable as err:
        if clusters is None:
            raise
        # Every other cluster's line still answers; this one has nothing to show yet.
        return Reply(title=msg.status_title(), summary=err.text(call.services.config.display_zone),
                     sections=(clusters,))
    if pool_name is not None:
        pool = _find_pool(fleet, pool_name)
        runs = tuple(call.services.runs.unfinished()) if call.services.runs is not None else ()
        intents = _form_buttons(call, fleet, pool=pool.name)
        policy = call.services.config.pools.get(pool.name)
        reply = _pool_status(call, fleet, pool, intents=intents, runs=runs,
                             workloads=policy.workloads if policy is not None else None,
                             operators=_pool_operators(call, policy) if policy is not None else None)
        reply = dataclasses.replace(reply, sections=(*reply.sections[:-1], *pool_sections(call, fleet, pool),
                                                     *reply.sections[-1:]))
        frozen = _freezes_section(call, pool=pool.name)
        return dataclasses.replace(reply, sections=(frozen, *reply.sections)) if frozen else reply
    critical = sum(f.severity == "critical" for f in fleet.findings)
    warning = sum(f.severity == "warning" for f in fleet.findings)
    nodes = sum(p.nodes_total for p in fleet.pools)
    # NB: from the pools' sums: a render walks no node (a warm status at 5,000 nodes spent
    # most of its time summing every node's MIG slices).
    # A person's cordon a run keeps (it was cordoned before the run) stays the person's.
    cordoned = [(None if n.cordoned_before_run else n.cordon_run, n.advertised_gpus) for n in fleet.cordoned_nodes()]
    summary = msg.fleet_summary(
        nodes=nodes, ready=sum(p.nodes_ready for p in fleet.pools), cordoned=cordoned,
        physical=sum(p.gpus_physical for p in fleet.pools), advertised=sum(p.gpus_advertised for p in fleet.pools),
        expected=sum(p.gpus_expected for p in fleet.pools),
        slices=sum(p.mig_slices_advertised for p in fleet.pools),
        critical=critical, warning=warning) if nodes else msg.no_gpu_nodes()
    problems = {p.name: sum(1 for f in fleet.findings if f.pool == p.name or f.subject == p.name) for p in fleet.pools}
    sections = [Section(facts=_cluster_facts(fleet))]
    frozen = _freezes_section(call)
    if frozen is not None:
        sections.insert(0, frozen)  # first: a freeze changes what anyone may do now
    if clusters is not None:
        sections.insert(0, clusters)  # every cluster's line before this one's detail
    if fleet.findings:
        sections.append(_findings_section(call, fleet.findings, limit=FINDINGS_IN_STATUS))
    if fleet.pools:
        sections.append(Section(title="Pools", table=Table(
            columns=msg.POOL_COLUMNS, rows=tuple(_pool_row(p, problems[p.name]) for p in fleet.pools))))
    drains = _drains_section(call)
    if drains is not None:
        sections.append(drains)
    return Reply(title=msg.status_title(), summary=summary, sections=tuple(sections))


def _freezes_section(call: Call, *, pool: str | None = None) -> Section | None:
    """The change freezes in force (those covering `pool`, with one), a line each; None
    when there is none or no database."""
    if call.services.freezes is None:
        return None
    found = [f for f in call.services.freezes.in_force(call.now) if pool is None or f.target in (CLUSTER, pool)]
    if not found:
        return None
    return Section(notices=tuple(Notice(severity="warning", text=freeze_sentence(f, zone=call.services.config.display_zone), subject=f.target,
                                        command="/gpu freezes") for f in found))


def _drains_section(call: Call) -> Section | None:
    """When nodes of each pool were last drained (by any run: a drain, an upgrade, a MIG
    change; as the handover says it) and the drain windows active or waiting; None (no
    section at all) before the first drain, or where there is no database."""
    if call.services.database is None:
        return None
    cluster = call.services.config.cluster_name
    history = drain_history(call.services.database, cluster=cluster)
    drained = {d.pool: d for d in last_drains(call.services.database, cluster=cluster)}
    if not history and not drained:
        return None
    zone = call.services.config.display_zone
    rows = []
    for pool in sorted(set(history) | set(drained)):
        last = drained.get(pool)
        active = "; ".join(
            msg.drain_active(d.request_id, d.state,
                             msg.request_window("drain", when(d.window_start, zone, style="table") if d.window_start else None,
                                            when(d.window_end, zone, style="table") if d.window_end else None))
            for d in (history[pool].active if pool in history else ()))
        cells = ((when(last.at, zone, style="table"),
                  drained_by(request_id=last.request_id, kind=last.kind, outcome=last.outcome),
                  plural(last.nodes, "node")) if last else ("-", "-", "-"))
        if last or active:
            rows.append((pool, *cells, active or "-"))
    if not rows:
        return None
    return Section(title=msg.last_drains_title(),
                   table=Table(columns=msg.DRAIN_HISTORY_COLUMNS, rows=tuple(rows)))


def _pool_operators(call: Call, policy: PoolConfig) -> str:
    """Who operates the pool: its own operators (people by their configured name or a
    mention, user groups by id) and whether the fleet's operators do too."""
    return msg.pool_operators(msg.operator_names(policy.operators, call.services.config.names),
                              fleet_operators=policy.global_operators)


def _pool_status(call: Call, fleet: Fleet, pool: PoolInventory, *, intents: tuple[Intent, ...] = (),
                 runs: tuple[RunView, ...] = (), workloads: Workloads | None = None,
                 operators: str | None = None) -> Reply:
    findings = tuple(f for f in fleet.findings if f.pool == pool.name or f.subject == pool.name)
    running = tuple(Fact("Running", msg.pool_run(r.request_id, r.id, r.kind, r.state, r.run.current_wave,
                                                   len({s.wave for s in r.steps})))
                    for r in runs if r.pool == pool.name)
    facts = (
        Fact("Kind", pool.kind or "not configured"),
        Fact("Nodes Ready", f"{pool.nodes_ready}/{pool.nodes_total}"),
        Fact("GPUs", f"{pool.gpus_advertised} advertised of {pool.gpus_expected} expected "
                     f"({pool.gpus_physical} physical), {pool.gpus_requested} in use"),
        Fact("Driver", _versions(pool)),
        Fact("Auto-upgrade", f"{pool.auto_upgrade.state} ({pool.auto_upgrade.source}"
                             + (", CRD default" if pool.auto_upgrade.defaulted else "") + ")"),
        Fact("Driver version set by", msg.driver_managers(pool)),
        *((Fact("Driver version kept by", kept),) if (kept := msg.driver_version_keepers(pool)) else ()),
        *running,
        *((Fact("Operators", operators),) if operators is not None else ()),
        *((Fact("Workloads", msg.pool_workloads(workloads.mig.text() if workloads.mig else None,
                                                workloads.full_gpu.text() if workloads.full_gpu else None)),)
          if workloads is not None else ()),
    )
    sections = [Section(facts=facts)]
    if findings:
        sections.append(_findings_section(call, findings, limit=None))
    nodes = tuple(_node_row(fleet.nodes[name]) for name in pool.nodes)
    sections.append(Section(title="Nodes", table=Table(columns=msg.NODE_COLUMNS, rows=nodes)))
    return Reply(title=msg.status_title(pool.name), summary=facts[2].value, sections=tuple(sections),
                 intents=intents)


@REGISTRY.command("node", usage="node <name>", role=Role.VIEWER, changes=False,
                  summary="One GPU node in full: driver owner with evidence, GPUs, operands, state",
                  examples=("/gpu node serving-a-05",))
def node(call: Call, args: list[str]) -> Reply:
    if len(args) != 1:
        raise UsageError("name one node, e.g. `/gpu node serving-a-05`")
    fleet = _fleet(call)
    name = args[0]
    inv = fleet.nodes.get(NodeName(name))
    if inv is None:
        names = sorted(fleet.nodes)
        raise NotFoundError(msg.unknown_name("GPU node", name, _closest(name, names), len(names)))
    ready = {True: "Ready", False: "NotReady", None: "unknown"}[inv.ready]
    gpus = Table(columns=("resource", "expected", "advertised", "allocatable", "in use"), rows=tuple(
        (r.resource, str(r.expected) if r.expected is not None else "?", str(r.capacity), str(r.allocatable),
         str(r.requested)) for r in inv.resources))
    facts = (
        Fact("Pool", inv.pool),
        Fact("Product", inv.product or "unknown"),
        Fact("Physical GPUs", str(inv.physical_gpus) if inv.physical_gpus is not None else "unknown"),
        Fact("Node", ready + (", cordoned " + _cordon(inv) if inv.cordoned else ", schedulable")),
        Fact("Driver", f"{inv.driver_version or 'not reported by GFD'}"
                       + (f" (driver pod image {inv.driver_image_tag})" if inv.driver_image_tag else "")
                       + (f"; its DaemonSet now specifies {inv.driver_pod.template_version} (on the pod's next "
                          "restart)" if inv.driver_pod.template_version else "")),
        *_host_facts(inv),
        *_canary_facts(fleet, inv, now=call.now),
        Fact("Device plugin", inv.device_plugin_pod.text),
        Fact("Validator", inv.validator_pod.text),
        Fact("Upgrade state", inv.upgrade.state or "-"),
        Fact("MIG", f"{inv.mig.config} ({inv.mig.config_state or '?'}, strategy {inv.mig.strategy or '?'})"
             if inv.mig.config else ("capable, not configured" if inv.mig.capable else "not MIG-capable")),
        Fact("Paused operands", ", ".join(f"{k}={v}" for k, v in inv.paused_operands.items()) or "none"),
    )
    reads = call.services.node_reads
    detail = read_node_detail(reads, inv.name, inv.gpu_pods) if reads is not None else None
    sections = [
        Section(facts=facts),
        Section(title=f"Driver owner: {inv.driver.owner}", bullets=inv.driver.evidence),
        Section(title="GPUs", table=gpus),
        *_depth_sections(call, fleet, inv, detail),
    ]
    health, health_findings = _gpu_health(call, inv)
    sections.extend(health)
    noted = notes_section(call, inv.name)
    if noted is not None:
        sections.insert(1, noted)
    findings = sort_findings((*findings_on_node(call, fleet, inv, detail.hand_set if detail is not None else None),
                              *health_findings))
    if findings:
        sections.insert(0, _findings_section(call, findings, limit=None))
    return Reply(title=msg.node_title(inv.name), summary=f"{inv.advertised_gpus}/{inv.expected_advertised or '?'} "
                 f"GPUs advertised · driver owner {inv.driver.owner}", sections=tuple(sections),
                 intents=_form_buttons(call, fleet, pool=inv.pool, node=inv.name))


def _depth_sections(call: Call, fleet: Fleet, inv: NodeInventory, detail: NodeDetail | None) -> tuple[Section, ...]:
    """The operator's pods on the node, any device plugin not the operator's, the GPU pods
    with their owners and budgets, and what a person's tool set on the node: the last two
    read from the API when asked (workflows.fleet.node_detail)."""
    operands = (Section(title=msg.operands_title(), table=Table(columns=msg.OPERAND_COLUMNS, rows=tuple(
        (o.operand, o.state.name or "?", o.state.text, str(o.state.restarts), o.state.version or "?")
        for o in inv.operands))) if inv.operands else
        Section(title=msg.operands_title(), text=msg.no_operands(fleet.cluster.operator_namespace)))
    others = (Section(title=msg.other_device_plugins_title(), table=Table(columns=msg.OPERAND_COLUMNS, rows=tuple(
        ("device-plugin", p.name or "?", p.text, str(p.restarts), p.version or "?")
        for p in inv.other_device_plugins))),) if inv.other_device_plugins else ()
    budgets = detail.budgets if detail is not None else None
    notices: list[Notice] = []
    if detail is None:
        notices.append(Notice(severity="info", subject=inv.name, text=msg.node_reads_unavailable()))
    elif detail.budgets_unknown is not None and inv.gpu_pods:
        notices.append(Notice(severity="warning", subject=inv.name, text=msg.budgets_unknown_notice(detail.budgets_unknown)))

    def budget(ref: str) -> str:
        if budgets is None:
            return msg.budget_unknown()
        return ", ".join(budgets.get(ref, ())) or msg.no_budget()

    pods = (Section(title=msg.gpu_pods_title(), notices=tuple(notices), table=Table(
        columns=msg.GPU_POD_COLUMNS, rows=tuple((p.ref, p.owner or msg.bare_pod(), str(p.gpus), budget(p.ref))
                                                for p in inv.gpu_pods)))
            if inv.gpu_pods else Section(title=msg.gpu_pods_title(), text=msg.no_gpu_pods()))
    if detail is None:
        hand = Section(title=msg.hand_set_title(), text=msg.node_reads_unavailable())
    elif detail.hand_set is None:
        hand = Section(title=msg.hand_set_title(), notices=(Notice(
            severity="warning", subject=inv.name, text=msg.hand_set_unknown(detail.hand_set_unknown or "?")),))
    elif not detail.hand_set:
        hand = Section(title=msg.hand_set_title(), text=msg.nothing_hand_set())
    else:
        hand = Section(title=msg.hand_set_title(), table=Table(columns=msg.HAND_SET_COLUMNS, rows=tuple(
            (h.what, h.key, h.value, h.manager, when(h.at, call.services.config.display_zone, style="table") if h.at else "?")
            for h in detail.hand_set)))
    return (operands, *others, pods, hand)


def _gpu_health(call: Call, inv: NodeInventory) -> tuple[tuple[Section, ...], tuple[Finding, ...]]:
    """The node's GPU health from DCGM and the findings it raises; nothing at all where
    signals are not configured, and one sentence where they cannot be read."""
    signals = call.services.signals
    if signals is None:
        return (), ()
    reading = signals.read(inv.name)
    title = health_msg.health_title(reading.source)
    if reading.unavailable is not None:
        return (Section(title=title, notices=(Notice(severity="warning", subject=inv.name, text=health_msg.unavailable(
            reading.source, reading.unavailable)),)),), ()
    health = reading.node(inv.name)
    if health is None or not health.gpus:
        text = (health_msg.health_partly_unknown_finding(inv.name, reading.source, health.unreadable)
                if health is not None and health.unreadable else
                health_msg.no_series(inv.name, reading.source, signals.node_label))
        return (Section(title=title, notices=(Notice(severity="warning", subject=inv.name, text=text),)),), ()
    table = Table(columns=health_msg.GPU_COLUMNS, rows=tuple(health_msg.gpu_row(g) for g in health.gpus))
    # A GPU that fell off the bus can drop out of DCGM altogether: count against GFD's.
    fewer = (Notice(severity="warning", subject=inv.name, text=health_msg.fewer_gpus(
        inv.name, reported=len(health.gpus), physical=inv.physical_gpus)),) \
        if inv.physical_gpus is not None and len(health.gpus) < inv.physical_gpus else ()
    # (Series it sent that cannot be read are a finding: the findings section says which.)
    return ((Section(title=title, table=table, notices=fewer),),
            signals.findings(reading, pools={inv.name: inv.pool}))


def _signal_findings(call: Call, fleet: Fleet) -> tuple[tuple[Finding, ...], Reading | None]:
    """Every GPU node's DCGM findings (none where signals are not configured)."""
    signals = call.services.signals
    if signals is None:
        return (), None
    reading = signals.read()
    return signals.findings(reading, pools={name: node.pool for name, node in fleet.nodes.items()}), reading


def _host_facts(inv: NodeInventory) -> tuple[Fact, ...]:
    """What the kubelet says of the node's host: the runtime and kernel the operator's
    toolkit and (precompiled) driver must fit."""
    info = inv.node_info
    kernel = info.kernel_version or msg.not_reported()
    if info.os_image:
        kernel += f" ({info.os_image})"
    if inv.precompiled:
        kernel += msg.precompiled_driver_note()
    return (Fact("Container runtime", info.container_runtime_version or msg.not_reported()),
            Fact("Kernel", kernel),
            Fact("Kubelet", info.kubelet_version or msg.not_reported()))


def _canary_facts(fleet: Fleet, inv: NodeInventory, *, now: dt.datetime) -> tuple[Fact, ...]:
    verdict = fleet.canaries.get(inv.name)
    if verdict is None:
        return ()
    return (Fact("Last GPU check", msg.last_gpu_check(passed=verdict.passed, age=format_age(now - verdict.at),
                                                       run=verdict.run_id)),)


@REGISTRY.command("uncordon", usage="uncordon <node>", role=Role.OPERATOR,
                  summary="Give back a node a finished gpuops run left cordoned",
                  examples=("/gpu uncordon serving-a-05",))
def uncordon_node(call: Call, args: list[str]) -> Reply:
    if len(args) != 1:
        raise UsageError(msg.uncordon_usage())
    if call.services.cordons is None:
        raise NotFoundError(msg.not_available("Uncordoning"))
    fleet = call.services.fleet.fleet(call.now)
    name = args[0]
    inv = fleet.nodes.get(NodeName(name))
    if inv is None:
        names = sorted(fleet.nodes)
        raise NotFoundError(msg.unknown_name("GPU node", name, _closest(name, names), len(names)))
    try:
        text = call.services.cordons.uncordon(call.actor, inv.name, pool=inv.pool, now=call.now)
    except UncordonRefused as err:
        return error_reply(msg.refused_title(), str(err))
    return Reply(title=msg.uncordoned_title(inv.name), summary=text, visibility="in_channel")


@REGISTRY.command("findings", usage="findings [pool|node]", role=Role.VIEWER, changes=False,
                  summary="Every problem found, most severe first",
                  examples=("/gpu findings", "/gpu findings training-a"))
def findings(call: Call, args: list[str]) -> Reply:
    if len(args) > 1:
        raise UsageError("findings takes at most one pool or node name")
    fleet = _fleet(call)
    scope = args[0] if args else None
    from_signals, reading = _signal_findings(call, fleet)
    selected = sort_findings((*fleet.findings, *from_signals)) if from_signals else fleet.findings
    unread = (Section(notices=(Notice(severity="warning", text=health_msg.unavailable(
        reading.source, reading.unavailable)),)),) if reading is not None and reading.unavailable else ()
    if scope is not None:
        if fleet.pool(scope) is None and scope not in fleet.nodes and scope != "cluster":
            names = [p.name for p in fleet.pools] + sorted(fleet.nodes)
            raise NotFoundError(msg.unknown_name("pool or node", scope, _closest(scope, names), len(names)))
        selected = tuple(f for f in selected if scope in (f.subject, f.pool))
    if not selected:
        return Reply(title=msg.findings_title(scope), summary=msg.no_findings(scope), sections=unread)
    return Reply(title=msg.findings_title(scope), summary=f"{len(selected)} found",
                 sections=(*unread, _findings_section(call, selected, limit=None, title=None)))  # the reply's title says it
