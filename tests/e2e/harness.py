"""What the end-to-end tests share: the demo people, configuration and fleet (built from
plain node and pod values by the real inventory logic; no Kubernetes here:
`services.fleet` is anything with `fleet(now)`), requests as the commands store them,
the bot under test, and sending what Slack sends (really signed HTTP requests). The
fixtures that run the bot over the fake Slack (the real Bolt app, the real slack_sdk
clients, a real Socket Mode WebSocket, a real SQLite database) are in tests/fixtures/bots.py.

People, as in deploy/config.example.yaml: alice (operator), bob and carol (approvers of
serving-a and inference-mig), dave (viewer), erin (admin); frank gets approver rights
only through the Slack user group S0SRE.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from slack_bolt import App

from bot.clicks import current_card
from bot.http_server import SlackHttpServer
from bot.identity import FRESH_AGE
from bot.render_blocks import render_blocks
from bot.slack_api import SlackApi
from bot.slack_app import SlackBot
from bot.wiring import Runtime
from testenv.fakeslack import FakeSlackWebApi, signing
from workflows.config import GpuopsConfig
from workflows.fleet.summary import Fleet, build_fleet
from workflows.kube.objects import (
    ClusterSnapshot,
    ContainerState,
    CustomObject,
    DeploymentObject,
    NodeName,
    NodeObject,
    OwnerRef,
    PodObject,
)
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.requests.views import RequestView

ROOT = Path(__file__).resolve().parents[2]
SECRET = "e2e-signing-secret-0123456789abcdef"
CHANNEL = "C0OPS"
OPERATOR_NS = "gpu-operator"
DRIVER = "580.95.05"
PEOPLE = {"U0ALICE": "alice", "U0BOB": "bob", "U0CAROL": "carol", "U0DAVE": "dave", "U0ERIN": "erin",
          "U0FRANK": "frank"}


def http_get(url: str) -> tuple[int, str, str]:
    """GET `url`: its status, content type and body, an HTTP error's too."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def demo_config(*, usergroups: dict[str, list[str]] | None = None, **changes: Any) -> GpuopsConfig:
    """The example configuration, S0SRE giving approver rights (and `usergroups` more)."""
    raw = yaml.safe_load((ROOT / "deploy" / "config.example.yaml").read_text())
    raw["access"]["usergroups"] = {"S0SRE": ["approver"], **(usergroups or {})}
    raw["access"]["names"]["U0FRANK"] = "frank"
    for key, value in changes.items():
        raw[key] = value
    return GpuopsConfig.model_validate(raw)


# ------------------------------------------------------------------ fleets from plain values


def _node(name: str, pool: str, *, advertised: int = 8) -> NodeObject:
    labels = {
        "gpuops.io/pool": pool, "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.replicas": "1",
        "nvidia.com/cuda.driver-version.full": DRIVER, "nvidia.com/mig.capable": "false",
        "nvidia.com/gpu.deploy.driver": "true", "nvidia.com/gpu.deploy.device-plugin": "true",
    }
    capacity = {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"}
    return NodeObject(name=NodeName(name), labels=labels, annotations={}, unschedulable=False, taints=(), ready=True,
                      ready_changed_at=None, capacity=capacity,
                      allocatable={**capacity, "nvidia.com/gpu": str(advertised)},
                      created_at=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc))


def _pod(node: str, app: str, image: str, *, component: str | None = None, ip: str | None = None) -> PodObject:
    labels = {"app": app} | ({"app.kubernetes.io/component": component} if component else {})
    return PodObject(namespace=OPERATOR_NS, name=f"{app}-{node}", node_name=NodeName(node), labels=labels,
                     annotations={}, phase="Running", ready=True, deleting=False,
                     owners=(OwnerRef(kind="DaemonSet", name=app, controller=True),),
                     containers=(ContainerState(name="main", image=image, ready=True, restart_count=0, running=True),),
                     init_containers=(), images=(image,), gpu_requests={},
                     created_at=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc), ip=ip)


