"""Load (issue 21): 20 people use the bot over HTTP while it drains a pool. Every action is
acknowledged within Slack's 3 s, none is lost or done twice, and the drain runs exactly as
its plan says.

The bot is what `gpuops run --http` runs, in this process: the Bolt app behind waitress
(really signed requests over a real socket), a watch cache of the local control plane's
simulated fleet, and, as the holder of a real Kubernetes Lease, the engine, the scheduler
and the notifier. Slack is the fake Web API (tests/fixtures/bots.py).

The drain: operator O01 asks `/gpu drain busy` (6 nodes, each running a trainer pod;
`max_unavailable: 2`, so 3 waves), approver A01 presses Approve on its card, and the
scheduler starts the run at once (the pool's window is `always`). Wave 1 is cordoned,
evicted and held until someone says `drain done`; the crowd starts then, and an operator
of the crowd says `drain done` over Slack halfway through, so the other waves cordon,
evict, validate and uncordon while the crowd goes on.

The crowd: 20 Slack users (6 viewers, 8 operators, 6 approvers), each a thread with its
own seeded generator (figures.SEED), pausing an exponential think time between actions,
send `count(100, 1000)` requests between them: `/gpu status [busy]`, `/gpu node <n>`,
`/gpu help`, `/gpu node` of a node that does not exist (refused), drain requests for the
serving pool (two approvers each, in its window days away, so none runs; each its own
node and hour, so the pool's capacity rule refuses none), Approve presses
on those cards (two distinct approvers, never the requester) and Deny presses with the
reason form, viewers pressing Approve (refused), and Slack's retry of an operator's drain
request (X-Slack-Retry-Num: it must not file it twice). Approvers press buttons on the
cards the notifier posted to the channel, as people do.

Checked, not timed (except Slack's 3 s, a product requirement): every request 200 within
3 s; every action's answer delivered exactly once (the response_url of a command or a
click: once each; the reason form opened once per Deny; every outbox message posted once,
nothing else posted); each drain request stored once, each retry dropped, each approval
and denial counted once, the serving requests in the states those decisions make; the
drain run succeeded with each node cordoned, evicted and uncordoned once, its steps in
order, nothing else changed in the cluster, and the audit chain verifies; and the bot
logged no ERROR.

The figures (ack p50/p99/max, absolute and against the same server's /healthz round trip
and an idle ack measured first; the time from a request to its answer) go to
tests/reliability/results/load.json under `make reliability`. The test's own 20 client threads and the fake Slack share the bot's process
(and GIL), so the latencies are an upper bound of what the bot alone would show.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import re
import statistics
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.http_server import SlackHttpServer
from bot.modals import DENY_CALLBACK, REASON_ACTION, REASON_BLOCK
from bot.slack_api import SlackApi, web_client
from bot.slack_app import IncomingDeliveries, SlackBot, build_app
from bot.wiring import Runtime, build_runtime
from storage import audit
from storage import runs as stored_runs
from testenv import fleet as fl
from testenv.fakeslack import FakeSlackWebApi, signing
from testenv.install import wait_until
from testenv.summary import advertised
from tests.e2e.harness import CHANNEL, SECRET, answer_of, send
from tests.integration import engine_harness as h
from tests.reliability import figures
from tests.reliability.figures import percentile
from workflows.config import GpuopsConfig
from workflows.engine.lease import EngineLease, LeaseSettings


ACTIONS = figures.count(100, 1000)
ACK_LIMIT = 3.0  # seconds: Slack retries a request not acknowledged within this
THINK_MEAN = 1.0  # seconds a person takes between two actions (exponential)
DRAIN_DONE_AT = 0.5  # share of the crowd's actions sent when `drain done` is said
BASELINE_ROUNDS = 30

VIEWERS = tuple(f"U0VIEW{i:02d}" for i in range(1, 7))
OPERATORS = tuple(f"U0OPER{i:02d}" for i in range(1, 9))
APPROVERS = tuple(f"U0APPR{i:02d}" for i in range(1, 7))
PEOPLE = VIEWERS + OPERATORS + APPROVERS
DRAINER, FIRST_APPROVER = OPERATORS[0], APPROVERS[0]
BUSY_NODES = tuple(f"busy-{i:02d}" for i in range(1, 7))
SERVE_NODES = tuple(f"serve-{i:02d}" for i in range(1, 5))
FLEET = fl.FleetSpec(
    name="load", system_nodes=0,
    pools=(fl.PoolSpec(name="busy", nodes=len(BUSY_NODES)),
           fl.PoolSpec(name="serve", kind="serving", nodes=len(SERVE_NODES))),
    workloads=(*(fl.WorkloadSpec(name=f"trainer-{n[-2:]}", namespace="loadjobs", node=n) for n in BUSY_NODES),
               *(fl.WorkloadSpec(name=f"llm-{n[-2:]}", namespace="loadserve", node=n) for n in SERVE_NODES)))
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def serve_window_start() -> dt.datetime:
    """The next start of the serving pool's window: 02:00 UTC three days from today."""
    today = dt.datetime.now(dt.timezone.utc).replace(hour=2, minute=0, second=0, microsecond=0)
    return today + dt.timedelta(days=3)


