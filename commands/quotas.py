"""/gpu quotas [namespace|pool]: GPU ResourceQuotas per namespace against what the pools
its pods can land on advertise, and what is flagged (read-only)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from commands import messages as msg
from commands import quota_messages as quota_msg
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import Fact, Notice, Reply, Section, Table, error_reply
from workflows.access import Role
from workflows.quotas import messages as say
from workflows.quotas.report import Flag, NamespaceQuota, PoolCapacity, QuotaReport
from workflows.quotas.service import QuotasUnreadable


def _amounts(values: Mapping[str, int], resources: Iterable[str] | None = None) -> str:
    keys = sorted(values) if resources is None else [r for r in resources if r in values]
    return ", ".join(say.amount(values[r], r) for r in keys) or "-"


def _notice(flag: Flag) -> Notice:
    subject = flag.pools[0] if flag.kind in ("overcommit", "unquoted-serving") and flag.pools else flag.namespaces[0]
    return Notice(severity=flag.severity, text=flag.text, subject=subject, command=f"/gpu quotas {subject}")


def _used(ns: NamespaceQuota) -> str:
    parts = []
    for resource in sorted(set(ns.used) | set(ns.quota)):
        text = say.amount(ns.used.get(resource, 0), resource)
        status = ns.quota_status_used(resource)
        if status is not None and status != ns.used.get(resource, 0):
            text += f" (quota status: {status})"
        parts.append(text)
    return ", ".join(parts) or "-"


def _row(ns: NamespaceQuota) -> tuple[str, ...]:
    reach = say.pools_text(ns.pools) + (" (no GPU pods: any pool)" if ns.assumed_reach else "")
    flags = ", ".join(dict.fromkeys(quota_msg.QUOTA_FLAG_WORDS[f.kind] for f in ns.flags)) or "-"
    return (ns.namespace, _amounts(ns.quota) if ns.quota else quota_msg.no_gpu_quota(), _used(ns), reach,
            _amounts(ns.capacity, sorted(set(ns.quota) | set(ns.used))), flags)


def _table(namespaces: Iterable[NamespaceQuota]) -> Table:
    return Table(columns=quota_msg.QUOTA_COLUMNS, rows=tuple(_row(ns) for ns in namespaces))


def _report(call: Call) -> QuotaReport:
    if call.services.quotas is None:
        raise NotFoundError(quota_msg.quotas_unavailable())
    return call.services.quotas.report(call.now)


@REGISTRY.command("quotas", usage="quotas [namespace|pool]", role=Role.VIEWER, changes=False,
                  summary="GPU quotas per namespace against what the pools it can land on advertise",
                  examples=("/gpu quotas", "/gpu quotas serving-a", "/gpu quotas ml-team"))
def quotas(call: Call, args: list[str]) -> Reply:
    if len(args) > 1:
        raise UsageError(f"quotas takes at most one namespace or pool name, got {len(args)} words")
    try:
        report = _report(call)
    except QuotasUnreadable as err:
        return error_reply(quota_msg.quotas_unreadable_title(), str(err))
    if not args:
        return _everything(report)
    name = args[0]
    pool = report.pool(name)
    if pool is not None:
        return _pool(report, pool)
    namespace = report.namespace(name)
    if namespace is not None:
        return _namespace(namespace)
    known = [p.name for p in report.pools] + [n.namespace for n in report.namespaces]
    closest = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    raise NotFoundError(msg.unknown_pool_or_namespace(name, closest, pools=len(report.pools),
                                                      namespaces=len(report.namespaces)))


def _everything(report: QuotaReport) -> Reply:
    if not report.namespaces:
        return Reply(title=quota_msg.quotas_title(), summary=quota_msg.no_quotas_or_gpu_pods())
    sections = []
    if report.flags:
        sections.append(Section(title="Flags", notices=tuple(_notice(f) for f in report.flags)))
    sections.append(Section(title="Namespaces", table=_table(report.namespaces)))
    return Reply(title=quota_msg.quotas_title(), sections=tuple(sections), summary=quota_msg.quotas_summary(
        namespaces=len(report.namespaces), quotas=report.quotas_found, flags=len(report.flags)))


def _pool(report: QuotaReport, pool: PoolCapacity) -> Reply:
    landing = report.landing_on(pool.name)
    flags = report.flags_about_pool(pool.name)
    facts = (
        Fact("Kind", pool.kind or "not configured"),
        Fact("Nodes", str(pool.nodes)),
        Fact("Advertises", _amounts(pool.allocatable)),
        Fact("Free", _amounts({r: pool.free(r) for r in pool.allocatable})),
        Fact("Quotas of the namespaces that can land here",
             _amounts({r: sum(ns.quota.get(r, 0) for ns in landing) for r in {r for ns in landing for r in ns.quota}})),
    )
    sections = [Section(facts=facts)]
    if flags:
        sections.append(Section(title="Flags", notices=tuple(_notice(f) for f in flags)))
    if landing:
        sections.append(Section(title="Namespaces that can land here", table=_table(landing)))
    return Reply(title=quota_msg.quotas_title(pool.name, kind="pool"), summary=quota_msg.pool_landing_summary(len(landing)),
                 sections=tuple(sections))


def _namespace(ns: NamespaceQuota) -> Reply:
    facts = [
        Fact("Quota", _amounts(ns.quota) if ns.quota else quota_msg.no_gpu_quota()),
        Fact("Used", _used(ns)),
        Fact("Can land on", say.pools_text(ns.pools)),
        Fact("They advertise", _amounts(ns.capacity)),
    ]
    if ns.assumed_reach:
        facts.append(Fact("Reach", say.assumed_reach()))
    sections = [Section(facts=tuple(facts))]
    if ns.flags:
        sections.append(Section(title="Flags", notices=tuple(_notice(f) for f in ns.flags)))
    if ns.entries:
        sections.append(Section(title="ResourceQuotas", table=Table(columns=quota_msg.QUOTA_ENTRY_COLUMNS, rows=tuple(
            (e.quota, e.key + ("" if e.enforced else " (not enforced)"), str(e.hard) if e.hard is not None else "?",
             str(e.used) if e.used is not None else "-", ", ".join(e.scopes) or "-") for e in ns.entries))))
    if ns.pods:
        sections.append(Section(title="Pods that decide where it can land", table=Table(
            columns=quota_msg.QUOTA_POD_COLUMNS, rows=tuple(
                (p.name, p.phase, p.node or "-", _amounts(p.requests), say.placement_text(p.placement),
                 say.pools_text(p.pools)) for p in ns.pods))))
    return Reply(title=quota_msg.quotas_title(ns.namespace, kind="namespace"),
                 summary=f"quota {facts[0].value} · used {facts[1].value} · can land on {facts[2].value}",
                 sections=tuple(sections))
