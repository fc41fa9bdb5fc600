"""The real NVIDIA GPU Operator for the test control plane: built once from its vendored
source and run against the test API server in the control plane's process group.

- The source is the GPU Operator snapshot beside this repository
  (../shared/thirdparty/gpu-operator-v26.7.0; `GPUOPS_GPU_OPERATOR_SOURCE` names another).
  `operator_binary()` builds `./cmd/gpu-operator` from it with its vendored modules, once,
  into the testenv cache keyed by the snapshot's version; `GPUOPS_GPU_OPERATOR_BINARY`
  names a prebuilt binary instead (as KUBEBUILDER_ASSETS does for the control plane).
- The operator reads its operand manifests only from /opt/gpu-operator (no flag), so
  `ControlPlane.start_operator` runs it in a private mount namespace (`unshare -m`, root
  or a user namespace) with a copy of the snapshot's `assets/` and `manifests/` laid out
  as in its image bound over /opt. Leader election is off (its default), metrics and
  probes listen on free 127.0.0.1 ports, and its log sits beside the other components'.
- `cluster_policy()` is a ClusterPolicy as the chart renders one from its own
  values.yaml: every operand names its image (a version change of the driver only makes
  a new image when the CR names it), and `install_operator_crds()` installs the chart's
  CRDs (ClusterPolicy, NVIDIADriver, GPUCluster and the rest it watches).

Every fleet runs on it (Environment.apply_fleet starts it with the first fleet that
wants it) unless the fleet names in `operator.stand_in` why the real operator cannot
play its scenario on kwok; see testenv/fleet.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from testenv.build import BuildError, _Heartbeat, cache_root, start_go_build

SOURCE_ENV = "GPUOPS_GPU_OPERATOR_SOURCE"
BINARY_ENV = "GPUOPS_GPU_OPERATOR_BINARY"
NAMESPACE = "gpu-operator"
# The snapshot this repository's CI reads, beside the checkout (as ../shared is).
_DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "shared" / "thirdparty" / "gpu-operator-v26.7.0"
_VERSION = re.compile(r"^VERSION \?= (v\S+)$", re.MULTILINE)


class OperatorMissing(RuntimeError):
    """The GPU Operator's source (or prebuilt binary) is not where the settings say."""


def source_folder() -> Path:
    folder = Path(os.environ.get(SOURCE_ENV) or _DEFAULT_SOURCE)
    if not (folder / "cmd" / "gpu-operator").is_dir() or not (folder / "vendor").is_dir():
        raise OperatorMissing(
            f"no GPU Operator source with vendor/ at {folder}: set {SOURCE_ENV} to the snapshot "
            f"(in this repository's CI, ../shared/thirdparty/gpu-operator-v26.7.0), or {BINARY_ENV} "
            "to a gpu-operator binary built from it")
    return folder


def snapshot_version(source: Path) -> str:
    """The snapshot's own version (`VERSION ?= v26.7.0` in its versions.mk)."""
    found = _VERSION.search((source / "versions.mk").read_text())
    if found is None:
        raise OperatorMissing(f"{source / 'versions.mk'} names no VERSION")
    return found.group(1)


def operator_path() -> Path:
    """Where the operator binary is: the prebuilt one `GPUOPS_GPU_OPERATOR_BINARY` names,
    else the cached build from the snapshot (there once built)."""
    prebuilt = os.environ.get(BINARY_ENV)
    if prebuilt:
        return Path(prebuilt)
    return cache_root() / f"gpu-operator-{snapshot_version(source_folder())}" / "gpu-operator"