def load_config() -> GpuopsConfig:
    """busy: drains at any time with one approval. serve: two approvals, and its only
    window (weekly, 02:00-06:00 UTC) opens three days from now, so none of the crowd's
    requests starts a run."""
    serve_day = DAYS[serve_window_start().weekday()]
    roles = {**{u: ["viewer"] for u in VIEWERS}, **{u: ["operator"] for u in OPERATORS},
             **{u: ["approver"] for u in APPROVERS}}
    return GpuopsConfig.model_validate({
        "pools": {
            "busy": {"kind": "training", "windows": "always", "max_unavailable": 2, "min_ready_gpus": 0,
                     "approvals": {"drain": 1}, "approvers": list(APPROVERS)},
            "serve": {"kind": "serving", "max_unavailable": len(SERVE_NODES), "min_ready_gpus": 0,
                      "approvals": {"drain": 2}, "approvers": list(APPROVERS),
                      "windows": [{"days": [serve_day], "start": "02:00", "end": "06:00", "timezone": "UTC"}]},
        },
        "access": {"users": roles, "names": {u: u.lower() for u in PEOPLE}},
    })


# ------------------------------------------------------------------ the bot, as `gpuops run --http` runs it


class MutationLog(logging.Handler):
    """The gateway's "mutation: ..." lines (every write it sends to the API server)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("mutation"):
            self.lines.append((time.monotonic(), text))

    def writes(self) -> list[str]:
        return h.mutations("\n".join(f"x {text}" for _, text in self.lines))


class Complaints(logging.Handler):
    """What the bot logged at WARNING or above (an ERROR is a failure somewhere)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records if r.levelno >= logging.ERROR]


@dataclass
class LoadBot:
    url: str
    health_url: str
    slack: FakeSlackWebApi
    runtime: Runtime
    deliveries: IncomingDeliveries
    mutations: MutationLog
    complaints: Complaints
    installer: Any


@pytest.fixture
def load_bot(cluster, fleet, slack: FakeSlackWebApi, tmp_path: Path) -> Iterator[LoadBot]:
    fleet(FLEET)
    installer = cluster.installer()
    wait_until(lambda: all(advertised(h.node(installer, n)) == 8 for n in BUSY_NODES + SERVE_NODES), timeout=120,
               what="the load fleet to advertise its GPUs")
    for user in PEOPLE:
        slack.workspace.add_user(user, name=user.lower())
    mutations = MutationLog()
    kube_log = logging.getLogger("gpuops.kube")
    level = kube_log.level
    kube_log.setLevel(logging.INFO)
    kube_log.addHandler(mutations)
    complaints = Complaints()
    logging.getLogger("gpuops").addHandler(complaints)
    runtime = build_runtime(load_config(), kubeconfig=str(cluster.kubeconfig), context="admin",
                            database=tmp_path / "gpuops.db")
    client = web_client(slack.bot_token, base_url=slack.base_url)
    deliveries = IncomingDeliveries(keep=100_000)
    app, _ = build_app(runtime, client=client, signing_secret=SECRET,
                       bot=SlackBot(runtime, SlackApi(client), deliveries=deliveries))
    server = SlackHttpServer(app, signing_secret=SECRET, host="127.0.0.1", port=0).start()
    assert runtime.gateway is not None
    lease = EngineLease(runtime.gateway, identity="gpuops-load-0",
                        settings=LeaseSettings(namespace="default", name="gpuops-load"))
    try:
        leadership = runtime.start_background("gpuops-load-0", slack=client, lease=lease)
        leadership.wait_until(True, timeout=30)
        wait_until(lambda: all((n := runtime.fleet.fleet(h.now()).nodes.get(name)) is not None  # type: ignore[attr-defined]
                               and n.advertised_gpus == 8 for name in BUSY_NODES + SERVE_NODES),
                   timeout=60, what="the bot's watch cache to see the fleet")
        yield LoadBot(url=server.url, health_url=server.health_url, slack=slack, runtime=runtime,
                      deliveries=deliveries, mutations=mutations, complaints=complaints,
                      installer=installer)
    finally:
        server.stop()
        runtime.close()
        kube_log.removeHandler(mutations)
        logging.getLogger("gpuops").removeHandler(complaints)
        kube_log.setLevel(level)


