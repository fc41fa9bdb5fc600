"""The chart runs several replicas only on PostgreSQL: its URL from an existing Secret (a
file, never an environment value), a rolling update, a PodDisruptionBudget and replicas
spread over nodes; the SQLite file keeps one replica, Recreate and its volume, and
`replicaCount` above 1 on it does not render.

Rendered with `helm template` by a real helm (built by testenv, like the control plane)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testenv.helm import run_helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuops"
POSTGRES = CHART / "ci" / "values-postgres.yaml"
TOKENS = ["--set", "slack.botToken=xoxb-1", "--set", "slack.appToken=xapp-1"]
ON_POSTGRES = ["--set", "database.urlSecret.name=gpuops-db-app"]


def render(home: Path, *values: str) -> list[dict]:
    done = run_helm("template", "gpuops", str(CHART), "--namespace", "gpuops", *TOKENS, *values, home=home)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def kinds(objects: list[dict]) -> set[str]:
    return {o["kind"] for o in objects}


def deployment(objects: list[dict]) -> dict:
    (found,) = [o for o in objects if o["kind"] == "Deployment"]
    return found


def bot(objects: list[dict]) -> dict:
    (container,) = [c for c in deployment(objects)["spec"]["template"]["spec"]["containers"] if c["name"] == "gpuops"]
    return container


def test_sqlite_keeps_one_replica_recreate_its_volume_and_no_budget_or_spreading(tmp_path):
    objects = render(tmp_path)

    spec = deployment(objects)["spec"]
    assert (spec["replicas"], spec["strategy"]) == (1, {"type": "Recreate"})
    assert "PersistentVolumeClaim" in kinds(objects) and "PodDisruptionBudget" not in kinds(objects)
    assert "--database=/var/lib/gpuops/gpuops.db" in bot(objects)["args"]
    assert {"name": "data", "mountPath": "/var/lib/gpuops"} in bot(objects)["volumeMounts"]
    assert "topologySpreadConstraints" not in spec["template"]["spec"]


@pytest.mark.parametrize("replicas", ["2", "3"])
def test_several_replicas_on_sqlite_do_not_render_and_say_what_to_do(tmp_path, replicas):
    done = run_helm("template", "gpuops", str(CHART), "--namespace", "gpuops", *TOKENS, "--set",
                    f"replicaCount={replicas}", home=tmp_path)

    assert done.returncode != 0
    assert (f"replicaCount is {replicas} but the database is the SQLite file, which one replica writes: keep "
            "replicaCount 1, or set database.urlSecret.name to a Secret holding a postgresql:// URL") in done.stderr


def test_several_replicas_on_postgresql_roll_keep_one_through_a_drain_and_spread_over_nodes(tmp_path):
    objects = render(tmp_path, "-f", str(POSTGRES))

    spec = deployment(objects)["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (budget,) = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (spread,) = spec["template"]["spec"]["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["maxSkew"], spread["whenUnsatisfiable"]) == (
        "kubernetes.io/hostname", 1, "DoNotSchedule")
    assert spread["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]


def test_on_postgresql_the_url_is_a_file_from_its_secret_and_there_is_no_volume_for_a_sqlite_file(tmp_path):
    objects = render(tmp_path, "-f", str(POSTGRES))

    container, pod = bot(objects), deployment(objects)["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUOPS_DATABASE_URL_FILE"] == "/var/run/secrets/gpuops-database/uri"
    assert "GPUOPS_DATABASE_URL" not in env
    assert not any(a.startswith("--database") for a in container["args"])
    assert {"name": "database", "mountPath": "/var/run/secrets/gpuops-database", "readOnly": True} in \
        container["volumeMounts"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["database"]["secret"] == {"secretName": "gpuops-db-app", "items": [{"key": "uri", "path": "uri"}],
                                             "defaultMode": 0o400}
    assert "data" not in volumes and "PersistentVolumeClaim" not in kinds(objects)


def test_one_replica_on_postgresql_rolls_too_without_a_budget_that_would_block_every_drain(tmp_path):
    objects = render(tmp_path, *ON_POSTGRES)

    spec = deployment(objects)["spec"]
    assert (spec["replicas"], spec["strategy"]["type"]) == (1, "RollingUpdate")
    assert "PodDisruptionBudget" not in kinds(objects)


def test_the_network_policy_lets_the_bot_reach_postgresql_on_its_port(tmp_path):
    def egress_ports(objects: list[dict]) -> set[int]:
        (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
        return {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}

    assert 5432 not in egress_ports(render(tmp_path))
    assert 5432 in egress_ports(render(tmp_path, *ON_POSTGRES))
    assert 6432 in egress_ports(render(tmp_path, *ON_POSTGRES, "--set", "database.port=6432"))


def test_no_replica_at_all_renders_for_a_pause_such_as_a_database_copy(tmp_path):
    assert deployment(render(tmp_path, "--set", "replicaCount=0"))["spec"]["replicas"] == 0


def test_the_chart_lints_strictly_on_postgresql(tmp_path):
    done = run_helm("lint", "--strict", str(CHART), "--namespace", "gpuops", "-f", str(POSTGRES), home=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