def build_demo_fleet(*, nodes: int, unhealthy: int, config: GpuopsConfig) -> Fleet:
    """`nodes` GPU nodes over the three demo pools; the first `unhealthy` advertise half
    their GPUs (a warning finding each)."""
    snapshot = demo_snapshot(nodes=nodes, unhealthy=unhealthy)
    return build_fleet(snapshot, settings=config.inventory_settings(), now=dt.datetime.now(dt.timezone.utc))


def demo_snapshot(*, nodes: int, unhealthy: int, exporter_ips: dict[str, str] | None = None) -> ClusterSnapshot:
    """What `build_demo_fleet` builds its fleet from; `exporter_ips` (node -> pod IP) adds
    a dcgm-exporter pod on those nodes."""
    pools = ("serving-a", "training-a", "inference-mig")
    node_objects, pods = [], []
    for i in range(nodes):
        pool = pools[i % len(pools)]
        name = f"{pool}-{i:03d}"
        node_objects.append(_node(name, pool, advertised=4 if i < unhealthy else 8))
        pods += [_pod(name, "nvidia-driver-daemonset", f"nvcr.io/nvidia/driver:{DRIVER}-ubuntu22.04",
                      component="nvidia-driver"),
                 _pod(name, "nvidia-device-plugin-daemonset", "nvcr.io/nvidia/k8s-device-plugin:v0.17.2"),
                 _pod(name, "nvidia-operator-validator", "nvcr.io/nvidia/gpu-operator:v26.7.0")]
        if name in (exporter_ips or {}):
            pods.append(_pod(name, "nvidia-dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04",
                             ip=(exporter_ips or {})[name]))
    policy = CustomObject(kind="ClusterPolicy", name="cluster-policy", labels={}, annotations={},
                          spec={"driver": {"enabled": True}, "mig": {"strategy": "single"}},
                          status={"state": "ready"}, created_at=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc))
    snapshot = ClusterSnapshot(
        nodes={n.name: n for n in node_objects}, pods=tuple(pods), operator_namespace=OPERATOR_NS,
        operator_deployment=DeploymentObject(namespace=OPERATOR_NS, name="gpu-operator", labels={"app": "gpu-operator"},
                                             images=("nvcr.io/nvidia/gpu-operator:v26.7.0",), replicas=1,
                                             ready_replicas=1),
        operator_crds_installed=True, cluster_policies=(policy,), nvidia_drivers=(),
        taken_at=dt.datetime.now(dt.timezone.utc))
    return snapshot


class StaticFleet:
    """A fleet source that answers with one Fleet; `hold()` makes the next reads wait
    (to show the ack does not wait for the work)."""

    def __init__(self, fleet: Fleet) -> None:
        self.value = fleet
        self.released = threading.Event()
        self.released.set()
        self.reading = threading.Event()

    def fleet(self, now: dt.datetime) -> Fleet:
        self.reading.set()
        assert self.released.wait(10), "the test never released the fleet"
        return self.value

    def hold(self) -> None:
        self.released.clear()
        self.reading.clear()


# ------------------------------------------------------------------ requests


def a_plan(pool: str = "serving-a", *, created_for: str = "U0ALICE") -> Plan:
    nodes = (f"{pool}-000", f"{pool}-003")
    waves = tuple(Wave(i, (NodeName(n),), tuple(NodeStep(k, NodeName(n), p) for k, p in (  # type: ignore[arg-type]
        ("cordon", {}), ("drain", {"timeout_s": 600}), ("driver", {"version": "580.105.08"}), ("uncordon", {}))))
        for i, n in enumerate(nodes))
    return Plan(kind="upgrade", pool=pool, waves=waves, created_for=created_for,
                summary=PlanSummary(target_driver_version="580.105.08", evictions_expected=3, max_gpus_unavailable=8))


