"""Failover (issue 49): two `gpuops run --http` replicas on one PostgreSQL and the real
control plane; the Lease holder is SIGKILLed in the middle of drains and driver upgrades
at seeded moments while 20 people keep sending commands, and the other replica takes the
Lease over and finishes each run with nothing done twice.

The replicas are real processes (tests/reliability/replicas.py): each its own ports and
identity, the same configuration and PostgreSQL database (tests/fixtures/postgres.py),
acting as the bot's ServiceAccount (deploy/rbac.yaml), Slack the fake Web API in this
process. People reach them through a Service: round robin over the ready replicas, and a
request whose connection was refused or reset sent once more to another with
X-Slack-Retry-Num, as Slack retries.

The drain: operator O01 asks `/gpu drain fo` (3 nodes, one trainer pod each,
`max_unavailable: 1`: 3 waves), two approvers press Approve on its card, the scheduler of
the Lease holder starts the run at once (the pool's window is `always`); when wave 1 holds,
O01 says `drain done`. The kill lands after a seeded number of the run's steps were done
(1 to all but one), so it falls anywhere in the run: a hold, an eviction's wait, a
validation. The upgrade (gpuops driving, autoUpgrade off; every other one back to the older
driver with `--downgrade`) is asked for and approved the same way, and killed the same way
after a seeded number of its steps. The killed replica comes back as a new pod (a new name) and stands by, so a
later kill has a survivor.

Measured per kill: the time from the SIGKILL to the survivor holding the Lease (read from
the Lease object), and to the run's next audit row (the survivor's engine acting).
Checked: the survivor holds the Lease within the Lease's duration plus the period at which
a standby looks at it (workflows/engine/lease.py: a standby takes over a record unchanged
for a whole duration measured from when it first saw it, and looks every `retry_period`),
the run succeeds, the API server's audit log shows each cordon, eviction and uncordon once,
both approvals recorded once, every person's request answered (200) and answered at most
once on its response_url, the audit chain verifies, and no replica logged an ERROR.

Nothing is lost: a command or click the killed replica acknowledged and had not answered
yet (Slack has its ack, so it never sends it again) was kept in the database's inbox before
the ack, and the survivor takes it over once the killed replica's heartbeat is old
(bot.heartbeat) and answers it on its response_url. Every request is answered, once.

`make test` runs 1 drain and 1 upgrade with 1 kill each (about 2 minutes on the 2-core
machine, 3 with its control plane's start); `make reliability` 6 drains and 4 upgrades,
1-2 kills each (seeded; about 8 minutes).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.heartbeat import HeartbeatSettings
from storage import audit
from storage import runs as stored_runs
from storage.database import Database, open_database
from testenv import fleet as fl
from testenv.apiaudit import AuditLog
from testenv.fakeslack import FakeSlackWebApi, signing
from testenv.install import wait_until
from testenv.summary import advertised
from tests.e2e.harness import CHANNEL, answer_of
from tests.integration import engine_harness as h
from tests.integration.desk import bot_rbac_granted
from tests.reliability import figures
from tests.reliability.figures import percentile
from tests.reliability.replicas import LEASE, NAMESPACE, Replica, Service, Shared
from workflows.engine.lease import LeaseSettings
from workflows.engine.runs import RunService

DRAINS = figures.count(1, 6)
UPGRADES = figures.count(1, 4)
KILLS_PER_RUN = (1, 1) if not figures.FULL else (1, 2)
THINK_MEAN = 1.0  # seconds a person waits between two commands (exponential)
# What the code says (workflows/engine/lease.py; `gpuops run` keeps the defaults): a claim
# lasts `duration`; a standby looks every `retry_period` and takes over a record it has seen
# unchanged for a whole duration. From the kill: at most the holder's last renewal (at or
# before the kill) plus a look's period until the standby first saw it, plus the duration.
SETTINGS = LeaseSettings()
TAKEOVER_LIMIT = SETTINGS.duration.total_seconds() + SETTINGS.retry_period + 1.0  # 1 s: the API calls themselves

# Seconds a request may wait for its answer: one the killed replica acknowledged is answered
# by the survivor after the dead-after and a beat (bot.heartbeat), and its run.
ANSWERED_WITHIN = HeartbeatSettings().dead_after + HeartbeatSettings().beat + 30.0

VIEWERS = tuple(f"U0VIEW{i:02d}" for i in range(1, 7))
OPERATORS = tuple(f"U0OPER{i:02d}" for i in range(1, 9))
APPROVERS = tuple(f"U0APPR{i:02d}" for i in range(1, 7))
PEOPLE = VIEWERS + OPERATORS + APPROVERS
DRAINER = OPERATORS[0]
NODES = ("fo-01", "fo-02", "fo-03")
UPG_NODES = ("upg-01", "upg-02")
VERSIONS = ("580.95.05", "580.105.08")
FLEET = fl.FleetSpec(name="fo", system_nodes=0, operator=fl.OperatorSpec(use_nvidia_driver_crd=True),
                     pools=(fl.PoolSpec(name="fo", nodes=len(NODES)),
                            fl.PoolSpec(name="upg", nodes=len(UPG_NODES), driver_version=VERSIONS[0],
                                        auto_upgrade=False)),
                     workloads=tuple(fl.WorkloadSpec(name=f"trainer-{n[-2:]}", namespace="fojobs", node=n)
                                     for n in NODES))
STEPS_PER_NODE = ("cordon", "evict", "hold", "validate", "uncordon")


def config() -> dict[str, Any]:
    roles = {**{u: ["viewer"] for u in VIEWERS}, **{u: ["operator"] for u in OPERATORS},
             **{u: ["approver"] for u in APPROVERS}}
    return {"pools": {"fo": {"kind": "training", "windows": "always", "max_unavailable": 1, "min_ready_gpus": 0,
                             "approvals": {"drain": 2}, "approvers": list(APPROVERS)},
                      # gpuops drives the upgrade (autoUpgrade off): canary first, a second's soak.
                      "upg": {"kind": "serving", "windows": "always", "max_unavailable": 1, "min_ready_gpus": 0,
                              "upgrade_soak": "1s", "approvals": {"upgrade": 2}, "approvers": list(APPROVERS)}},
            "access": {"users": roles, "names": {u: u.lower() for u in PEOPLE}}}


# ------------------------------------------------------------------ the installation


@dataclass
class Installation:
    """The replicas of one gpuops installation, the Service in front, and what they share."""

    shared: Shared
    service: Service
    slack: FakeSlackWebApi
    db: Database
    installer: Any
    replicas: list[Replica] = field(default_factory=list)
    started: int = 0

    def start(self) -> Replica:
        self.started += 1
        replica = Replica(f"gpuops-{self.started}", self.shared)
        self.replicas.append(replica)
        replica.wait_ready()
        self.service.add(replica)
        return replica

    def holder(self) -> str | None:
        lease = self.installer.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}")
        return (lease.get("spec") or {}).get("holderIdentity")

    def replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)


@pytest.fixture
def installation(cluster, fleet, slack: FakeSlackWebApi, postgres_url: str, tmp_path: Path) -> Iterator[Installation]:
    fleet(FLEET)
    installer = cluster.installer()
    wait_until(lambda: all(advertised(h.node(installer, n)) == 8 for n in NODES + UPG_NODES), timeout=120,
               what="the fleet to advertise its GPUs")
    for user in PEOPLE:
        slack.workspace.add_user(user, name=user.lower())
    config_file = tmp_path / "gpuops.yaml"
    config_file.write_text(json.dumps(config()))
    shared = Shared(config=config_file, kubeconfig=cluster.kubeconfig, database_url=postgres_url,
                    slack_url=slack.base_url, bot_token=slack.bot_token, logs=tmp_path)
    with bot_rbac_granted(installer):
        db = open_database(postgres_url)
        found = Installation(shared=shared, service=Service(), slack=slack, db=db, installer=installer)
        try:
            found.start()
            found.start()
            wait_until(lambda: found.holder() in {r.name for r in found.replicas}, timeout=60,
                       what="a replica to hold the engine Lease")
            yield found
        finally:
            for replica in found.replicas:
                replica.stop()
            db.close()


# ------------------------------------------------------------------ people


@dataclass
class Sent:
    kind: str
    user: str
    key: str
    status: int = 0
    tried: list[str] = field(default_factory=list)
    at: float = 0.0  # time.monotonic() when sent


def _key(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def slash(site: Installation, user: str, text: str, kind: str) -> Sent:
    url = site.slack.response_url(channel=CHANNEL, user=user)
    body = signing.slash_command_body(text=text, user_id=user, user_name=user.lower(), channel_id=CHANNEL,
                                      response_url=url)
    sent = Sent(kind=kind, user=user, key=_key(url), at=time.monotonic())
    delivery = site.service.send(body)
    sent.status, sent.tried = delivery.answer.status, delivery.tried
    return sent


def press_approve(site: Installation, user: str, request_id: str) -> Sent:
    card = _card_of(site.slack, request_id)
    button = card["Approve"]
    url = site.slack.response_url(channel=CHANNEL, message_ts=card["ts"], user=user)
    body = signing.block_actions_body(action_id=button["action_id"], value=button["value"], user_id=user,
                                      user_name=user.lower(), message_ts=card["ts"], channel_id=CHANNEL,
                                      response_url=url, block_id="intents")
    sent = Sent(kind="approve", user=user, key=_key(url), at=time.monotonic())
    delivery = site.service.send(body)
    sent.status, sent.tried = delivery.answer.status, delivery.tried
    return sent


def _card_of(slack: FakeSlackWebApi, request_id: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for message in slack.workspace.messages(CHANNEL):
            buttons = {e["text"]["text"]: e for b in message.blocks or [] if b.get("type") == "actions"
                       for e in b["elements"]}
            if message.thread_ts is None and buttons.get("Approve", {}).get("value", "").startswith(request_id):
                return {**buttons, "ts": message.ts}
        return None
    wait_until(lambda: find() is not None, timeout=30, what=f"the card of {request_id} in the channel")
    found = find()
    assert found is not None
    return found


class Crowd:
    """20 people, a thread each, sending commands that only read until told to stop."""

    def __init__(self, site: Installation, seed: int) -> None:
        self.site, self.seed = site, seed
        self.stop = threading.Event()
        self.sent: list[Sent] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._person, args=(u,), daemon=True, name=f"fo-{u}")
                         for u in PEOPLE]

    def __enter__(self) -> Crowd:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        if self.errors:
            raise self.errors[0]

    def _person(self, user: str) -> None:
        rng = random.Random(f"{self.seed}/{user}")
        try:
            while not self.stop.wait(rng.expovariate(1 / THINK_MEAN)):
                roll = rng.random()
                if roll < 0.4:
                    sent = slash(self.site, user, "status", "status")
                elif roll < 0.7:
                    sent = slash(self.site, user, f"node {rng.choice(NODES + UPG_NODES)}", "node")
                else:
                    sent = slash(self.site, user, "help", "help")
                with self._lock:
                    self.sent.append(sent)
        except BaseException as err:  # noqa: BLE001 - raised by __exit__
            self.errors.append(err)


# ------------------------------------------------------------------ kills


@dataclass
class Takeover:
    holder_s: float  # from the SIGKILL to the survivor holding the Lease
    commit_s: float | None  # ... to the run's next audit row (None: the run had ended)
    at_step: str  # the run's newest audit row when the kill landed
    victim: str = ""  # the replica killed
    killed_at: float = 0.0  # time.monotonic() of the SIGKILL


def _steps_done(db: Database, run_id: Any) -> list[audit.AuditEntry]:
    return [r for r in audit.for_run(db, run_id) if r.action == "step.done"]


def _newest_of_run(db: Database, run_id: Any) -> int:
    rows = audit.for_run(db, run_id)
    return int(rows[-1].seq) if rows else 0


def kill_holder(site: Installation, run_id: Any, *, after_steps: int) -> Takeover | None:
    """SIGKILL the Lease holder once the run has done `after_steps` steps; measure the
    takeover; start the killed pod again under a new name. None: the run ended first."""
    wait_until(lambda: len(_steps_done(site.db, run_id)) >= after_steps or _ended(site.db, run_id),
               timeout=180, what=f"the run to have done {after_steps} steps")
    if _ended(site.db, run_id):
        return None
    holder = site.holder()
    assert holder is not None
    victim = site.replica(holder)
    before = _newest_of_run(site.db, run_id)
    rows = audit.for_run(site.db, run_id)
    point = f"{rows[-1].action} {rows[-1].detail.get('kind', '')}".strip() if rows and isinstance(
        rows[-1].detail, dict) else (rows[-1].action if rows else "")
    victim.kill()
    killed = time.monotonic()
    site.service.remove(victim)
    survivors = {r.name for r in site.replicas if r.alive()}
    while site.holder() not in survivors:
        assert time.monotonic() - killed < 60, "no survivor took the Lease over in 60 s"
        time.sleep(0.05)
    held = time.monotonic() - killed
    commit: float | None = None
    while not _ended(site.db, run_id) or _newest_of_run(site.db, run_id) > before:
        if _newest_of_run(site.db, run_id) > before:
            commit = time.monotonic() - killed
            break
        assert time.monotonic() - killed < 120, "the survivor's engine did nothing in 120 s"
        time.sleep(0.05)
    site.start()  # the killed pod, rescheduled: a new name, a standby
    return Takeover(holder_s=held, commit_s=commit, at_step=point, victim=victim.name, killed_at=killed)


def _ended(db: Database, run_id: Any) -> bool:
    return (stored_runs.get(db, id=run_id) or _none()).state in ("succeeded", "failed", "aborted")


def _none() -> Any:
    raise AssertionError("the run is gone")


# ------------------------------------------------------------------ the runs


@dataclass
class Tally:
    takeovers: list[Takeover] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)  # the asks, clicks and `drain done`s


def asked_and_approved(site: Installation, rng: random.Random, words: str, tally: Tally) -> tuple[str, Any, list[str]]:
    """An operator asks over Slack, two approvers press Approve on the card, and the
    Lease holder's scheduler starts the run. Returns the request, its run and the approvers."""
    asked = slash(site, DRAINER, words, "ask")
    tally.sent.append(asked)
    found = re.search(r"(req-[0-9a-z]+)", answer_of(site.slack, asked.key))
    assert found, answer_of(site.slack, asked.key)
    request_id = found.group(1)
    approvers = rng.sample(APPROVERS, 2)
    for approver in approvers:
        tally.sent.append(press_approve(site, approver, request_id))
    wait_until(lambda: stored_runs.for_request(site.db, request_id=request_id), timeout=60,  # type: ignore[arg-type]
               what=f"the scheduler to start the run of {request_id}")
    (run,) = stored_runs.for_request(site.db, request_id=request_id)  # type: ignore[arg-type]
    return request_id, run, approvers


