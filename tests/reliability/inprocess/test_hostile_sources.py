"""Hostile sources: a stand-in Prometheus, and stand-in dcgm-exporters on four nodes, that
trickle (headers or body, a byte at a time), stream without end (plain or chunked), stay
silent, send garbage, error pages, pages over the size cap or claiming a huge length, and
answers whose series have odd shapes (non-text labels, unicode digits, NaN, infinities,
dicts, lists, duplicates that disagree, deep nesting, lines that are not the format).

Each case (seeded; `count(8, 300)`) asks what a user would: `/gpu node`, `/gpu findings`,
`/gpu status` and the shift handover's checklist, each rendered for Slack and the console.
The figure (tests/reliability/results/hostile-sources.json under `make reliability`):
cases tried, commands hung (answered later than the source's deadline and a grace), crashes
(anything raised, including by rendering), readers left reading (a stand-in connection
still open, or a reader thread alive, a grace after the commands returned), and the most
memory any case took (tracemalloc's peak over its commands, above what was held before)."""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable

from bot.render_blocks import render_blocks
from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from tests.dcgm_pages import NODES, pages
from tests.e2e.harness import demo_config, demo_snapshot
from tests.hostile_sources import (Behaviour, StandIn, answer, by_query, claims_length, endless, endless_headers,
                                   raw, silent, trickle, vector)
from tests.reliability.figures import SEED, count, record
from workflows.config import GpuopsConfig
from workflows.fleet.summary import build_fleet
from workflows.handover.rotations import RotationConfig
from workflows.handover.service import HandoverService
from workflows.kube.objects import ClusterSnapshot
from workflows.signals.health import GPU_TEMP, SERIES, XID_ERRORS

CASES = count(8, 300)
TIMEOUT = 0.3 if CASES <= 8 else 0.5  # seconds: Prometheus's, and each exporter page's
DEADLINE = 2 * TIMEOUT  # every exporter page
CAP_MB = 1 if CASES <= 8 else 8
# How much later than its deadline a command may answer (parsing what came in, a shared
# 2-core machine) before it counts as hung.
GRACE = 2.0
ROTATION = RotationConfig.model_validate({
    "name": "gpu-oncall", "team": "GPU platform", "channel": "C0GPU", "timezone": "UTC",
    "shifts": [{"name": "day", "starts": "0 8 * * *", "members": ["U0ALICE"]},
               {"name": "night", "starts": "0 20 * * *", "members": ["U0BOB"]}],
})
EXPORTER_IPS = {node: f"127.0.0.{i + 2}" for i, node in enumerate(NODES[:4])}
READER_THREADS = ("dcgm-scrape", "gpuops-answer-deadline")


# --------------------------------------------------------------------------------------
# What hostile sources send


def _odd_value(rng: random.Random) -> object:
    return rng.choice([None, True, 1, -1, 1.5, 10**30, "", "x", "²", "١", "0x10", [], ["1"], {}, {"a": 1},
                       "\u0000", "🔥" * 3, "a" * 5000, [[[]]]])


def _good_item(node: str, gpu: str, name: str, value: str) -> dict:
    return {"metric": {"__name__": name, "gpu": gpu, "UUID": f"GPU-{node}-{gpu}", "Hostname": node},
            "value": [1733300000.0, value]}


def _odd_item(rng: random.Random) -> object:
    node, gpu = rng.choice(NODES), str(rng.randrange(8))
    item = _good_item(node, gpu, rng.choice(SERIES), str(rng.randrange(100)))
    how = rng.randrange(10)
    if how == 0:
        return _odd_value(rng)  # not an object at all
    if how == 1:
        item["metric"][rng.choice(["gpu", "Hostname", "UUID", "__name__", "err_msg", "modelName"])] = _odd_value(rng)
    elif how == 2:
        item["value"] = [1733300000.0, rng.choice(["NaN", "+Inf", "-Inf", "1e999", "abc", "", "0x7f", "1_0"])]
    elif how == 3:
        item["value"] = _odd_value(rng)
    elif how == 4:
        item["value"] = [1733300000.0, _odd_value(rng)]
    elif how == 5:
        item["metric"] = _odd_value(rng)
    elif how == 6:
        item["metric"]["gpu"] = rng.choice(["²", "١", "0٠", "-1", "1.0", " 1", "9" * 30, "GPU-0"])
    elif how == 7:
        item.pop(rng.choice(["metric", "value"]))
    elif how == 8:
        item["metric"].update({f"l{i}": "v" * rng.randrange(200) for i in range(rng.randrange(50))})
    else:
        item["metric"]["Hostname"] = rng.choice(NODES) + rng.choice(["", " ", "\n", "\u200b"])
    return item


