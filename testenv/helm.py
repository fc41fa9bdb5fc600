"""`helm` for the chart's tests, built from the Go module proxy like the control plane's
binaries (`testenv.build`) and cached beside them, one folder per version: `go install`
of one pinned release into a scratch folder, then moved into the cache whole, so a build
that stops half way leaves nothing a later run would take for a binary.

Helm v4's `go.mod` has no replace directives, so `go install module@version` builds it as
released, with the dependency versions its own `go.mod` and `go.sum` pin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testenv.build import BuildError, cache_root, go_install_cached

HELM_MODULE = "helm.sh/helm/v4/cmd/helm"
HELM_VERSION = "v4.3.2"
# Without it `helm version` says the release line ("v4.3"), as a build outside helm's
# Makefile does; the binary should say which release it is.
_LDFLAGS = f"-s -w -X helm.sh/helm/v4/internal/version.version={HELM_VERSION}"


def helm_path() -> Path:
    """Where the cached helm is (or will be, once built)."""
    return cache_root() / f"helm-{HELM_VERSION}" / "helm"


def helm_binary(*, verbose: bool = True) -> Path:
    """The cached helm, built on first use (4 minutes on two cores with empty Go module
    and build caches: about 120 modules downloaded, 1,100 packages compiled)."""
    return go_install_cached(helm_path(), f"{HELM_MODULE}@{HELM_VERSION}",
                             what=f"helm {HELM_VERSION}", built="helm", ldflags=_LDFLAGS, verbose=verbose)


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