def kill_points(rng: random.Random, total: int) -> list[int]:
    """After how many of the run's `total` steps done each kill lands (1 to all but one)."""
    return sorted(rng.sample(range(1, total), rng.randint(*KILLS_PER_RUN)))


def check_approvals(site: Installation, request_id: str, approvers: list[str], where: str) -> None:
    decided = site.db.query("SELECT approver, decision FROM approvals WHERE request_id = ?", (request_id,))
    assert Counter((d["approver"], d["decision"]) for d in decided) == Counter(
        {(a, "approve"): 1 for a in approvers}), (where, decided)


def drain(site: Installation, rng: random.Random, log: AuditLog, index: int, tally: Tally) -> None:
    where = f"drain {index} (seed {figures.SEED})"
    pods = {n: _trainer_pod(site.installer, n) for n in NODES}
    mark = log.mark()
    request_id, run, approvers = asked_and_approved(site, rng, f"drain fo failover {index}", tally)
    done_said = False
    for after in kill_points(rng, len(NODES) * len(STEPS_PER_NODE)):
        if not done_said and after > 2:  # wave 1's hold runs after its cordon and eviction
            _wait_hold(site.db, run.id)
            tally.sent.append(slash(site, DRAINER, f"drain done {request_id}", "drain-done"))
            done_said = True
        _kill(site, run.id, after, where, tally)
    if not done_said:
        _wait_hold(site.db, run.id)
        tally.sent.append(slash(site, DRAINER, f"drain done {request_id}", "drain-done"))
    finished = h.wait_run(site.db, run.id, timeout=300)
    assert finished.state == "succeeded", (where, finished.halted_reason)
    # Each node cordoned, its pod evicted, uncordoned: once, whoever held the Lease.
    expected = Counter({f"cordon nodes {n}": 1 for n in NODES})
    expected.update({f"uncordon nodes {n}": 1 for n in NODES})
    expected.update({f"evict pods fojobs/{p}": 1 for p in pods.values()})
    writes = Counter({w: n for w, n in log.counts(since=mark).items() if not w.startswith("create events ")})
    assert writes == expected, (where, writes)
    for node in NODES:
        order = [r.detail["kind"] for r in _steps_done(site.db, run.id) if isinstance(r.detail, dict)
                 and r.target == node]
        assert order == list(STEPS_PER_NODE), (where, node, order)
        assert not h.unschedulable(site.installer, node), (where, node)
    check_approvals(site, request_id, approvers, where)


