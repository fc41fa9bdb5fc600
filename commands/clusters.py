"""Several clusters behind one `/gpu`: which cluster a command addresses, and every
cluster's line at the top of `/gpu status`.

A command names its cluster with `--cluster <name>` or a `<cluster>/<pool>` (or
`<cluster>/<node>`) argument; a command about a request or run (`approve req-…`,
`abort run-…`, a button on a request's card) is about that request's cluster; otherwise
the channel's cluster (`clusters.<name>.channels`), otherwise the home cluster. Every
cluster has its own services (its pools' policies, its API for drains and cordons) on
the one database; an engine per cluster, all under the home cluster's Lease, runs them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from commands import cluster_messages as cluster_msg
from commands.reply import Reply, Section, Table
from commands.services import ClusterDirectory, Services
from workflows.access import Actor
from workflows.config import GpuopsConfig
from workflows.engine.runs import UnknownRun
from workflows.fleet.clusters import ClusterGlance, ClusterSource, Reach, glance
from workflows.requests.errors import UnknownRequest

CLUSTER_FLAG = "--cluster"


class ClusterChoiceError(Exception):
    """The command names a cluster that does not exist, or two different ones."""


@dataclass(frozen=True)
class Clusters:
    """Every cluster gpuops serves: the whole configuration and each cluster's source."""

    config: GpuopsConfig
    sources: Mapping[str, ClusterSource]
    # Services for a cluster other than the home one, on the calling thread's database
    # connection, answering the same Slack delivery as the home ones (the bot's runtime
    # makes them: `make_services(name, delivery=...)`).
    make_services: Callable[..., Services]

    @property
    def home(self) -> str:
        home = self.config.home_cluster
        assert home is not None  # a directory exists only with clusters: set
        return home

    def names(self) -> list[str]:
        """The home cluster first, then the others by name."""
        return sorted(self.sources, key=lambda name: (name != self.home, name))

    def default_for(self, channel: str | None) -> str:
        return self.config.cluster_of_channel(channel) or self.home

    def others(self, now: dt.datetime) -> list[ClusterGlance]:
        """Every cluster but the home one, at a glance (for the handover)."""
        return [glance(self.sources[name], now=now) for name in self.names() if name != self.home]

    def services_for(self, name: str, home: Services) -> Services:
        """Services addressing cluster `name`: the home cluster's own, or another's."""
        return home if name == self.home else self.make_services(name, delivery=home.delivery)


def choose_cluster(args: list[str], services: Services, *, channel: str | None) -> tuple[list[str], Services]:
    """The cluster a command's arguments address and the arguments without the choice:
    `--cluster x` (or `--cluster=x`) anywhere, or an `x/` prefix on a name."""
    directory = services.clusters
    rest: list[str] = []
    named: set[str] = set()
    words = iter(args)
    for word in words:
        if word == CLUSTER_FLAG:
            value = next(words, None)
            if value is None:
                raise ClusterChoiceError(cluster_msg.cluster_flag_without_name())
            named.add(value)
        elif word.startswith(CLUSTER_FLAG + "="):
            named.add(word.removeprefix(CLUSTER_FLAG + "="))
        elif directory is not None and (split := _cluster_prefix(word, directory)) is not None:
            named.add(split[0])
            rest.append(split[1])
        else:
            rest.append(word)
    if directory is None:
        if named:
            raise ClusterChoiceError(cluster_msg.one_cluster_only())
        return rest, services
    unknown = sorted(name for name in named if name not in directory.sources)
    if unknown:
        raise ClusterChoiceError(cluster_msg.unknown_cluster(unknown[0], directory.names()))
    if len(named) > 1:
        raise ClusterChoiceError(cluster_msg.two_clusters(sorted(named)))
    stored = _cluster_of_ids(services, rest, home=directory.home)
    if stored is not None and named and stored[1] not in named:
        raise ClusterChoiceError(cluster_msg.id_of_other_cluster(stored[0], stored[1], next(iter(named))))
    chosen = next(iter(named)) if named else stored[1] if stored is not None else directory.default_for(channel)
    return rest, directory.services_for(chosen, services)


