"""The Helm chart (deploy/helm/gpuops), with a real helm (v4, built by testenv from the Go
module proxy): it lints; it renders what a platform team expects (one replica with
Recreate, probes on the health port, tokens as files from a Secret, a locked-down pod, a
NetworkPolicy) with its defaults and with every option set; the configuration it renders
passes the bot's own check; it refuses values the bot cannot run with; and it installs
into the test API server, every object accepted, the pod running as the ServiceAccount
the RBAC tests act as, which the authorizer then answers for exactly as for
deploy/rbac.yaml (tests/packaging/test_helm_rbac.py compares the objects themselves)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from kubernetes.client.rest import ApiException

from testenv.controlplane import BOT_GROUPS, BOT_USER
from testenv.helm import HELM_VERSION, run_helm
from testenv.install import wait_until
from tests.integration.desk import RBAC
from tests.integration.test_rbac import GRANTS


ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuops"
FULL = CHART / "ci" / "values-full.yaml"
POSTGRES = CHART / "ci" / "values-postgres.yaml"
POD_DELETE = ROOT / "deploy" / "rbac-pod-delete.yaml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
TOKENS = ["--set", "slack.botToken=xoxb-marker-bot-token", "--set", "slack.appToken=xapp-marker-app-token"]
SECRETS = "/var/run/secrets/gpuops"
LOCKED_DOWN = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
# What the test API server cannot take: it has no Prometheus Operator CRDs.
# What an install on the test cluster cannot take: the Prometheus Operator's kinds, and a
# dashboard for a `monitoring` namespace that is not there.
NO_SERVICE_MONITOR = ["--set", "metrics.serviceMonitor.enabled=false", "--set", "metrics.prometheusRule.enabled=false",
                      "--set", "metrics.dashboard.enabled=false"]


def render(home: Path, *values: str, namespace: str = "gpuops") -> list[dict]:
    done = run_helm("template", "gpuops", str(CHART), "--namespace", namespace, *values, home=home)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def is_hook(obj: dict) -> bool:
    return "helm.sh/hook" in (obj["metadata"].get("annotations") or {})


def env_of(container: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def mounts_of(container: dict) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}


def volumes_of(pod: dict) -> dict[str, dict]:
    return {v["name"]: {k: v for k, v in v.items() if k != "name"} for v in pod["volumes"]}


def test_the_cached_helm_is_the_pinned_release(tmp_path):
    done = run_helm("version", "--template", "{{ .Version }}", home=tmp_path)
    assert (done.returncode, done.stdout) == (0, HELM_VERSION), done.stderr


def test_the_chart_lints_strictly_with_default_and_full_values(tmp_path):
    for values in (TOKENS, ["-f", str(FULL)]):
        done = run_helm("lint", "--strict", str(CHART), "--namespace", "gpuops", *values, home=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_full_values_set_every_key_the_chart_has():
    def keys(values: dict, prefix: str = "") -> set[str]:
        found = set()
        for key, value in values.items():
            found.add(prefix + key)
            if isinstance(value, dict) and value:
                found |= keys(value, f"{prefix}{key}.")
        return found

    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert keys(defaults) - keys(yaml.safe_load(FULL.read_text())) == set()


def test_the_default_render_is_one_locked_down_replica_with_its_tokens_as_files(tmp_path):
    objects = render(tmp_path, *TOKENS)
    deployment = one(objects, "Deployment")
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    (bot,) = pod["containers"]
    (check,) = pod["initContainers"]
    volumes = volumes_of(pod)
    secret = one(objects, "Secret")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())

    assert chart["apiVersion"] == "v2" and chart["appVersion"] == VERSION
    assert (spec["replicas"], spec["strategy"]) == (1, {"type": "Recreate"})
    assert pod["serviceAccountName"] == "gpuops"
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                      "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
    for container in (bot, check):
        assert container["image"] == f"ghcr.io/example/gpuops:{VERSION}"
        assert container["securityContext"] == LOCKED_DOWN
        assert volumes[mounts_of(container)["/tmp"]] == {"emptyDir": {}}  # the root filesystem is read-only
        assert volumes[mounts_of(container)["/etc/gpuops"]] == {"configMap": {"name": "gpuops-config"}}
        assert container["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                          "limits": {"memory": "1Gi"}}
    # A configuration the bot would refuse stops the pod before the bot starts.
    assert check["args"] == ["config", "check", "/etc/gpuops/config.yaml"]
    assert bot["args"] == ["run", "--database=/var/lib/gpuops/gpuops.db", "--health-port=8080", "--metrics-port=8081"]
    assert bot["ports"] == [{"name": "health", "containerPort": 8080, "protocol": "TCP"},
                            {"name": "metrics", "containerPort": 8081, "protocol": "TCP"}]
    assert bot["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert bot["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert volumes[mounts_of(bot)["/var/lib/gpuops"]] == {"persistentVolumeClaim": {"claimName": "gpuops-data"}}
    assert "clusters" not in volumes  # one cluster: no other kubeconfigs

    env = env_of(bot)
    assert env == {
        "GPUOPS_CONFIG": "/etc/gpuops/config.yaml",
        "GPUOPS_LOG_FORMAT": "json",
        "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "SLACK_BOT_TOKEN_FILE": f"{SECRETS}/bot-token",
        "SLACK_APP_TOKEN_FILE": f"{SECRETS}/app-token",
    }
    # Each file the bot reads is a key of the Secret mounted there, and no token is
    # anywhere in the pod's spec (only the Secret's hash, to roll the pod when it changes).
    assert volumes[mounts_of(bot)[SECRETS]] == {"secret": {"secretName": secret["metadata"]["name"],
                                                           "defaultMode": 0o400}}
    assert secret["stringData"] == {"bot-token": "xoxb-marker-bot-token", "app-token": "xapp-marker-app-token"}
    assert "marker" not in yaml.safe_dump(deployment)
    assert len(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/slack"]) == 64

    pvc = one(objects, "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == "gpuops-data" and pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # the audit chain outlives the chart
    assert "storageClassName" not in pvc["spec"]  # the cluster's default class
    # The health port is the kubelet's alone: in no Service, opened by no NetworkPolicy rule.
    assert one(objects, "Service")["spec"]["ports"] == [
        {"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}]
    policy = one(objects, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8081}]}]
    assert policy["egress"] == [
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]},
    ]
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]

    # `helm test`: the same check on the installed configuration, the same locked-down pod.
    (test_pod,) = [o for o in objects if is_hook(o)]
    assert test_pod["kind"] == "Pod" and test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (tester,) = test_pod["spec"]["containers"]
    assert (tester["image"], tester["args"]) == (bot["image"], check["args"])
    assert tester["securityContext"] == LOCKED_DOWN and test_pod["spec"]["securityContext"] == pod["securityContext"]


def test_every_option_renders(tmp_path):
    objects = render(tmp_path, "-f", str(FULL))
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (bot,) = pod["containers"]
    volumes = volumes_of(pod)

    assert bot["image"] == "registry.example/gpuops:9.9.9" and bot["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "registry-pull"}]
    assert [o for o in objects if is_hook(o)][0]["spec"]["imagePullSecrets"] == [{"name": "registry-pull"}]
    assert bot["args"] == ["run", "--database=/var/lib/gpuops/gpuops.db", "--health-port=9090", "--metrics-port=9091",
                           "--http", "--port=3000"]
    assert [(p["name"], p["containerPort"]) for p in bot["ports"]] == [("health", 9090), ("metrics", 9091),
                                                                       ("http", 3000)]
    env = env_of(bot)
    assert (env["SLACK_BOT_TOKEN_FILE"], env["SLACK_SIGNING_SECRET_FILE"]) == (f"{SECRETS}/bot", f"{SECRETS}/signing")
    assert "SLACK_APP_TOKEN_FILE" not in env
    assert one(objects, "Secret")["stringData"] == {"bot": "xoxb-marker-bot-token", "signing": "marker-signing-secret"}
    assert "marker" not in yaml.safe_dump(deployment)

    assert volumes["data"] == {"persistentVolumeClaim": {"claimName": "gpuops-data"}}
    # The other clusters' kubeconfigs, read only, where `clusters.<name>.kubeconfig` names them.
    assert volumes["clusters"] == {"secret": {"secretName": "gpuops-cluster-kubeconfigs", "defaultMode": 0o400}}
    assert {"name": "clusters", "mountPath": "/etc/gpuops/clusters", "readOnly": True} in bot["volumeMounts"]
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]  # an existing claim
    service = one(objects, "Service")["spec"]
    assert service["type"] == "NodePort"
    assert [(p["name"], p["port"]) for p in service["ports"]] == [("metrics", 9091), ("http", 3000)]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]

    policy = one(objects, "NetworkPolicy")["spec"]
    assert policy["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 9091}],
         "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]},
        {"ports": [{"protocol": "TCP", "port": 3000}]},
    ]
    assert policy["egress"] == [
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"ports": [{"protocol": "TCP", "port": 443}]},  # the API server's port is 443 here: once
        {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"protocol": "TCP", "port": 8443}]},
    ]

    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"] == "gpuops-bot"
    assert {s["name"] for o in objects for s in o.get("subjects", [])} == {"gpuops-bot"}
    assert "gpuops-pod-deleter" in {o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRole"}
    assert deployment["spec"]["template"]["metadata"]["annotations"]["team"] == "gpu-platform"
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert pod["tolerations"][0]["key"] == "node-role.kubernetes.io/control-plane"
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert bot["resources"] == {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "2Gi"}}


@pytest.mark.parametrize("values", [TOKENS, ["-f", str(FULL)]], ids=["default", "full"])
def test_the_configuration_it_renders_passes_the_bots_own_check(tmp_path, values):
    config = tmp_path / "config.yaml"
    (configmap,) = [o for o in render(tmp_path, *values) if o["kind"] == "ConfigMap" and "config.yaml" in o["data"]]
    config.write_text(configmap["data"]["config.yaml"])
    gpuops = Path(sys.executable).with_name("gpuops")  # the entry point the image runs
    done = subprocess.run([str(gpuops), "config", "check", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and ": ok: " in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(("values", "says"), [
    ([*TOKENS, "--set", "slack.mode=carrier-pigeon"], 'slack.mode is "carrier-pigeon": it is socket or http'),
    ([*TOKENS, "--set", "replicaCount=2"], "replicaCount is 2 but the database is the SQLite file, which one "
                                         "replica writes"),
    (["--set", "slack.botToken=xoxb-1"], "Socket Mode needs slack.appToken (or slack.existingSecret)"),
    (["--set", "slack.botToken=xoxb-1", "--set", "slack.mode=http"], "HTTP mode needs slack.signingSecret"),
    ([], "slack.botToken (or slack.existingSecret) is required"),
    ([*TOKENS, "--namespace", "platform", "--set", "config.upgrades.gpu_check.image=cuda:12"],
     "config.upgrades.gpu_check runs canary pods in namespace gpuops, but the chart lets the bot create pods only "
     "in the release namespace platform: set its namespace to platform"),
    ([*TOKENS, "--set", "config.pools.train.kind=training", "--set", "config.pools.train.gpu_check.namespace=ml"],
     "config.pools.train.gpu_check runs canary pods in namespace ml"),
    ([*TOKENS, "--set", "config.cluster.operator_namespace=nvidia"],
     "config.cluster.operator_namespace is nvidia but operatorNamespace is gpu-operator"),
], ids=["mode", "replicas", "no-app-token", "no-signing-secret", "no-tokens", "canary-namespace",
        "pool-canary-namespace", "operator-namespace"])
def test_values_the_bot_cannot_run_with_are_refused_at_render(tmp_path, values, says):
    done = run_helm("template", "gpuops", str(CHART), "--namespace", "gpuops", *values, home=tmp_path)
    assert done.returncode != 0 and says in done.stderr, done.stderr


def test_the_namespace_checks_let_through_what_the_bot_can_run(tmp_path):
    objects = render(tmp_path, *TOKENS, "--set", "config.upgrades.gpu_check.namespace=platform",
                     "--set", "config.pools.train.kind=training", "--set", "config.pools.train.gpu_check.enabled=false",
                     "--set", "config.cluster.operator_namespace=nvidia", "--set", "operatorNamespace=nvidia",
                     namespace="platform")
    assert yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"])["upgrades"]["gpu_check"] == {
        "namespace": "platform"}
    # A configuration from elsewhere is not the chart's to read: only the bot's check sees it.
    objects = render(tmp_path, *TOKENS, "--set", "existingConfigMap=mine", "--set", "config.pools.a.gpu_check.x=1",
                     namespace="platform")
    assert not [o for o in objects if o["kind"] == "ConfigMap"]
    assert volumes_of(one(objects, "Deployment")["spec"]["template"]["spec"])["config"] == {
        "configMap": {"name": "mine"}}


def test_an_existing_secret_is_mounted_and_none_is_created(tmp_path):
    objects = render(tmp_path, "--set", "slack.existingSecret=slack-tokens", "--set", "slack.mode=http")
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert not [o for o in objects if o["kind"] == "Secret"]
    assert volumes_of(pod)["slack"]["secret"]["secretName"] == "slack-tokens"
    assert "checksum/slack" not in one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize("values", [TOKENS, ["-f", str(FULL), *NO_SERVICE_MONITOR], ["-f", str(POSTGRES)]],
                         ids=["default", "full", "postgres"])
def test_an_install_is_accepted_and_its_service_account_gets_exactly_the_suites_rbac(cluster, tmp_path, values):
    installer = cluster.installer()
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig), "--kube-context", "admin"]
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in ("gpuops", "gpu-operator")]
    made_namespaces = [n for n in namespaces if not installer.exists(n)]
    # The bot's RBAC as other tests created it (deploy/rbac.yaml, kubectl-style): helm
    # refuses to take over objects it did not make, so they go for the install and come
    # back after it, as they were.
    bot_rbac = [d for f in (RBAC, POD_DELETE) for d in yaml.safe_load_all(f.read_text()) if d]
    had_rbac = [d for d in bot_rbac if installer.exists(d)]
    rendered = [o for o in render(tmp_path, *values) if not is_hook(o)]  # `helm test` makes its pod itself
    account = one(rendered, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    delete_anywhere = any(o["metadata"]["name"] == "gpuops-pod-deleter" for o in rendered)  # rbac.allowPodDelete
    expected = {ask: allowed or (delete_anywhere and ask[:2] == ("delete", "pods")) for ask, allowed in GRANTS}
    for namespace in made_namespaces:
        installer.create(namespace)
    for doc in had_rbac:
        installer.delete(doc)
    try:
        done = run_helm("install", "gpuops", str(CHART), "--namespace", "gpuops", *values, *kubeconfig, home=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        status = run_helm("status", "gpuops", "--namespace", "gpuops", "-o", "json", *kubeconfig, home=tmp_path)
        assert json.loads(status.stdout)["info"]["status"] == "deployed", status.stderr

        for obj in rendered:
            assert installer.exists(obj), f"{obj['kind']} {obj['metadata']['name']} was not created"
        stored = installer.get(one(rendered, "Deployment"))
        # Recreate for the SQLite file; on PostgreSQL a rolling update, with the budget
        # and the spreading over nodes the API server took as rendered.
        postgres = values[-1] == str(POSTGRES)
        assert stored["spec"]["strategy"]["type"] == ("RollingUpdate" if postgres else "Recreate")
        replicas = stored["spec"]["replicas"]
        # The ReplicaSet's pods, as the API server took them: the ServiceAccount's identity
        # is the one the RBAC integration tests act as ("bot" in the test kubeconfig).
        selector = ",".join(f"{k}={v}" for k, v in stored["spec"]["selector"]["matchLabels"].items())
        wait_until(lambda: len(installer.list("Pod", namespace="gpuops", selector=selector)) == replicas, timeout=60,
                   what="the Deployment's pods")
        pod = installer.list("Pod", namespace="gpuops", selector=selector)[0]
        if postgres:
            assert pod["spec"]["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
            assert installer.get(one(rendered, "PodDisruptionBudget"))["spec"]["minAvailable"] == 1
        namespace = pod["metadata"]["namespace"]
        identity = f"system:serviceaccount:{namespace}:{pod['spec']['serviceAccountName']}"
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
        assert pod["spec"]["serviceAccountName"] == account
        if values == TOKENS:
            assert (identity, tuple(groups)) == (BOT_USER, BOT_GROUPS)

        # The authorizer's answers for that identity, now that only the chart grants it
        # anything: those test_rbac.py expects of deploy/rbac.yaml (and, with
        # allowPodDelete, deleting pods anywhere). RBAC reaches the authorizer through a
        # watch, a moment after the install.
        def answers() -> dict:
            return {ask: _may(installer, identity, groups, *ask) for ask, _ in GRANTS}

        wait_until(lambda: answers() == expected, timeout=30, what="the chart's RBAC to reach the authorizer")
    finally:
        run_helm("uninstall", "gpuops", "--namespace", "gpuops", *kubeconfig, home=tmp_path)
        _remove_kept_claim(installer, rendered)
        selector = "app.kubernetes.io/instance=gpuops"
        wait_until(lambda: not [o for o in rendered if installer.exists(o)]
                   and not installer.list("Pod", namespace="gpuops", selector=selector),
                   timeout=60, what="the chart's objects and pod to go")
        for doc in had_rbac:
            installer.create(doc, exist_ok=True)
        for namespace in made_namespaces:
            installer.delete(namespace)
        wait_until(lambda: not [n for n in made_namespaces if installer.exists(n)], timeout=60,
                   what="the namespaces made for this test to go")


def _remove_kept_claim(installer, rendered: list[dict]) -> None:
    """The claim helm keeps on purpose, deleted. The API server puts the pvc-protection
    finalizer on every claim; its controller, which would drop it once no pod uses the
    claim, does not run in the test control plane, so the finalizer goes by hand."""
    for claim in [o for o in rendered if o["kind"] == "PersistentVolumeClaim"]:
        path = f"/api/v1/namespaces/{claim['metadata']['namespace']}/persistentvolumeclaims/{claim['metadata']['name']}"
        installer.delete(claim)
        try:
            installer.call("PATCH", path, body={"metadata": {"finalizers": None}},
                           content_type="application/merge-patch+json")
        except ApiException as err:
            if err.status != 404:
                raise


def _may(installer, user: str, groups: list[str], verb: str, resource: str, group: str, namespace: str | None) -> bool:
    attributes = {"verb": verb, "resource": resource, "group": group}
    if namespace is not None:
        attributes["namespace"] = namespace
    review = installer.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "resourceAttributes": attributes}})
    return bool(review.get("status", {}).get("allowed"))