def upgrade(site: Installation, rng: random.Random, log: AuditLog, index: int, tally: Tally) -> None:
    version = VERSIONS[(index + 1) % 2]  # the other one than the pool runs now
    where = f"upgrade {index} to {version} (seed {figures.SEED})"
    mark = log.mark()
    back = " --downgrade" if version == VERSIONS[0] else ""  # every other run goes back
    request_id, run, approvers = asked_and_approved(site, rng, f"upgrade upg to {version}{back} failover {index}",
                                                    tally)
    for after in kill_points(rng, len(RunService(site.db).get(run.id).steps)):
        _kill(site, run.id, after, where, tally)
    finished = h.wait_run(site.db, run.id, timeout=300)
    assert finished.state == "succeeded", (where, finished.halted_reason)
    writes = [w for w in log.writes(since=mark) if w.resource != "events"]
    by_kind = Counter(f"{w.what} {w.resource}" + (f" {w.target.split('/')[0]}" if "/" in w.target else "")
                      for w in writes)
    assert by_kind == Counter({"patch nvidiadrivers": 1, "cordon nodes": len(UPG_NODES),
                               "delete pods gpu-operator": len(UPG_NODES),
                               "uncordon nodes": len(UPG_NODES)}), (where, [str(w) for w in writes])
    for node in UPG_NODES:
        assert not h.unschedulable(site.installer, node), (where, node)
        wait_until(lambda node=node: h.node(site.installer, node)["metadata"]["labels"].get(
            "nvidia.com/cuda.driver-version.full") == version, timeout=60, what=f"{node} on {version}")
    check_approvals(site, request_id, approvers, where)