def operator_binary(*, verbose: bool = True) -> Path:
    """The gpu-operator binary: the prebuilt one `GPUOPS_GPU_OPERATOR_BINARY` names, else
    the one built from the snapshot (built now if the cache lacks it)."""
    prebuilt = os.environ.get(BINARY_ENV)
    if prebuilt:
        if not os.access(prebuilt, os.X_OK):
            raise OperatorMissing(f"{BINARY_ENV}={prebuilt} is not an executable file")
        return Path(prebuilt)
    source = source_folder()
    target = operator_path()
    if target.is_file():
        return target
    log, started = start_go_build(target, what=f"the GPU Operator {snapshot_version(source)} from {source}",
                                  missing_go=f"or set {BINARY_ENV}", verbose=verbose)
    env = {**os.environ, "GOFLAGS": "-mod=vendor", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOWORK": "off"}
    # The snapshot may be read-only: the build writes only to the Go cache and the output.
    partial = target.with_suffix(".partial")
    with log.open("a") as out, (_Heartbeat("the GPU Operator", log) if verbose else contextlib.nullcontext()):
        out.write(f"$ go build -v -o {partial} ./cmd/gpu-operator\n")
        out.flush()
        done = subprocess.run(["go", "build", "-v", "-ldflags", "-s -w", "-o", str(partial), "./cmd/gpu-operator"],
                              cwd=source, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise BuildError(f"building the GPU Operator failed (exit {done.returncode}); see {log}")
    partial.rename(target)
    if verbose:
        print(f"testenv: built the GPU Operator in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return target


def operand_root(folder: Path) -> Path:
    """A folder laid out as /opt in the operator's image: gpu-operator/<state-...>/ from
    the snapshot's assets/ and gpu-operator/manifests/. Copied (the operator walks the
    tree and reads a symlinked folder as a file), once per control-plane folder."""
    root = folder / "opt"
    if (root / "gpu-operator" / "manifests").is_dir():
        return root
    source = source_folder()
    staging = Path(tempfile.mkdtemp(prefix="opt-", dir=folder))
    layout = staging / "gpu-operator"
    layout.mkdir()
    for state in sorted((source / "assets").iterdir()):
        shutil.copytree(state, layout / state.name)
    shutil.copytree(source / "manifests", layout / "manifests")
    staging.rename(root)
    return root


def chart_values() -> dict[str, Any]:
    return yaml.safe_load((source_folder() / "deployments" / "gpu-operator" / "values.yaml").read_text())


def _image(part: dict[str, Any], default_version: str) -> str:
    return f"{part['repository']}/{part['image']}:{part.get('version') or default_version}"


def operator_environment(namespace: str = NAMESPACE) -> dict[str, str]:
    """The environment the chart's Deployment gives the operator: its namespace and the
    images it cannot take from a ClusterPolicy (the driver manager, the validator)."""
    values, version = chart_values(), snapshot_version(source_folder())
    return {"OPERATOR_NAMESPACE": namespace,
            "DRIVER_MANAGER_IMAGE": _image(values["driver"]["manager"], version),
            "VALIDATOR_IMAGE": _image(values["validator"], version)}


def cluster_policy(*, driver_version: str, name: str = "cluster-policy", auto_upgrade: bool = False) -> dict[str, Any]:
    """The snapshot's sample ClusterPolicy with every operand's image named as the chart
    names it from its values.yaml (a missing version is the snapshot's own, the chart's
    appVersion default), the driver at `driver_version`."""
    source = source_folder()
    policy = yaml.safe_load((source / "config" / "samples" / "v1_clusterpolicy.yaml").read_text())
    values, version = chart_values(), snapshot_version(source)
    for key, part in values.items():
        if isinstance(part, dict) and "repository" in part and "image" in part:
            named = policy["spec"].setdefault(key, {})
            named.update(repository=part["repository"], image=part["image"], version=part.get("version") or version)
    policy["metadata"] = {"name": name}
    policy["spec"]["driver"]["version"] = driver_version
    policy["spec"]["driver"].setdefault("upgradePolicy", {})["autoUpgrade"] = auto_upgrade
    return policy


def operator_crds() -> list[dict[str, Any]]:
    """The chart's CRDs (ClusterPolicy, NVIDIADriver, GPUCluster and the rest it watches)."""
    crds = []
    for file in sorted((source_folder() / "deployments" / "gpu-operator" / "crds").glob("*.yaml")):
        crds += [doc for doc in yaml.safe_load_all(file.read_text())
                 if doc and doc.get("kind") == "CustomResourceDefinition"]
    return crds
