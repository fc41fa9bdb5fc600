"""`helm` for the chart's tests, built from the Go module proxy like the control plane's
binaries (`testenv.build`) and cached beside them, one folder per version: `go install`
of one pinned release into a scratch folder, then moved into the cache whole, so a build
that stops half way leaves nothing a later run would take for a binary.

Helm v4's `go.mod` has no replace directives, so `go install module@version` builds it as
released, with the dependency versions its own `go.mod` and `go.sum` pin."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testenv.build import BuildError, _Heartbeat, _run, cache_root, start_go_build

HELM_MODULE = "helm.sh/helm/v4/cmd/helm"
HELM_VERSION = "v4.3.2"
# Without it `helm version` says the release line ("v4.3"), as a build outside helm's
# Makefile does; the binary should say which release it is.
_LDFLAGS = f"-s -w -X helm.sh/helm/v4/internal/version.version={HELM_VERSION}"


def helm_binary(*, verbose: bool = True) -> Path:
    """The cached helm, built on first use (4 minutes on two cores with empty Go module
    and build caches: about 120 modules downloaded, 1,100 packages compiled)."""
    target = cache_root() / f"helm-{HELM_VERSION}" / "helm"
    if target.is_file():
        return target
    log, started = start_go_build(target, what=f"helm {HELM_VERSION}", missing_go=f"to build helm {HELM_VERSION}",
                                  verbose=verbose)
    with tempfile.TemporaryDirectory(prefix="gpuops-helm-") as work:
        out = Path(work) / "bin"
        # GOFLAGS is emptied: the control plane's builds set -mod=mod, which `go install
        # module@version` refuses.
        with _Heartbeat(f"helm {HELM_VERSION}", log) if verbose else contextlib.nullcontext():
            _run(["go", "install", "-v", "-trimpath", "-ldflags", _LDFLAGS, f"{HELM_MODULE}@{HELM_VERSION}"],
                 cwd=Path(work), log=log, env={"GOBIN": str(out), "GOFLAGS": ""})
        # Copied next to the target first, then renamed: another process that finds the
        # target finds all of it.
        partial = target.with_name(f"helm.partial-{Path(work).name}")
        shutil.copy2(out / "helm", partial)
        partial.replace(target)
    if verbose:
        print(f"testenv: built helm {HELM_VERSION} in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return target


def run_helm(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The cached helm with `args`, its configuration, cache and data under `home`: a
    developer's own repositories, plugins and kubeconfig do not change what it does."""
    env = {"HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data"), "KUBECONFIG": str(home / "no-kubeconfig"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=timeout)


if __name__ == "__main__":
    try:
        print(helm_binary())
    except BuildError as err:
        sys.exit(f"testenv helm: {err}")
