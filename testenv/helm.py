"""`helm` for the chart's tests, built from the Go module proxy like the control plane's
binaries (`testenv.build`) and cached beside them: `go install` of one pinned release,
whole or not at all."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from testenv.build import _run, cache_root

HELM_MODULE = "helm.sh/helm/v4/cmd/helm"
HELM_VERSION = "v4.3.2"


def helm_binary() -> Path:
    """The cached helm, built on first use (a few minutes on two cores)."""
    folder = cache_root() / f"helm-{HELM_VERSION}"
    target = folder / "helm"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "build.log"
    with tempfile.TemporaryDirectory(prefix="gpuops-helm-") as work:
        out = Path(work) / "bin"
        _run(["go", "install", "-ldflags", "-s -w", f"{HELM_MODULE}@{HELM_VERSION}"], cwd=Path(work), log=log,
             env={"GOBIN": str(out), "GOFLAGS": ""})
        partial = target.with_suffix(".partial")
        shutil.copy2(out / "helm", partial)
        partial.replace(target)
    return target