_STORED_ID = re.compile(r"^(req|run)-[0-9a-f]{6}$")


def services_about(services: Services, *, subject: str | None, channel: str | None) -> Services:
    """The cluster a command run with its values already read addresses, as
    `choose_cluster` chooses for typed words naming no cluster: the cluster of the request
    or run `subject` names, else the channel's, else the home one."""
    directory = services.clusters
    if directory is None:
        return services
    stored = _cluster_of_ids(services, [subject], home=directory.home) if subject is not None else None
    chosen = stored[1] if stored is not None else directory.default_for(channel)
    return directory.services_for(chosen, services)


def actor_in(services: Services, actor: Actor) -> Actor:
    """`actor` as the cluster `services` address sees them: the same person, user groups
    and gpuops-wide roles, with the approver rights that cluster's pools give."""
    if services.clusters is None:
        return actor
    return services.config.actor(str(actor.user_id), groups=actor.groups, via=actor.via, name=actor.name,
                                 unread_groups=actor.unread_groups)


def services_for_subject(services: Services, subject: str) -> Services:
    """The services of the cluster a request or run (`subject`, a button's) is about."""
    directory = services.clusters
    if directory is None:
        return services
    stored = _cluster_of_ids(services, [subject], home=directory.home)
    return directory.services_for(stored[1], services) if stored is not None else services


def _cluster_of_ids(services: Services, words: list[str], *, home: str) -> tuple[str, str] | None:
    """(id, cluster) for the first request or run id among `words` that is stored; a
    request made before `clusters:` was configured is the home cluster's."""
    for word in words:
        if not _STORED_ID.fullmatch(word):
            continue
        try:
            if word.startswith("run-"):
                if services.runs is None:
                    continue
                request_id: str = services.runs.get(word).run.request_id
            else:
                request_id = word
            if services.requests is None:
                continue
            return word, services.requests.get(request_id).cluster or home
        except (UnknownRequest, UnknownRun):
            continue
    return None


def _cluster_prefix(word: str, directory: ClusterDirectory) -> tuple[str, str] | None:
    """("west", "serving-a") for "west/serving-a", ("west", "pool=serving-a") for
    "pool=west/serving-a"; None when the word names no cluster."""
    key, equals, value = word.rpartition("=") if "=" in word else ("", "", word)
    prefix, slash, name = value.partition("/")
    if not slash or prefix not in directory.sources:
        return None
    return prefix, f"{key}{equals}{name}"


def clusters_section(services: Services, *, now: dt.datetime) -> Section | None:
    """One line a cluster, the home cluster first, for the top of `/gpu status` (None with
    one cluster). A cluster that does not answer says so and since when; its figures are
    the last seen."""
    directory = services.clusters
    if directory is None:
        return None
    rows = []
    for name in directory.names():
        seen = glance(directory.sources[name], now=now)
        label = name + (" (home)" if name == directory.home else "")
        reach = _reach_text(seen.reach, now=now)
        if seen.nodes is None:
            rows.append((label, reach, "-", "-", "-"))
            continue
        rows.append((label, reach, f"{seen.ready}/{seen.nodes}", f"{seen.advertised}/{seen.physical}",
                     cluster_msg.problem_counts(critical=seen.critical, warning=seen.warning)))
    return Section(title=cluster_msg.clusters_title(), table=Table(columns=cluster_msg.CLUSTER_COLUMNS, rows=tuple(rows)))


def _reach_text(reach: Reach, *, now: dt.datetime) -> str:
    return cluster_msg.cluster_reach(reach.state, since=reach.since, now=now, reason=reach.reason)


def name_cluster(reply: Reply, services: Services) -> Reply:
    """With several clusters, every reply's title names the cluster it is about."""
    if services.clusters is None or services.cluster is None:
        return reply
    return dataclasses.replace(reply, title=cluster_msg.in_cluster(reply.title, services.cluster))

