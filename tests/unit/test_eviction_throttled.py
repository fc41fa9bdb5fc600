"""A 429 on an eviction is a PodDisruptionBudget only when the server says so: the API
server asking to slow down (API Priority and Fairness, an admission webhook) is retried
after its Retry-After, told to nobody as a budget, and never escalated to a delete.

Found by tests/reliability/controlplane/test_api_faults.py: a 429 from the API on an eviction was
told in the request's thread as "blocked by a PodDisruptionBudget", and at the timeout
of a pool with `pdb_timeout_action: delete` the pod would have been deleted."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from workflows.engine.steps.contract import Waiting
from workflows.engine.steps.eviction import Evict
from workflows.kube.errors import TooManyRequests, error_for_status
from workflows.kube.objects import PodOnNode

NOW = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.timezone.utc)
PDB_ANSWER = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "code": 429,
              "message": "Cannot evict pod as it would violate the pod's disruption budget.",
              "details": {"causes": [{"type": "DisruptionBudget",
                                      "message": "The disruption budget trainer needs 1 healthy pods and has 1 currently"}]}}
APF_ANSWER = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "code": 429,
              "message": "Too many requests, please try again later.", "details": {"retryAfterSeconds": 3}}
WEBHOOK_ANSWER = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "code": 429,
                  "message": 'admission webhook "limits.example.com" denied the request: slow down'}
PATH = "/api/v1/namespaces/ml/pods/trainer-0/eviction"


def _answer(body: dict[str, Any], **headers: str) -> TooManyRequests:
    error = error_for_status(429, json.dumps(body).encode(), method="POST", path=PATH, headers=headers)
    assert isinstance(error, TooManyRequests)
    return error


def test_only_an_answer_naming_a_disruption_budget_is_read_as_one():
    assert _answer(PDB_ANSWER).disruption_budget is True
    throttled = _answer(APF_ANSWER, **{"Retry-After": "3"})
    assert throttled.disruption_budget is False and throttled.retry_after == 3.0
    assert _answer(WEBHOOK_ANSWER).disruption_budget is False


class _Gateway:
    """One pod on the node, whose eviction the API answers with `refusal`."""

    def __init__(self, make, refusal: TooManyRequests) -> None:
        self.pod = PodOnNode(pod=make.pod(node="gpu-01", namespace="ml", owner_kind="ReplicaSet",
                                          gpu_requests={"nvidia.com/gpu": 1}), uid="uid-1", visible_devices=None)
        self.refusal = refusal
        self.evictions = 0
        self.deletes = 0

    def list_pods_on_node(self, node: str, *, label_selector: str | None = None) -> list[PodOnNode]:
        return [self.pod]

    def evict_pod(self, namespace: str, name: str, *, uid: str, dry_run: bool) -> None:
        self.evictions += 1
        raise self.refusal

    def delete_pod(self, *args: Any, **kwargs: Any) -> None:
        self.deletes += 1


@dataclass
class _Ctx:
    gateway: Any
    kind: str = "evict"
    params: dict[str, Any] = field(default_factory=dict)
    expired: bool = False
    intent: dict[str, Any] = field(default_factory=dict)
    node: str = "gpu-01"
    dry_run: bool = False
    now: dt.datetime = NOW
    zone: dt.tzinfo = dt.timezone.utc
    timeout: dt.timedelta = dt.timedelta(seconds=600)
    deadline: dt.datetime = NOW + dt.timedelta(seconds=600)
    keys: set[str] = field(default_factory=set)

    def recorded(self, key: str) -> bool:
        return key in self.keys

    def record(self, *, key: str, action: str, target: str, detail: Any) -> None:
        self.keys.add(key)

    def act(self) -> None:
        pass


def _intent(on_timeout: str) -> dict[str, Any]:
    return {"scope": "all", "on_timeout": on_timeout, "skipped": [], "terminating": [],
            "evict": [{"pod": "ml/trainer-0", "uid": "uid-1", "why": "uses 1 GPU"}]}


def test_an_eviction_the_api_server_throttles_waits_for_its_retry_after_and_tells_nobody_of_a_budget(make):
    gateway = _Gateway(make, _answer(APF_ANSWER, **{"Retry-After": "3"}))
    outcome = Evict().advance(_Ctx(gateway, intent=_intent("delete")))  # type: ignore[arg-type]
    assert isinstance(outcome, Waiting) and outcome.notice is None and outcome.retry_in == 3.0
    assert "not a PodDisruptionBudget" in outcome.reason and "Too many requests" in outcome.reason


def test_a_throttled_eviction_is_never_escalated_to_a_delete_at_the_timeout(make):
    gateway = _Gateway(make, _answer(WEBHOOK_ANSWER))
    outcome = Evict().advance(_Ctx(gateway, expired=True, intent=_intent("delete")))  # type: ignore[arg-type]
    # Still waiting: the engine fails a waiting step at its timeout, with this reason.
    assert isinstance(outcome, Waiting) and gateway.deletes == 0


def test_a_budget_still_blocks_tells_the_thread_and_escalates_as_the_pool_says(make):
    gateway = _Gateway(make, _answer(PDB_ANSWER))
    waiting = Evict().advance(_Ctx(gateway, intent=_intent("delete")))  # type: ignore[arg-type]
    assert isinstance(waiting, Waiting) and waiting.notice is not None
    assert "blocked by a PodDisruptionBudget" in waiting.reason
    Evict().advance(_Ctx(gateway, expired=True, intent=_intent("delete")))  # type: ignore[arg-type]
    assert gateway.deletes == 1
