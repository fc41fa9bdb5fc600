"""The API-faults suite's admission webhook (testenv.admission), decided on plain
AdmissionReview requests: what it records of each write, and its seeded refusals."""

from __future__ import annotations

import json

from testenv.admission import RefusingWebhook, describe, node_change

MARK = "gpuops.io/cordoned-by"


def _node(*, unschedulable: bool = False, mark: str | None = None, labels: dict[str, str] | None = None):
    return {"metadata": {"name": "n1", "labels": labels or {}, "annotations": {MARK: mark} if mark else {}},
            "spec": {"unschedulable": unschedulable}}


def _request(uid: str = "u1", *, user: str = "bot", dry_run: bool = False) -> dict:
    return {"uid": uid, "operation": "UPDATE", "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "name": "n1", "userInfo": {"username": user}, "dryRun": dry_run,
            "oldObject": _node(), "object": _node(unschedulable=True, mark="{}")}


def test_a_node_patch_is_named_by_what_it_changed():
    assert node_change(_node(), _node(unschedulable=True, mark="{}")) == "cordon"
    assert node_change(_node(unschedulable=True, mark="{}"), _node()) == "uncordon"
    assert node_change(_node(unschedulable=True), _node(unschedulable=True, mark="{}")) == "mark"
    assert node_change(_node(unschedulable=True, mark="{}"), _node(unschedulable=True)) == "unmark"
    assert node_change(_node(), _node(labels={"a": "b"})) == "labels"
    assert node_change(_node(), _node()) == "none"


def test_an_eviction_is_recorded_with_the_uid_it_was_sent_for():
    seen = describe({"uid": "x", "operation": "CREATE", "resource": {"resource": "pods"}, "subResource": "eviction",
                     "namespace": "jobs", "name": "trainer-1", "userInfo": {"username": "bot"},
                     "object": {"kind": "Eviction", "deleteOptions": {"preconditions": {"uid": "pod-uid"}}}})
    assert (seen.resource, seen.target, seen.change) == ("pods/eviction", "jobs/trainer-1", "pod-uid")


def test_a_driver_object_patch_is_recorded_with_the_versions():
    seen = describe({"uid": "x", "operation": "UPDATE", "resource": {"resource": "nvidiadrivers"}, "name": "d",
                     "userInfo": {"username": "bot"}, "oldObject": {"kind": "NVIDIADriver", "spec": {"version": "1"}},
                     "object": {"kind": "NVIDIADriver", "spec": {"version": "2"}}})
    assert seen.change == "version 1 -> 2"


def test_the_same_seed_refuses_the_same_requests_with_the_same_codes_and_dry_runs_pass():
    def answers(seed: int) -> list[tuple[bool, int | None]]:
        webhook = RefusingWebhook(name="t", user="bot", seed=seed, share=0.5)
        out = []
        for i in range(40):
            answer = webhook.review(_request(f"u{i}"))
            out.append((answer["allowed"], (answer.get("status") or {}).get("code")))
        assert all(webhook.review(_request("dry", dry_run=True))["allowed"] for _ in range(10))
        assert len(webhook.allowed) + len(webhook.refusals) == 50
        return out

    first = answers(7)
    assert first == answers(7)
    refused = [code for allowed, code in first if not allowed]
    assert refused and set(refused) <= {429, 500, 409}
    assert any(allowed for allowed, _ in first)


def test_a_refusal_carries_its_code_and_says_it_is_the_test():
    webhook = RefusingWebhook(name="t", user="bot", seed=1, share=1.0, codes=(409,))
    answer = webhook.review(_request())
    assert answer["allowed"] is False and answer["status"]["code"] == 409
    assert "fault test" in answer["status"]["message"]
    assert json.dumps(answer)  # what the server sends back is plain JSON
    assert webhook.writes() == [] and webhook.refusals[0].refused == 409


def test_the_servers_second_look_at_one_pod_delete_is_told_apart_from_a_second_delete():
    def delete(old_meta: dict) -> dict:
        return {"uid": "x", "operation": "DELETE", "resource": {"resource": "pods"}, "namespace": "gpuops",
                "name": "check", "userInfo": {"username": "bot"}, "oldObject": {"metadata": old_meta}}

    first = describe(delete({"uid": "p1"}))
    again = describe(delete({"uid": "p1", "deletionTimestamp": "2026-12-04T00:00:00Z",
                             "deletionGracePeriodSeconds": 0}))
    assert (first.change, first.second_pass) == ("p1", False)
    assert (again.change, again.second_pass) == ("p1", True)


def test_one_change_admitted_twice_against_the_same_version_is_one_write_and_a_later_one_is_two():
    webhook = RefusingWebhook(name="t", user="bot", seed=1, share=0.0)

    def unmark(version: str) -> dict:
        request = _request(f"u{version}")
        request["oldObject"] = {"metadata": {"name": "n1", "resourceVersion": version,
                                             "annotations": {MARK: "{}"}}, "spec": {"unschedulable": True}}
        request["object"] = _node(unschedulable=True)
        return request

    for version in ("7", "7", "9"):  # the server cancelled the first (504); the client sent it again
        webhook.review(unmark(version))
    assert [w.old_version for w in webhook.writes()] == ["7", "9"]
