"""The Helm chart (deploy/helm/gpuops), with a real helm (v4, built by testenv from the Go
module proxy): it lints, renders what a platform team expects (Recreate, probes, tokens
as files, a locked-down pod), renders exactly the RBAC the integration suite proves
(deploy/rbac.yaml), refuses values it cannot honour, and installs into the test API
server, every object accepted, the pod running as the ServiceAccount the RBAC tests act as."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes.client.rest import ApiException

from testenv.controlplane import BOT_USER
from testenv.helm import helm_binary
from testenv.install import wait_until
from tests.integration.desk import RBAC, grant_bot_rbac

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuops"
FULL = CHART / "ci" / "values-full.yaml"
POD_DELETE = ROOT / "deploy" / "rbac-pod-delete.yaml"
TOKENS = ["--set", "slack.botToken=xoxb-marker-bot-token", "--set", "slack.appToken=xapp-marker-app-token"]
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def helm(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=300)


def render(home: Path, *args: str) -> list[dict]:
    done = helm("template", "gpuops", str(CHART), "--namespace", "gpuops", *args, home=home)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def _env(container: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _rbac(objects: list[dict]) -> dict[tuple[str, str, str | None], dict]:
    """RBAC objects by kind, name and namespace, without the labels the chart adds."""
    return {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")):
            {k: o.get(k) for k in ("rules", "roleRef", "subjects")} for o in objects if o["kind"] in RBAC_KINDS}


def test_the_chart_lints_with_default_and_full_values(tmp_path):
    assert helm("lint", str(CHART), *TOKENS, home=tmp_path).returncode == 0
    full = helm("lint", str(CHART), "-f", str(FULL), home=tmp_path)
    assert full.returncode == 0, full.stdout + full.stderr


def test_the_default_render_is_one_locked_down_replica_with_its_tokens_as_files(tmp_path):
    objects = render(tmp_path, *TOKENS)
    deployment = one(objects, "Deployment")
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    (bot,) = pod["containers"]
    (check,) = pod["initContainers"]

    assert (spec["replicas"], spec["strategy"]) == (1, {"type": "Recreate"})
    assert pod["serviceAccountName"] == "gpuops"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in (bot, check):
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}
    assert check["args"] == ["config", "check", "/etc/gpuops/config.yaml"]
    assert bot["args"] == ["run", "--database=/var/lib/gpuops/gpuops.db", "--health-port=8080"]
    assert bot["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert bot["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    env = _env(bot)
    assert env["SLACK_BOT_TOKEN_FILE"] == "/var/run/secrets/gpuops/bot-token"
    assert env["SLACK_APP_TOKEN_FILE"] == "/var/run/secrets/gpuops/app-token"
    assert env["GPUOPS_LOG_FORMAT"] == "json" and "SLACK_SIGNING_SECRET_FILE" not in env
    assert "marker" not in yaml.safe_dump(deployment)  # no token in the pod spec
    assert one(objects, "Secret")["stringData"] == {"bot-token": "xoxb-marker-bot-token",
                                                    "app-token": "xapp-marker-app-token"}
    assert one(objects, "PersistentVolumeClaim")["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert [p["name"] for p in one(objects, "Service")["spec"]["ports"]] == ["health"]
    policy = one(objects, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and [r["ports"] for r in policy["ingress"]] == [
        [{"protocol": "TCP", "port": 8080}]]
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]


def test_every_option_renders(tmp_path):
    objects = render(tmp_path, "-f", str(FULL))
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (bot,) = pod["containers"]

    assert bot["image"] == "registry.example/gpuops:9.9.9" and bot["imagePullPolicy"] == "Always"
    assert bot["args"][-3:] == ["--health-port=9090", "--http", "--port=3000"]
    assert _env(bot)["SLACK_SIGNING_SECRET_FILE"] == "/var/run/secrets/gpuops/signing-secret"
    assert "SLACK_APP_TOKEN_FILE" not in _env(bot)
    (data,) = [v for v in pod["volumes"] if v["name"] == "data"]
    assert data["persistentVolumeClaim"]["claimName"] == "gpuops-data"
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]  # an existing claim
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"] == [{"port": "health", "path": "/metrics", "interval": "15s"}]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert ("ClusterRole", "gpuops-pod-deleter", None) in _rbac(objects)
    policy = one(objects, "NetworkPolicy")["spec"]
    assert policy["ingress"][0]["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    assert {"protocol": "TCP", "port": 3000} in policy["ingress"][1]["ports"]
    assert policy["egress"][-1]["ports"] == [{"protocol": "TCP", "port": 8443}]
    assert pod["tolerations"][0]["key"] == "node-role.kubernetes.io/control-plane"


def test_the_chart_renders_the_rbac_the_integration_suite_proves(tmp_path):
    source = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    opt_in = [d for d in yaml.safe_load_all(POD_DELETE.read_text()) if d]

    assert _rbac(render(tmp_path, *TOKENS)) == _rbac(source)
    assert _rbac(render(tmp_path, *TOKENS, "--set", "rbac.allowPodDelete=true")) == _rbac(source + opt_in)


@pytest.mark.parametrize(("values", "says"), [
    ([*TOKENS, "--set", "slack.mode=carrier-pigeon"], 'slack.mode is "carrier-pigeon": it is socket or http'),
    ([*TOKENS, "--set", "replicaCount=2"], "replicaCount must be 1: the SQLite database has one writer"),
    (["--set", "slack.botToken=xoxb-1"], "Socket Mode needs slack.appToken (or slack.existingSecret)"),
    (["--set", "slack.botToken=xoxb-1", "--set", "slack.mode=http"], "HTTP mode needs slack.signingSecret"),
    ([], "slack.botToken (or slack.existingSecret) is required"),
])
def test_values_the_bot_cannot_run_with_are_refused_at_render(tmp_path, values, says):
    done = helm("template", "gpuops", str(CHART), "--namespace", "gpuops", *values, home=tmp_path)
    assert done.returncode != 0 and says in done.stderr, done.stderr


@pytest.mark.controlplane
def test_an_install_is_accepted_by_the_api_server_and_runs_as_the_bots_service_account(cluster, tmp_path):
    installer = cluster.installer()
    operator_namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-operator"}}
    had_operator_namespace = _exists(installer, operator_namespace)
    for namespace in ("gpuops", "gpu-operator"):
        installer.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, exist_ok=True)
    # What other tests granted with kubectl-style creates: helm adopts only its own objects.
    bot_rbac = [d for d in yaml.safe_load_all(RBAC.read_text()) if d] + [
        d for d in yaml.safe_load_all(POD_DELETE.read_text()) if d]
    for doc in bot_rbac:
        installer.delete(doc)
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig), "--kube-context", "admin"]
    rendered = render(tmp_path, *TOKENS)
    try:
        done = helm("install", "gpuops", str(CHART), "--namespace", "gpuops", *TOKENS, *kubeconfig, home=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        # `helm test`'s pod is made by `helm test`, not by the install.
        for obj in [o for o in rendered if "helm.sh/hook" not in o["metadata"].get("annotations", {})]:
            assert _exists(installer, obj), f"{obj['kind']} {obj['metadata']['name']} was not created"
        deployment = installer.get(one(rendered, "Deployment"))
        account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        assert f"system:serviceaccount:gpuops:{account}" == BOT_USER  # the identity the RBAC tests act as
        listed = helm("list", "--namespace", "gpuops", "-q", *kubeconfig, home=tmp_path)
        assert listed.stdout.split() == ["gpuops"]
    finally:
        helm("uninstall", "gpuops", "--namespace", "gpuops", *kubeconfig, home=tmp_path)
        installer.delete(one(rendered, "PersistentVolumeClaim"))  # kept by helm on purpose
        wait_until(lambda: not _exists(installer, one(rendered, "Deployment")), timeout=60,
                   what="the chart's objects to go")
        grant_bot_rbac(installer)  # as the other tests found it
        if not had_operator_namespace:
            installer.delete(operator_namespace)
            wait_until(lambda: not _exists(installer, operator_namespace), timeout=60,
                       what="the operator's namespace made for this test to go")


def _exists(installer, obj: dict) -> bool:
    try:
        installer.get(obj)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True