def _vector_body(rng: random.Random, *, odd: int) -> bytes:
    items: list[object] = [_good_item(node, str(g), name, str(rng.choice([0, 0, 41, 79, 95])))
                           for node in NODES for g in range(2) for name in (XID_ERRORS, GPU_TEMP)]
    items += [_odd_item(rng) for _ in range(odd)]
    duplicate = dict(rng.choice(items[:4]))  # type: ignore[arg-type]
    duplicate["value"] = [1733300000.0, "13"]
    items.append(duplicate)
    rng.shuffle(items)
    return vector(items)


def _odd_json(rng: random.Random) -> bytes:
    return rng.choice([
        b"[" * 100_000 + b"]" * 100_000,
        json.dumps({"status": "success", "data": [1, 2]}).encode(),
        json.dumps({"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}}).encode(),
        json.dumps({"status": "success", "data": {"resultType": ["vector"], "result": []}}).encode(),
        json.dumps({"status": "error", "error": {"nested": ["x"] * 1000}}).encode(),
        json.dumps({"status": "error", "error": "e" * 100_000}).encode(),
        json.dumps({"status": "success", "data": {"resultType": "vector", "result": [1] * 10_000}}).encode(),
        b'{"status": "success", "data": {"resultType": "vector", "result": [' + b"9" * 5000 + b"]}}",
        json.dumps(["success"]).encode(),
        b"\xff\xfe{}",
        b'{"status": "success"',
    ])


def _page_body(rng: random.Random, node: str) -> bytes:
    """The node's real page with odd lines, labels or values worked in."""
    text = pages()[node]
    how = rng.randrange(8)
    if how == 0:
        text = text.replace('gpu="0"', f'gpu="{rng.choice(["²", "١", "x", "-1", "9" * 30])}"', 1)
    elif how == 1:
        text = text.replace("DCGM_FI_DEV_GPU_TEMP{", "DCGM_FI_DEV_GPU_TEMP{", 1)
        text = _set_value(text, "DCGM_FI_DEV_GPU_TEMP", rng.choice(["NaN", "+Inf", "-Inf", "1e999"]))
    elif how == 2:
        line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_XID_ERRORS{"))
        text += line.rsplit(" ", 1)[0] + " 79\n"  # the same series again, disagreeing
    elif how == 3:
        text += rng.choice(["garbage without a value\n", "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\" 1\n", "{}\n", "\x00\x01\n",
                            "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} abc\n", "# TYPE DCGM_FI_DEV_GPU_TEMP nonsense\n"])
    elif how == 4:
        text = text.replace('modelName="', 'modelName="' + "M" * rng.randrange(10_000, 100_000), 1)
    elif how == 5:
        text += "".join(f'DCGM_FI_DEV_XID_ERRORS{{gpu="{i}",UUID="GPU-{i}"}} {rng.randrange(100)}\n'
                        for i in range(rng.randrange(100, 3000)))
    elif how == 6:
        text += "".join(f"# TYPE c{i} counter\nc{i} 1\n" for i in range(rng.randrange(1000, 20_000)))
    else:
        text = text.encode()[:rng.randrange(len(text))].decode("utf-8", errors="ignore")
    return text.encode()


def _set_value(text: str, name: str, value: str) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            line = line.rsplit(" ", 1)[0] + " " + value
        out.append(line)
    return "\n".join(out) + "\n"


def _hostile(rng: random.Random, *, valid: bytes, kind: str, text: bool) -> tuple[str, Behaviour]:
    """One misbehaviour, around a `valid` answer; (its name, the behaviour)."""
    cap = CAP_MB * 1_000_000
    content = "text/plain" if text else "application/json"
    choices: dict[str, Callable[[], Behaviour]] = {
        "trickle": lambda: trickle(valid, every=rng.uniform(0.01, 0.1), kind=content),
        "endless headers": lambda: endless_headers(every=rng.uniform(0.001, 0.05)),
        "endless body": lambda: endless(rng.randbytes(rng.randrange(1, 4096)), start=valid[:100], kind=content),
        "endless chunked body": lambda: endless(b"x" * rng.randrange(1, 4096), kind=content, chunked=True),
        "silent": silent,
        "garbage": lambda: raw(rng.randbytes(rng.randrange(1, 8192))),
        "garbage after headers": lambda: answer(rng.randbytes(rng.randrange(1, 65536)), kind=content),
        "over the cap": lambda: answer(valid * (cap // max(1, len(valid)) + 1), kind=content),
        "claims a huge length": lambda: claims_length(rng.choice([cap + 1, 10**12, 2**63])),
        "claims more than it sends": lambda: claims_length(len(valid) + rng.randrange(1, 1000), valid),
        "error status": lambda: answer(rng.choice([b"", b"{}", b'{"error": 5}', rng.randbytes(200_000)]),
                                       status=rng.choice([400, 401, 403, 404, 429, 500, 502, 503])),
    }
    name = kind if kind in choices else rng.choice(sorted(choices))
    return name, choices[name]()


# --------------------------------------------------------------------------------------
# One case: the commands a user runs, timed, rendered, with the memory they took


class Cluster:
    def __init__(self, snapshot: ClusterSnapshot, config: GpuopsConfig) -> None:
        self.value = snapshot
        self.assessed = build_fleet(snapshot, settings=config.inventory_settings(), now=snapshot.taken_at)

    def fleet(self, now: dt.datetime):
        return self.assessed

    def snapshot(self, now: dt.datetime) -> ClusterSnapshot:
        return self.value


def _signals_config(source: str, port: int) -> dict:
    if source == "prometheus":
        return {"prometheus": {"url": f"http://127.0.0.1:{port}", "timeout": TIMEOUT}, "max_answer_mb": CAP_MB}
    return {"exporters": {"port": port, "timeout": TIMEOUT, "deadline": DEADLINE, "parallel": 2},
            "max_answer_mb": CAP_MB}


def _run_case(source: str, port: int, tmp_path, index: int) -> dict:
    config = demo_config(signals=_signals_config(source, port))
    cluster = Cluster(demo_snapshot(nodes=len(NODES), unhealthy=0, exporter_ips=EXPORTER_IPS), config)
    signals = config.signals.service(cluster=cluster)  # type: ignore[union-attr]
    fleet_bound = TIMEOUT if source == "prometheus" else DEADLINE
    asked: list[tuple[str, float, Callable[[], object]]] = []
    database = open_database(tmp_path / f"case-{index}.db")
    services = Services.on_database(config=config, fleet=cluster, database=database, signals=signals)
    now = dt.datetime.now(dt.timezone.utc)

    def command(line: str) -> Callable[[], object]:
        def run() -> object:
            reply = dispatch(line, actor=config.actor("U0DAVE"), services=services, now=now)
            render_blocks(reply)
            render_text(reply)
            return reply
        return run

    def handover() -> object:
        return HandoverService(database, config, signals=signals).checklist(
            ROTATION, ROTATION.current_shift(now), fleet=cluster.assessed, now=now)

    asked = [(f"node {NODES[index % 4]}", TIMEOUT, command(f"node {NODES[index % 4]}")),
             ("findings", fleet_bound, command("findings")), ("handover", fleet_bound, handover),
             ("status", 0.0, command("status"))]
    outcome = {"hung": [], "crashes": [], "seconds": 0.0, "slowest": ""}
    tracemalloc.reset_peak()
    # What the stand-ins hold (their pages, some over the cap) is there before and after.
    before = tracemalloc.get_traced_memory()[0]
    try:
        for name, bound, run in asked:
            started = time.monotonic()
            try:
                run()
            except Exception as err:  # noqa: BLE001 - a crash is what the suite counts
                outcome["crashes"].append(f"{name}: {type(err).__name__}: {str(err)[:200]}")
            took = time.monotonic() - started
            if took > outcome["seconds"]:
                outcome["seconds"], outcome["slowest"] = took, name
            if took > bound + GRACE:
                outcome["hung"].append(f"{name}: {took:.1f} s")
    finally:
        database.close()
    outcome["memory_mb"] = (tracemalloc.get_traced_memory()[1] - before) / 1e6
    return outcome


def _left_reading(served: StandIn) -> list[str]:
    """Connections the stand-ins still hold open, and reader threads still alive, a
    grace after the commands returned (each connection is closed by gpuops's end)."""
    end = time.monotonic() + GRACE
    while time.monotonic() < end:
        threads = [t.name for t in threading.enumerate() if t.name.startswith(READER_THREADS) and t.is_alive()]
        if not served.open_connections() and not threads:
            break
        time.sleep(0.02)
    open_now = [f"connection to {c.path[:40]} open {time.monotonic() - c.opened:.1f} s" for c in served.open_connections()]
    threads = [t.name for t in threading.enumerate() if t.name.startswith(READER_THREADS) and t.is_alive()]
    return open_now + threads


def test_hostile_prometheus_and_exporters_never_hang_or_crash_a_command_or_the_handover(tmp_path):
    rng = random.Random(SEED)
    kinds: Counter[str] = Counter()
    hung, crashes, left = [], [], []
    most_memory = most_seconds = 0.0
    slowest = most_memory_case = ""
    started = time.monotonic()
    tracemalloc.start()
    try:
        with StandIn(["127.0.0.1"], silent()) as prometheus, StandIn(list(EXPORTER_IPS.values()), silent()) as pods:
            for index in range(CASES):
                source = "prometheus" if index % 2 == 0 else "exporters"
                # The first cases go through every misbehaviour once; then at random.
                forced = ["odd series", "trickle", "endless headers", "endless body", "over the cap", "silent",
                          "garbage", "claims a huge length"][index // 2 % 8] if index < 16 else "any"
                if source == "prometheus":
                    good = _vector_body(rng, odd=0)
                    if forced == "odd series" or (forced == "any" and rng.random() < 0.35):
                        kind, behaviour = "odd series", answer(_vector_body(rng, odd=rng.randrange(1, 40)))
                    elif forced == "any" and rng.random() < 0.15:
                        kind, behaviour = "odd JSON", answer(_odd_json(rng))
                    elif forced == "any" and rng.random() < 0.1:
                        name, slow = _hostile(rng, valid=vector([]), kind="any", text=False)
                        kind, behaviour = f"rates query: {name}", by_query(answer(good), slow)
                    else:
                        kind, behaviour = _hostile(rng, valid=good, kind=forced, text=False)
                    prometheus.behave["127.0.0.1"] = behaviour
                    served, port = prometheus, prometheus.port
                else:
                    bad = rng.sample(sorted(EXPORTER_IPS), rng.randrange(1, 4))
                    names = []
                    for node, ip in EXPORTER_IPS.items():
                        page = pages()[node].encode()
                        if node not in bad:
                            pods.behave[ip] = answer(page, kind="text/plain")
                        elif forced == "odd series" or (forced == "any" and rng.random() < 0.35):
                            pods.behave[ip] = answer(_page_body(rng, node), kind="text/plain")
                            names.append("odd series")
                        else:
                            name, pods.behave[ip] = _hostile(rng, valid=page, kind=forced, text=True)
                            names.append(name)
                    kind = " + ".join(sorted(names))
                    served, port = pods, pods.port
                kinds[f"{source}: {kind}"] += 1
                outcome = _run_case(source, port, tmp_path, index)
                hung += [f"case {index} ({source}: {kind}) {h}" for h in outcome["hung"]]
                crashes += [f"case {index} ({source}: {kind}) {c}" for c in outcome["crashes"]]
                left += [f"case {index} ({source}: {kind}) {x}" for x in _left_reading(served)]
                if outcome["memory_mb"] > most_memory:
                    most_memory, most_memory_case = outcome["memory_mb"], f"{source}: {kind}"
                if outcome["seconds"] > most_seconds:
                    most_seconds, slowest = outcome["seconds"], f"{outcome['slowest']} ({source}: {kind})"
    finally:
        tracemalloc.stop()
    record("hostile-sources", {
        "cases": CASES, "commands": CASES * 4, "hung": len(hung), "crashes": len(crashes),
        "left_reading": len(left), "max_memory_mb": round(most_memory, 1), "max_memory_case": most_memory_case,
        "slowest_command_seconds": round(most_seconds, 2), "slowest_command": slowest, "timeout_seconds": TIMEOUT,
        "exporters_deadline_seconds": DEADLINE, "cap_mb": CAP_MB, "kinds": dict(sorted(kinds.items())),
        "seconds": round(time.monotonic() - started, 1),
    })
    assert not crashes, crashes[:10]
    assert not hung, hung[:10]
    assert not left, left[:10]