def submit_upgrade(runtime: Runtime, *, by: str = "U0ALICE", pool: str = "serving-a",
                   now: dt.datetime | None = None) -> RequestView:
    """A driver upgrade request as /gpu upgrade would store it (serving pools need two approvals)."""
    services = runtime.services()
    return services.requests.submit(
        runtime.config.actor(by), kind="upgrade", pool=pool, targets=[f"{pool}-000", f"{pool}-003"],
        plan=a_plan(pool, created_for=by), window_start=None, window_end=None,
        reason="580.105.08 fixes Xid 79 on H100", channel=CHANNEL, now=now or dt.datetime.now(dt.timezone.utc))


# ------------------------------------------------------------------ Slack, faked


class DirectoryClock:
    """The user directory's clock: monotonic time, moved on by `skip` (a test that
    changes a user group lets a fresh read's allowance pass rather than sleep)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def skip(self, seconds: float) -> None:
        self.offset += seconds


@dataclass
class BotUnderTest:
    app: App
    bot: SlackBot
    slack: FakeSlackWebApi
    runtime: Runtime
    url: str | None = None
    server: SlackHttpServer | None = None
    clock: DirectoryClock | None = None

    def set_usergroup(self, group: str, members: list[str]) -> None:
        """Change a Slack user group's members, then let the few seconds pass in which
        an action that changes something may still take the members read before."""
        self.slack.workspace.set_usergroup(group, members)
        assert self.clock is not None, "a bot built without the directory's clock"
        self.clock.skip(FRESH_AGE + 1)

    @property
    def deliveries(self):
        return self.bot.deliveries

    def post_card(self, view: RequestView) -> str:
        """Post the request's message (what `/gpu request <id>` shows, with its buttons); its ts."""
        card = current_card(view.id, self.runtime.services(), actor=self.runtime.config.actor(view.requester),
                            now=now())
        assert card.intents, card
        ts = SlackApi(self.app.client).post(CHANNEL, render_blocks(card).as_message())
        assert ts is not None
        return ts


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# ------------------------------------------------------------------ sending what Slack sends


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: str
    seconds: float

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def send(url: str, body: bytes, *, content_type: str = signing.FORM, timestamp: int | None = None,
         secret: str = SECRET, headers: dict[str, str] | None = None, sign_body: bytes | None = None,
         timeout: float = 10) -> HttpAnswer:
    """POST `body` as Slack would: signed with `secret` at `timestamp` (now by default);
    `sign_body` signs other bytes than those sent (a tampered body). `timeout` only bounds
    the wait for the answer."""
    stamp = int(time.time()) if timestamp is None else timestamp
    signed = signing.sign(sign_body if sign_body is not None else body, secret=secret, timestamp=stamp)
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={**signed, "Content-Type": content_type, **(headers or {})})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return HttpAnswer(answer.status, answer.read().decode(), time.perf_counter() - started)
    except urllib.error.HTTPError as err:
        return HttpAnswer(err.code, err.read().decode(), time.perf_counter() - started)


def answer_of(slack: FakeSlackWebApi, key: str) -> str:
    """What the first post to response_url `key` says (its text and its blocks' text)."""
    post = slack.wait_for_response(key, timeout=30)
    return f"{post.body.get('text', '')}\n{text_of(post.body.get('blocks'))}" if post.body else ""


def text_of(blocks: list[dict[str, Any]] | None) -> str:
    """Everything a person reads in blocks (headers, sections, fields, context, buttons)."""
    parts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("type") in ("plain_text", "mrkdwn") and "text" in value:
                parts.append(value["text"])
            for key, item in value.items():
                if key != "confirm":
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(blocks or [])
    return "\n".join(parts)


def buttons_of(blocks: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Button label -> the button element."""
    return {e["text"]["text"]: e for b in blocks or [] if b.get("type") == "actions" for e in b["elements"]}
