"""`make testenv-up` (python -m testenv up) returns only once the simulated fleet has
settled: a command run right after it sees every GPU node advertising its GPUs; and the
bot's own identity (the "bot" context `make demo` acts as) has deploy/rbac.yaml's rights
and no more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import config as kube_config
from kubernetes.client.rest import ApiException

from testenv.install import Installer
from testenv.summary import _installer, advertised


ROOT = Path(__file__).resolve().parents[2]
SMALL = """\
name: small
system_nodes: 0
pools:
  - name: serving-z
    kind: serving
    nodes: 3
"""


def test_testenv_up_returns_only_once_every_gpu_node_advertises_its_gpus(tmp_path):
    fleet_file = tmp_path / "small.yaml"
    fleet_file.write_text(SMALL)
    folder = tmp_path / "env"
    testenv = [sys.executable, "-m", "testenv"]
    up = subprocess.run([*testenv, "up", "--fleet", str(fleet_file), "--folder", str(folder)],
                        capture_output=True, text=True, cwd=ROOT, timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "every GPU node advertising" in up.stdout
        nodes = _installer(folder / "kubeconfig").list("Node", selector="nvidia.com/gpu.present=true")
        assert len(nodes) == 3 and all(advertised(n) == 8 for n in nodes), [advertised(n) for n in nodes]
        # What `make demo` runs gpuops as: the bot's ServiceAccount, which reads the fleet
        # but may not, say, make a namespace, as in a cluster it is installed in.
        bot = Installer(kube_config.new_client_from_config(config_file=str(folder / "kubeconfig"), context="bot"))
        assert len(bot.list("Node", selector="nvidia.com/gpu.present=true")) == 3
        with pytest.raises(ApiException) as refused:
            bot.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "not-the-bots"}})
        assert refused.value.status == 403
    finally:
        subprocess.run([*testenv, "down", "--folder", str(folder)], capture_output=True, cwd=ROOT, timeout=60)
