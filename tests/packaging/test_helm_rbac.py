"""The Helm chart grants the bot exactly what deploy/rbac.yaml grants (and, with
`rbac.allowPodDelete`, deploy/rbac-pod-delete.yaml): those files are what
tests/integration/test_rbac.py proves against the real API server's authorizer, so the
chart's RBAC is compared with them object by object (kind, name, namespace, rules,
roleRef, subjects; the labels the chart adds aside), rules and lists in any order.

Rendered with `helm template` by a real helm (built by testenv, like the control plane)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from testenv.helm import run_helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuops"
RBAC = [d for d in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()) if d]
POD_DELETE = [d for d in yaml.safe_load_all((ROOT / "deploy" / "rbac-pod-delete.yaml").read_text()) if d]
TOKENS = ["--set", "slack.botToken=xoxb-1", "--set", "slack.appToken=xapp-1"]
KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def render(home: Path, *values: str, namespace: str = "gpuops") -> list[dict]:
    done = run_helm("template", "gpuops", str(CHART), "--namespace", namespace, *TOKENS, *values, home=home)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def grants(objects: list[dict]) -> dict[tuple[str, str, str | None], dict]:
    """The identity and RBAC objects by kind, name and namespace, each as what it grants
    or binds, in an order that does not change what it means."""
    found: dict[tuple[str, str, str | None], dict] = {}
    for obj in objects:
        if obj["kind"] not in KINDS:
            continue
        key = (obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
        assert key not in found, f"{key} is rendered twice"
        rules = sorted(tuple((field, tuple(sorted(rule.get(field) or []))) for field in
                             ("apiGroups", "resources", "resourceNames", "verbs", "nonResourceURLs"))
                       for rule in obj.get("rules") or [])
        subjects = sorted(tuple(sorted(s.items())) for s in obj.get("subjects") or [])
        found[key] = {"rules": rules, "roleRef": obj.get("roleRef"), "subjects": subjects}
    return found


def moved(docs: list[dict], *, namespace: str, operator_namespace: str, account: str) -> list[dict]:
    """deploy/rbac.yaml as it reads for another release namespace, operator namespace and
    ServiceAccount name (the file says gpuops, gpu-operator and gpuops)."""
    docs = copy.deepcopy(docs)
    where = {"gpuops": namespace, "gpu-operator": operator_namespace}
    for doc in docs:
        meta = doc["metadata"]
        if "namespace" in meta:
            meta["namespace"] = where[meta["namespace"]]
        if doc["kind"] == "ServiceAccount":
            meta["name"] = account
        for subject in doc.get("subjects", []):
            subject.update(name=account, namespace=namespace)
    return docs


def test_the_chart_renders_the_rbac_the_integration_suite_proves(tmp_path):
    assert grants(render(tmp_path)) == grants(RBAC)


def test_allow_pod_delete_adds_the_opt_in_grant_and_nothing_else(tmp_path):
    assert grants(render(tmp_path, "--set", "rbac.allowPodDelete=true")) == grants(RBAC + POD_DELETE)


def test_the_namespaces_and_the_account_name_are_the_only_things_values_change(tmp_path):
    rendered = render(tmp_path, "--set", "operatorNamespace=nvidia-gpu-operator", "--set", "serviceAccount.name=gpu-bot",
                      "--set", "rbac.allowPodDelete=true", namespace="platform-bots")
    expected = moved(RBAC + POD_DELETE, namespace="platform-bots", operator_namespace="nvidia-gpu-operator",
                     account="gpu-bot")
    assert grants(rendered) == grants(expected)
    (deployment,) = [o for o in rendered if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-bot"


def test_without_rbac_create_the_chart_makes_the_service_account_only(tmp_path):
    assert list(grants(render(tmp_path, "--set", "rbac.create=false"))) == [("ServiceAccount", "gpuops", "gpuops")]