# ------------------------------------------------------------------ what Slack sends, and what came of it


@dataclass
class Sent:
    """One request the crowd (or the set-up) sent, and what it should have caused."""

    kind: str  # status, pool-status, node, help, unknown-node, drain, drain-done, retry, approve, refused-approve, deny-click, deny
    user: str
    started: float  # time.monotonic() when sent
    sent_at: float = 0.0  # time.time() when sent (the fake Slack's clock)
    seconds: float = 0.0  # the HTTP round trip until the answer
    status: int = 0
    key: str | None = None  # the response_url it carries (None: the deny form, which has none)
    posts: int = 1  # how many answers its own response_url should get
    request_id: str | None = None  # the request a click decides
    tag: str | None = None  # a drain request's reason (unique)
    body: bytes = b""


def _key(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def slash(bot: LoadBot, user: str, text: str, kind: str, **extra: Any) -> Sent:
    url = bot.slack.response_url(channel=CHANNEL, user=user)
    body = signing.slash_command_body(text=text, user_id=user, user_name=user.lower(), channel_id=CHANNEL,
                                      response_url=url)
    return deliver(bot, Sent(kind=kind, user=user, started=0.0, key=_key(url), body=body, **extra))


def press(bot: LoadBot, user: str, card: Card, label: str, kind: str, *, trigger: str | None = None,
          posts: int = 1) -> Sent:
    button = card.buttons[label]
    url = bot.slack.response_url(channel=CHANNEL, message_ts=card.ts, user=user)
    body = signing.block_actions_body(action_id=button["action_id"], value=button["value"], user_id=user,
                                      user_name=user.lower(), message_ts=card.ts, channel_id=CHANNEL,
                                      response_url=url, block_id="intents",
                                      **({"trigger_id": trigger} if trigger else {}))
    return deliver(bot, Sent(kind=kind, user=user, started=0.0, key=_key(url), body=body, posts=posts,
                             request_id=card.request_id))


def deliver(bot: LoadBot, sent: Sent, *, headers: dict[str, str] | None = None) -> Sent:
    sent.started, sent.sent_at = time.monotonic(), time.time()
    answer = send(bot.url, sent.body, headers=headers)
    sent.status, sent.seconds = answer.status, answer.seconds
    return sent


@dataclass(frozen=True)
class Card:
    """A request's message in the channel, as people see it now."""

    request_id: str
    ts: str
    buttons: dict[str, dict[str, Any]]


def cards(slack: FakeSlackWebApi) -> list[Card]:
    found = []
    for message in slack.workspace.messages(CHANNEL):
        if message.thread_ts is not None:
            continue
        buttons = {e["text"]["text"]: e for b in message.blocks or [] if b.get("type") == "actions"
                   for e in b["elements"]}
        if "Approve" in buttons:
            found.append(Card(buttons["Approve"]["value"].split("/")[0], message.ts, buttons))
    return found


def card_of(slack: FakeSlackWebApi, request_id: str) -> Card:
    wait_until(lambda: any(c.request_id == request_id for c in cards(slack)), timeout=30,
               what=f"the card of {request_id} in the channel")
    return next(c for c in cards(slack) if c.request_id == request_id)


# ------------------------------------------------------------------ the crowd


@dataclass
class Decisions:
    """Which approver decides which serving request (so the outcome is known ahead):
    two approvals each, or one denial before any approval."""

    approvers: dict[str, list[str]] = field(default_factory=dict)
    denied_by: dict[str, str] = field(default_factory=dict)


class Crowd:
    """20 people, one thread each, sending `total` requests between them."""

    def __init__(self, bot: LoadBot, *, total: int, busy_request: str) -> None:
        self.bot, self.total, self.busy_request = bot, total, busy_request
        self.lock = threading.Lock()
        self.reserved = 0
        self.sent: list[Sent] = []
        self.decisions = Decisions()
        self.drain_done: Sent | None = None
        self.errors: list[BaseException] = []
        self.last_drain: dict[str, Sent] = {}
        self.filings = 0

    def run(self) -> None:
        threads = [threading.Thread(target=self._person, args=(user,), name=f"load-{user}", daemon=True)
                   for user in PEOPLE]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        assert not any(t.is_alive() for t in threads), "a person of the crowd never finished"
        if self.errors:
            raise self.errors[0]

    def _reserve(self, slots: int) -> int | None:
        """The index of the first of `slots` actions, or None when the crowd is done."""
        with self.lock:
            if self.reserved + slots > self.total:
                return None
            self.reserved += slots
            return self.reserved - slots

    def _keep(self, *sent: Sent) -> None:
        with self.lock:
            self.sent.extend(sent)

    def _person(self, user: str) -> None:
        rng = random.Random(f"{figures.SEED}/{user}")
        try:
            while True:
                time.sleep(rng.expovariate(1 / THINK_MEAN))
                if not self._act(user, rng):
                    return
        except BaseException as err:  # noqa: BLE001 - reported by run()
            self.errors.append(err)

    def _act(self, user: str, rng: random.Random) -> bool:
        if user in OPERATORS and self._drain_done_due():
            return self._say_drain_done(user)
        if user in APPROVERS and rng.random() < 0.6:
            decided = self._decide(user, rng)
            if decided is not None:
                return decided
        if user in VIEWERS and rng.random() < 0.1:
            pressed = self._viewer_presses_approve(user, rng)
            if pressed is not None:
                return pressed
        if user in OPERATORS:
            roll = rng.random()
            if roll < 0.3:
                return self._ask_for_drain(user, rng)
            if roll < 0.35 and user in self.last_drain:
                return self._slack_retries(user)
        return self._look(user, rng)

    # what anyone does: look at the fleet
    def _look(self, user: str, rng: random.Random) -> bool:
        index = self._reserve(1)
        if index is None:
            return False
        roll = rng.random()
        if roll < 0.35:
            sent = slash(self.bot, user, "status", "status")
        elif roll < 0.5:
            sent = slash(self.bot, user, "status busy", "pool-status")
        elif roll < 0.75:
            sent = slash(self.bot, user, f"node {rng.choice(BUSY_NODES + SERVE_NODES)}", "node")
        elif roll < 0.9:
            sent = slash(self.bot, user, "help", "help")
        else:
            sent = slash(self.bot, user, f"node busy-{rng.randint(40, 99)}", "unknown-node")
        self._keep(sent)
        return True

    # operators
    def _ask_for_drain(self, user: str, rng: random.Random) -> bool:
        index = self._reserve(1)
        if index is None:
            return False
        with self.lock:
            slot, self.filings = self.filings, self.filings + 1
        # Each request its own node and hour of a window (a week per 16): the pool's capacity
        # rule counts open requests that overlap, and none of these may be refused for it.
        node, hour, week = SERVE_NODES[slot % 4], 2 + (slot // 4) % 4, slot // 16
        day = (serve_window_start() + dt.timedelta(weeks=week)).date()
        tag = f"load-{figures.SEED}-{index}"
        sent = slash(self.bot, user, f"drain {node} at {day} {hour:02d}:00 for 50m {tag}", "drain", tag=tag)
        self.last_drain[user] = sent
        self._keep(sent)
        return True

    def _slack_retries(self, user: str) -> bool:
        """Slack sends the operator's last drain request again, as it does when an ack is
        late: same body, a new signature, X-Slack-Retry-Num."""
        if self._reserve(1) is None:
            return False
        first = self.last_drain.pop(user)
        retry = Sent(kind="retry", user=user, started=0.0, key=first.key, posts=0, tag=first.tag, body=first.body)
        self._keep(deliver(self.bot, retry, headers={"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}))
        return True

    def _drain_done_due(self) -> bool:
        with self.lock:
            return self.drain_done is None and self.reserved >= self.total * DRAIN_DONE_AT

    def _say_drain_done(self, user: str) -> bool:
        with self.lock:
            if self.drain_done is not None or self.reserved + 1 > self.total:
                return self.reserved < self.total
            self.reserved += 1
            self.drain_done = Sent(kind="drain-done", user=user, started=0.0)  # claimed
        sent = slash(self.bot, user, f"drain done {self.busy_request}", "drain-done")
        with self.lock:
            self.drain_done = sent
        self._keep(sent)
        return True

    # approvers: a card they may still decide, with the outcome settled here
    def _decide(self, user: str, rng: random.Random) -> bool | None:
        deny = rng.random() < 0.15
        candidates = [c for c in cards(self.bot.slack) if c.request_id != self.busy_request]
        rng.shuffle(candidates)
        with self.lock:
            card = next((c for c in candidates if c.request_id not in self.decisions.denied_by
                         and user not in self.decisions.approvers.get(c.request_id, [])
                         and len(self.decisions.approvers.get(c.request_id, [])) < 2
                         and (not deny or not self.decisions.approvers.get(c.request_id))), None)
            if card is None:
                return None
            slots = 2 if deny else 1
            if self.reserved + slots > self.total:
                return None
            self.reserved += slots
            if deny:
                self.decisions.denied_by[card.request_id] = user
            else:
                self.decisions.approvers.setdefault(card.request_id, []).append(user)
        if not deny:
            self._keep(press(self.bot, user, card, "Approve", "approve"))
            return True
        # Deny asks for a reason in a form first; its answer goes to the click's response_url.
        trigger = f"{random.Random(f'{figures.SEED}/{card.request_id}').randrange(10**9)}.T0GPUOPS.load-deny"
        click = press(self.bot, user, card, "Deny", "deny-click", trigger=trigger)
        opened = self.bot.slack.wait_for("views.open", lambda c: c.args.get("trigger_id") == trigger, timeout=30)
        time.sleep(rng.expovariate(1 / THINK_MEAN))  # typing the reason
        form = Sent(kind="deny", user=user, started=0.0, key=None, posts=0, request_id=card.request_id,
                    body=signing.view_submission_body(
                        callback_id=DENY_CALLBACK, user_id=user, private_metadata=opened.args["view"]["private_metadata"],
                        values={REASON_BLOCK: {REASON_ACTION: f"load test: {card.request_id} not this week"}}))
        self._keep(click, deliver(self.bot, form))
        return True

    # viewers: pressing a button that is not theirs
    def _viewer_presses_approve(self, user: str, rng: random.Random) -> bool | None:
        candidates = [c for c in cards(self.bot.slack) if c.request_id != self.busy_request]
        if not candidates:
            return None
        if self._reserve(1) is None:
            return False
        self._keep(press(self.bot, user, rng.choice(candidates), "Approve", "refused-approve"))
        return True


# ------------------------------------------------------------------ figures


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"p50": ms(percentile(values, 0.5)), "p99": ms(percentile(values, 0.99)), "max": ms(max(values))}


CLICKS = frozenset({"approve", "refused-approve", "deny-click", "deny"})


def healthz_round_trips(url: str, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=5) as answer:
            answer.read()
        times.append(time.perf_counter() - started)
    return times


# What each kind's answer says (its response_url post).
ANSWERS = {
    "status": "GPU fleet status",
    "pool-status": "GPU pool busy",
    "unknown-node": "No GPU node named",
    "help": "gpuops: GPU fleet operations",
    "drain": "Drain req-",
    "drain-done": "ended early",
    "refused-approve": "needs the approver role",
}


def test_twenty_people_using_the_bot_over_http_while_a_drain_runs_lose_nothing_and_do_nothing_twice(load_bot):
    bot, slack, runtime = load_bot, load_bot.slack, load_bot.runtime
    db = runtime.database.get()
    installer_pods = _pods_by_node(load_bot.installer)

    # The idle floor: the same server's /healthz, and acks of /gpu help with nothing else going on.
    warm_up = [slash(bot, VIEWERS[0], "help", "help") for _ in range(5)]  # first requests are slower
    health = healthz_round_trips(bot.health_url, BASELINE_ROUNDS)
    idle = [slash(bot, VIEWERS[0], "help", "help") for _ in range(BASELINE_ROUNDS)]
    assert all(s.status == 200 for s in idle)

    # The drain: asked for and approved over Slack; the scheduler starts it at once.
    asked = slash(bot, DRAINER, "drain busy kernel patch under load", "drain")
    busy_request = re.search(r"Drain (req-[0-9a-z]+)", answer_of(slack, asked.key or "")).group(1)  # type: ignore[union-attr]
    approved = press(bot, FIRST_APPROVER, card_of(slack, busy_request), "Approve", "approve")
    wait_until(lambda: stored_runs.for_request(db, request_id=busy_request), timeout=30,  # type: ignore[arg-type]
               what="the scheduler to start the drain's run")
    (run,) = stored_runs.for_request(db, request_id=busy_request)  # type: ignore[arg-type]
    runs = runtime.services().runs
    assert runs is not None
    wait_until(lambda: sum(s.kind == "hold" and s.state == "running" for s in runs.get(run.id).steps) == 2,
               timeout=90, what="wave 1 to be cordoned, evicted and held")
    setup = [*warm_up, *idle, asked, approved]

    crowd = Crowd(bot, total=ACTIONS, busy_request=busy_request)
    load_started = time.monotonic()
    crowd.run()
    load_ended = time.monotonic()
    if crowd.drain_done is None or crowd.drain_done.status == 0:  # a crowd too small to reach the middle
        setup.append(slash(bot, DRAINER, f"drain done {busy_request}", "drain-done"))
    load = crowd.sent
    everything = setup + load

    # Everything acknowledged in time, then everything done.
    statuses = Counter(s.status for s in everything)
    slow = [s for s in everything if s.seconds >= ACK_LIMIT]
    assert statuses == Counter({200: len(everything)}), statuses
    assert not slow, [(s.kind, s.user, round(s.seconds, 2)) for s in slow]
    assert len(load) == ACTIONS
    bot.deliveries.wait_for(lambda ds: len(ds) >= len(everything), timeout=120)
    finished = h.wait_run(db, run.id, timeout=240)
    wait_until(lambda: db.query_one("SELECT count(*) AS n FROM outbox WHERE state != 'sent'")["n"] == 0,  # type: ignore[index]
               timeout=120, what="the notifier to deliver the outbox")
    time.sleep(1.0)  # anything late (a second answer, a stray post) would show now
    run_ended = _run_end(finished)

    # Not one delivery lost, failed or run twice: only the retries were dropped.
    outcomes = Counter(d.outcome for d in bot.deliveries.all())
    retries = sum(s.kind == "retry" for s in load)
    refused_presses = sum(s.kind == "refused-approve" for s in everything)
    assert outcomes == +Counter({"answered": len(everything) - retries - refused_presses,
                                 "refused": refused_presses, "duplicate": retries}), outcomes

    # Each answer reached its response_url exactly once; nothing else was posted.
    posts_by_key = Counter(p.key for p in slack.response_posts())
    expected_posts = Counter({s.key: s.posts for s in everything if s.key and s.posts})
    for s in everything:
        if s.kind == "deny-click":
            expected_posts[s.key] = 1  # "You denied ..." from the reason form
    assert not [p for p in slack.response_posts() if not p.ok]
    assert posts_by_key == expected_posts, _differences(posts_by_key, expected_posts)
    for s in everything:
        if s.kind in ANSWERS and s.key:
            assert ANSWERS[s.kind] in answer_of(slack, s.key), (s.kind, s.user, answer_of(slack, s.key)[:300])
    for s in everything:
        if s.kind in ("node", "unknown-node"):
            node = _body_text(s.body).split("node ", 1)[1]
            assert node in answer_of(slack, s.key or ""), (s.kind, answer_of(slack, s.key or "")[:300])
    denies = [s for s in load if s.kind == "deny-click"]
    assert len(slack.calls("views.open")) == len(denies)
    for s in everything:
        if s.kind == "approve":
            assert f"You approved {s.request_id}" in answer_of(slack, s.key or ""), answer_of(slack, s.key or "")
        if s.kind == "deny-click":
            assert f"You denied {s.request_id}" in answer_of(slack, s.key or ""), answer_of(slack, s.key or "")
    assert not slack.calls("chat.postEphemeral") and not slack.calls("conversations.open")

    # Every outbox message posted once; the bot posted nothing else.
    sent_rows = db.query("SELECT id, kind, message_ts, attempts FROM outbox ORDER BY id")
    posted = [c for c in slack.calls("chat.postMessage")]
    posts_rows = [r for r in sent_rows if r["kind"] == "post"]
    assert all(c.ok for c in posted)
    assert len(posted) == len(posts_rows), (len(posted), len(posts_rows))
    assert sorted(c.response["ts"] for c in posted) == sorted(r["message_ts"] for r in posts_rows)

    # Each drain request stored once, the retries filed nothing, each decision counted once.
    filed = {s.tag: s for s in everything if s.kind == "drain" and s.tag}
    rows = db.query("SELECT id, reason, state, requester FROM requests WHERE pool = 'serve'")
    stored = Counter(r["reason"] for r in rows)
    assert stored == Counter(list(filed)), _differences(stored, Counter(list(filed)))
    by_id = {r["id"]: r for r in rows}
    decided = db.query("SELECT request_id, approver, decision FROM approvals")
    expected_decisions = Counter({(busy_request, FIRST_APPROVER, "approve"): 1})
    for request_id, approvers in crowd.decisions.approvers.items():
        expected_decisions.update((request_id, a, "approve") for a in approvers)
    for request_id, approver in crowd.decisions.denied_by.items():
        expected_decisions[(request_id, approver, "deny")] += 1
    assert Counter((d["request_id"], d["approver"], d["decision"]) for d in decided) == expected_decisions
    for request_id, row in by_id.items():
        approvals = len(crowd.decisions.approvers.get(request_id, []))
        wanted = ("denied" if request_id in crowd.decisions.denied_by
                  else "approved" if approvals == 2 else "pending")
        assert row["state"] == wanted, (request_id, row["state"], approvals)
    approvals_told = Counter(answer_of(slack, s.key or "").split("You approved ", 1)[1].split(":")[0].split(" ")[0]
                             for s in load if s.kind == "approve")
    fully = [answer_of(slack, s.key or "") for s in load if s.kind == "approve"]
    assert sum("all 2 approvals" in t for t in fully) == sum(len(a) == 2 for a in crowd.decisions.approvers.values())
    assert sum(approvals_told.values()) == sum(len(a) for a in crowd.decisions.approvers.values())
    assert [r["id"] for r in db.query("SELECT id FROM runs")] == [run.id]  # nothing of serve ran

    # The drain ran as planned: each node cordoned, its pod evicted, uncordoned, once.
    assert finished.state == "succeeded", finished.halted_reason
    writes = bot.mutations.writes()
    expected_writes = Counter({f"cordon node {n}": 1 for n in BUSY_NODES})
    expected_writes.update({f"uncordon node {n}": 1 for n in BUSY_NODES})
    expected_writes.update({f"evict pod {ns}/{name} uid={uid}": 1
                            for n in BUSY_NODES for ns, name, uid in installer_pods[n]})
    assert Counter(writes) == expected_writes, _differences(Counter(writes), expected_writes)
    rows_of_run = audit.for_run(db, run.id)
    for node in BUSY_NODES:
        order = [r.detail["kind"] for r in rows_of_run if r.action == "step.done" and r.target == node]
        assert order == ["cordon", "evict", "hold", "validate", "uncordon"], (node, order)
    assert {r.target for r in rows_of_run if r.action == "pod.evict"} == {
        f"{ns}/{name}" for n in BUSY_NODES for ns, name, _ in installer_pods[n]}
    assert audit.verify(db).ok
    assert not bot.complaints.errors(), bot.complaints.errors()[:20]

    # The figures.
    acks = [s.seconds for s in load]
    during = [s.seconds for s in load if s.started <= run_ended]
    writes_during = sum(load_started <= at <= load_ended for at, text in bot.mutations.lines
                        if text.startswith("mutation: "))
    first: dict[str, float] = {}
    for post in slack.response_posts():
        first.setdefault(post.key, post.at)
    health_p50, idle_p50 = statistics.median(health), statistics.median(s.seconds for s in idle)
    figure = {
        "actions": len(load), "people": len(PEOPLE), "think_mean_s": THINK_MEAN,
        "load_seconds": round(load_ended - load_started, 1),
        "by_kind": dict(sorted(Counter(s.kind for s in load).items())),
        "ack_ms": {"p50": ms(percentile(acks, 0.5)), "p99": ms(percentile(acks, 0.99)), "max": ms(max(acks))},
        "ack_ms_commands": _spread([s.seconds for s in load if s.kind not in CLICKS]),
        "ack_ms_clicks_and_forms": _spread([s.seconds for s in load if s.kind in CLICKS]),
        "ack_over_3s": 0, "non_200": 0,
        "healthz_p50_ms": ms(health_p50), "idle_ack_p50_ms": ms(idle_p50),
        "ack_p50_over_healthz": round(percentile(acks, 0.5) / health_p50, 1),
        "ack_p99_over_healthz": round(percentile(acks, 0.99) / health_p50, 1),
        "ack_p50_over_idle_ack": round(percentile(acks, 0.5) / idle_p50, 2),
        "actions_while_the_run_ran": len(during),
        "ack_ms_while_the_run_ran": _spread(during),
        # From the request to its answer on the response_url (the work after the ack).
        "answer_ms": _spread([first[s.key] - s.sent_at for s in load if s.key in first and s.kind != "retry"
                              and s.kind != "deny-click"]),
        "warnings_logged": len(bot.complaints.records), "errors_logged": 0,
        "cluster_writes_during_the_load": writes_during,
        "lost": 0, "duplicated": 0, "retries_dropped": retries,
        "requests_filed": len(filed), "approvals": sum(len(a) for a in crowd.decisions.approvers.values()),
        "denials": len(crowd.decisions.denied_by), "refusals": sum(s.kind in ("unknown-node", "refused-approve")
                                                                  for s in load),
        "response_url_posts": sum(posts_by_key.values()), "outbox_posts": len(posted),
        "drain": {"nodes": len(BUSY_NODES), "waves": len({st.wave for st in runs.get(run.id).steps}),
                  "evictions": len(BUSY_NODES), "state": finished.state,
                  "cluster_writes": len(writes), "audit_chain": "verifies"},
    }
    figures.record("load", figure)


# ------------------------------------------------------------------ helpers


def _pods_by_node(installer: Any) -> dict[str, list[tuple[str, str, str]]]:
    """The trainer pods the drain will evict: (namespace, name, uid) by node."""
    found: dict[str, list[tuple[str, str, str]]] = {}
    for node in BUSY_NODES:
        app = f"trainer-{node[-2:]}"
        wait_until(lambda: any(h.running_ready(p) for p in h.workload_pods(installer, "loadjobs", app)),
                   timeout=90, what=f"the trainer pod on {node} to run")
        found[node] = [("loadjobs", p["metadata"]["name"], p["metadata"]["uid"])
                       for p in h.workload_pods(installer, "loadjobs", app)]
        assert len(found[node]) == 1, found[node]
    return found


def _run_end(run: Any) -> float:
    """The run's end on the monotonic clock (the crowd's timestamps)."""
    ended = run.ended_at or dt.datetime.now(dt.timezone.utc)
    return time.monotonic() - (dt.datetime.now(dt.timezone.utc) - ended).total_seconds()


def _body_text(body: bytes) -> str:
    return urllib.parse.parse_qs(body.decode())["text"][0]


def _differences(found: Counter, expected: Counter) -> str:
    return json.dumps({"missing": {str(k): v for k, v in (expected - found).items()},
                       "extra": {str(k): v for k, v in (found - expected).items()}})[:3000]