def _kill(site: Installation, run_id: Any, after: int, where: str, tally: Tally) -> None:
    taken = kill_holder(site, run_id, after_steps=after)
    if taken is None:
        print(f"{where}: the run ended before its kill after {after} steps")
    if taken is not None:
        print(f"{where}: killed after {after} steps ({taken.at_step}); the Lease held in {taken.holder_s:.1f} s, "
              f"the run's next row in {taken.commit_s and round(taken.commit_s, 1)} s")
        tally.takeovers.append(taken)


# ------------------------------------------------------------------ the test


@pytest.mark.timeout(max(600, 120 * (DRAINS + UPGRADES)))  # about a minute a run; the suite's 600 s is per test
def test_the_lease_holder_killed_in_the_middle_of_drains_and_upgrades_the_other_replica_takes_over_and_loses_nothing(
        installation, cluster):
    site, slack = installation, installation.slack
    rng = random.Random(figures.SEED)
    log = AuditLog(cluster.plane.audit_log)
    tally = Tally()
    print(f"\nfailover: seed {figures.SEED}, {DRAINS} drains and {UPGRADES} upgrades, "
          f"lease {SETTINGS.duration_seconds} s")
    with Crowd(site, figures.SEED) as crowd:
        for index in range(max(DRAINS, UPGRADES)):
            if index < DRAINS:
                drain(site, rng, log, index, tally)
            if index < UPGRADES:
                upgrade(site, rng, log, index, tally)
    takeovers = tally.takeovers
    assert len(takeovers) >= max(1, (DRAINS + UPGRADES) // 2), "too few kills landed inside a run"

    # Every request answered 200, and on its response_url exactly once.
    everything = crowd.sent + tally.sent
    assert Counter(s.status for s in everything) == Counter({200: len(everything)})
    # Every request answered, those the killed replica acknowledged and never answered too
    # (by the survivor that took them over from the inbox).
    try:
        wait_until(lambda: all(slack.response_posts(s.key) for s in everything), timeout=ANSWERED_WITHIN,
                   what="every request to be answered")
    except TimeoutError:  # say which
        unanswered = [(s.kind, s.user, s.tried) for s in everything if not slack.response_posts(s.key)]
        raise AssertionError(f"{len(unanswered)} requests never answered: {unanswered[:20]}") from None
    time.sleep(2.0)  # an answer sent late (or twice) would show now
    # What the killed replicas had acknowledged and not answered: each survivor says what it took over.
    taken_over = [line for r in site.replicas for line in r.lines("fell silent before answering it: ")]
    twice = [s for s in everything if len(slack.response_posts(s.key)) > 1]
    # Answered twice is the one gap the inbox leaves (at least once, never lost): a replica
    # killed after it answered and before it marked the delivery answered, whose survivor
    # runs it again (its side effects stay single). Any other second answer is a defect.
    killed = {r.name for r in site.replicas if not r.alive()}
    after_a_kill = [s for s in twice if set(s.tried) & killed]
    unexplained = [s for s in twice if s not in after_a_kill]
    assert not unexplained, [(s.kind, s.user, s.tried, len(slack.response_posts(s.key)),
                              [line for r in site.replicas for line in r.lines(s.user)][-6:])
                             for s in unexplained][:10]
    for s in tally.sent:
        if s.kind == "approve":
            assert "You approved" in answer_of(slack, s.key), answer_of(slack, s.key)

    # The Lease changed hands within its duration and the look's period; the chain holds.
    slow = [t.holder_s for t in takeovers if t.holder_s > TAKEOVER_LIMIT]
    assert not slow, (slow, TAKEOVER_LIMIT)
    assert audit.verify(site.db).ok
    errors = {r.name: r.errors() for r in site.replicas if r.errors()}
    assert not errors, errors

    holders = [t.holder_s for t in takeovers]
    commits = [t.commit_s for t in takeovers if t.commit_s is not None]
    figures.record("failover", {
        "drains": DRAINS, "upgrades": UPGRADES, "kills": len(takeovers), "people": len(PEOPLE),
        "replicas_started": site.started,
        "lease_duration_s": SETTINGS.duration_seconds, "takeover_limit_s": round(TAKEOVER_LIMIT, 2),
        "takeover_s": {"p50": round(percentile(holders, 0.5), 2), "p95": round(percentile(holders, 0.95), 2),
                       "max": round(max(holders), 2)},
        "first_commit_s": ({"p50": round(percentile(commits, 0.5), 2), "p95": round(percentile(commits, 0.95), 2)}
                           if commits else None),
        "kill_points": dict(sorted(Counter(t.at_step for t in takeovers).items())),
        "requests": len(everything), "retried_on_the_other_replica": site.service.retried,
        "lost": 0, "answered_by_the_survivor": len(taken_over), "answered_twice": len(after_a_kill), "side_effects_repeated": 0,
        "approvals_counted_twice": 0,
        "audit_chain": "verifies"})


def _trainer_pod(installer: Any, node: str) -> str:
    app = f"trainer-{node[-2:]}"
    wait_until(lambda: any(h.running_ready(p) for p in h.workload_pods(installer, "fojobs", app)),
               timeout=90, what=f"the trainer pod on {node} to run")
    (pod,) = [p for p in h.workload_pods(installer, "fojobs", app) if h.running_ready(p)]
    return str(pod["metadata"]["name"])


def _wait_hold(db: Database, run_id: Any) -> None:
    """Until wave 1's hold runs (the engine's step.running row of a hold)."""
    wait_until(lambda: any(r.action in ("step.running", "step.done") and isinstance(r.detail, dict)
                           and r.detail.get("kind") == "hold" for r in audit.for_run(db, run_id)),
               timeout=180, what="wave 1's hold")
