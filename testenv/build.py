"""Build the test control plane's binaries from the Go module proxy, cached per version.

kube-apiserver, kube-controller-manager and kube-scheduler come from a wrapper module
that requires k8s.io/kubernetes and pins every staging module the release requires at
v0.0.0 (the proxy does not serve v0.0.0, kubernetes/kubernetes#79384). etcd comes from a
wrapper around go.etcd.io/etcd/server/v3 (its own replaces are ignored in a dependency),
kwok from `go install`. If KUBEBUILDER_ASSETS names a folder holding every binary, that
folder is used as it is and nothing is built.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
_KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
_ETCD_MODULES = ("api/v3", "client/pkg/v3", "client/v3", "pkg/v3", "server/v3")


class BuildError(RuntimeError):
    """A binary could not be built; the message names the step and its log."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuops" / "testenv"


def bin_dir() -> Path:
    tag = f"k8s-{KUBERNETES_VERSION}_etcd-{ETCD_VERSION}_kwok-{KWOK_VERSION}"
    return cache_root() / tag / "bin"


def _assets_dir() -> Path | None:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        return None
    folder = Path(assets)
    missing = [name for name in BINARIES if not (folder / name).is_file()]
    if missing:
        raise BuildError(
            f"KUBEBUILDER_ASSETS={assets} lacks {', '.join(missing)}; "
            "unset it to build every binary from the Go module proxy"
        )
    return folder


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", GOFLAGS="-mod=mod", CGO_ENABLED="0", GOWORK="off")
    return env


def _run(args: list[str], *, cwd: Path, log: Path, env: dict[str, str] | None = None) -> str:
    with log.open("a") as out:
        out.write(f"$ {' '.join(args)}\n")
        out.flush()
        proc = subprocess.run(
            args, cwd=cwd, env={**_go_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=out, text=True
        )
        out.write(proc.stdout)
    if proc.returncode != 0:
        raise BuildError(f"`{' '.join(args)}` failed (exit {proc.returncode}); see {log}")
    return proc.stdout


def start_go_build(target: Path, *, what: str, missing_go: str, verbose: bool) -> tuple[Path, float]:
    """What every cached Go build does first: check Go is there (else say `missing_go`),
    make the target's folder, open its build log and say once what is built. Returns the
    log and when the build started."""
    if shutil.which("go") is None:
        raise BuildError(f"Go is not installed; install Go >= 1.26 {missing_go}")
    target.parent.mkdir(parents=True, exist_ok=True)
    log = target.parent / "build.log"
    log.touch()
    if verbose:
        print(f"testenv: building {what} (first time only; log: {log})", file=sys.stderr, flush=True)
    return log, time.monotonic()


def go_install_cached(target: Path, package: str, *, what: str, built: str, ldflags: str,
                      verbose: bool = True) -> Path:
    """`go install package` (a released `module/cmd@version`) into the cache as `target`,
    built once: into a scratch folder, then copied next to the target and renamed, so a
    build that stops half way leaves nothing a later run would take for a binary, and
    another process that finds the target finds all of it. `built` is the name `go
    install` gives the binary."""
    if target.is_file():
        return target
    log, started = start_go_build(target, what=what, missing_go=f"to build {what}", verbose=verbose)
    with tempfile.TemporaryDirectory(prefix="gpuops-go-install-") as work:
        out = Path(work) / "bin"
        # GOFLAGS is emptied: the control plane's builds set -mod=mod, which `go install
        # module@version` refuses.
        with _Heartbeat(what, log) if verbose else contextlib.nullcontext():
            _run(["go", "install", "-v", "-trimpath", "-ldflags", ldflags, package],
                 cwd=Path(work), log=log, env={"GOBIN": str(out), "GOFLAGS": ""})
        partial = target.with_name(f"{target.name}.partial-{Path(work).name}")
        shutil.copy2(out / built, partial)
        partial.replace(target)
    if verbose:
        print(f"testenv: built {what} in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return target


def _release_gomod(*, module: str, version: str, work: Path, log: Path) -> str:
    info = json.loads(_run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd=work, log=log))
    return Path(info["GoMod"]).read_text()


def _staging_replaces(gomod: str) -> list[str]:
    """Every k8s.io module the release requires at v0.0.0 (its staging modules)."""
    staging = []
    for line in gomod.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].startswith("k8s.io/") and words[1] == "v0.0.0":
            staging.append(words[0])
        elif len(words) >= 3 and words[0] == "require" and words[2] == "v0.0.0":
            staging.append(words[1])
    return sorted(set(staging))


def _header_lines(gomod: str) -> list[str]:
    """The release's `go` and `godebug` lines: GODEBUG defaults come from the main module."""
    return [line for line in gomod.splitlines() if line.startswith(("go ", "godebug "))]


def _write_module(folder: Path, *, name: str, gomod: str, main_imports: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "go.mod").write_text(gomod)
    imports = "\n".join(f'\t_ "{path}"' for path in main_imports)
    (folder / "tools.go").write_text(f"//go:build tools\n\npackage {name}\n\nimport (\n{imports}\n)\n")


def _build_kubernetes(*, work: Path, out: Path, log: Path) -> None:
    release = _release_gomod(module="k8s.io/kubernetes", version=KUBERNETES_VERSION, work=work, log=log)
    minor = KUBERNETES_VERSION.split(".")[1]
    staging_version = "v0." + KUBERNETES_VERSION.split(".", 1)[1]
    replaces = "\n".join(f"\t{mod} => {mod} {staging_version}" for mod in _staging_replaces(release))
    gomod = "\n".join(
        ["module gpuops.local/kubewrap", "", *_header_lines(release), "",
         f"require k8s.io/kubernetes {KUBERNETES_VERSION}", "", f"replace (\n{replaces}\n)", ""]
    )
    module = work / "kubewrap"
    _write_module(module, name="kubewrap", gomod=gomod,
                  main_imports=[f"k8s.io/kubernetes/cmd/{cmd}" for cmd in _KUBE_COMMANDS])
    _run(["go", "mod", "tidy", "-e"], cwd=module, log=log)
    ldflags = (
        f"-s -w -X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}"
        f" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor={minor}"
    )
    _run(["go", "build", "-v", "-ldflags", ldflags, "-o", str(out) + "/",
          *[f"k8s.io/kubernetes/cmd/{cmd}" for cmd in _KUBE_COMMANDS]], cwd=module, log=log)


def _build_etcd(*, work: Path, out: Path, log: Path) -> None:
    release = _release_gomod(module="go.etcd.io/etcd/server/v3", version=ETCD_VERSION, work=work, log=log)
    requires = "\n".join(f"\tgo.etcd.io/etcd/{mod} {ETCD_VERSION}" for mod in _ETCD_MODULES)
    gomod = "\n".join(["module gpuops.local/etcdwrap", "", *_header_lines(release), "",
                       f"require (\n{requires}\n)", ""])
    module = work / "etcdwrap"
    _write_module(module, name="etcdwrap", gomod=gomod, main_imports=["go.etcd.io/etcd/server/v3"])
    _run(["go", "mod", "tidy", "-e"], cwd=module, log=log)
    _run(["go", "build", "-v", "-ldflags", "-s -w", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"],
         cwd=module, log=log)


def _build_kwok(*, work: Path, out: Path, log: Path) -> None:
    module = work / "kwokwrap"
    module.mkdir(parents=True, exist_ok=True)
    env_bin = module / "bin"
    with log.open("a") as stream:
        stream.write(f"$ go install sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}\n")
    proc = subprocess.run(
        ["go", "install", "-v", "-ldflags", "-s -w", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"],
        cwd=module, env={**_go_env(), "GOBIN": str(env_bin), "GOFLAGS": ""},
        stdout=log.open("a"), stderr=subprocess.STDOUT,
    )
    if proc.returncode != 0:
        raise BuildError(f"building kwok {KWOK_VERSION} failed; see {log}")
    shutil.copy2(env_bin / "kwok", out / "kwok")


# How often a build in progress says it is alive.
PROGRESS_EVERY = 30.0


def progress_line(what: str, log_text: str, elapsed: float) -> str:
    """One line on a build step so far, from what its part of the log says: `go build -v`
    names each package it compiles, `go mod` each module it downloads."""
    lines = [line for line in log_text.splitlines() if line and not line.startswith("$ ")]
    downloads = sum(1 for line in lines if line.startswith("go: downloading"))
    packages = sum(1 for line in lines if not line.startswith("go: ") and " " not in line.strip())
    minutes, seconds = divmod(int(elapsed), 60)
    return (f"testenv: still building {what}: {minutes}m{seconds:02d}s so far, {packages} packages compiled, "
            f"{downloads} modules downloaded")


class _Heartbeat:
    """Prints `progress_line` every PROGRESS_EVERY seconds while a step runs."""

    def __init__(self, what: str, log: Path, *, every: float = PROGRESS_EVERY) -> None:
        self.what, self.log, self.every = what, log, every
        self.offset = log.stat().st_size if log.exists() else 0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="testenv-build-progress", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            with self.log.open("rb") as stream:
                stream.seek(self.offset)
                text = stream.read().decode("utf-8", "replace")
            print(progress_line(self.what, text, time.monotonic() - self.started), file=sys.stderr, flush=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def binaries_ready() -> bool:
    """Whether every control-plane binary is there (KUBEBUILDER_ASSETS or the cache)."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    folder = Path(assets) if assets else bin_dir()
    return all((folder / name).is_file() for name in BINARIES)


def ensure_binaries(*, verbose: bool = True) -> Path:
    """Return the folder holding every binary, building what the cache lacks."""
    assets = _assets_dir()
    if assets is not None:
        return assets
    target = bin_dir()
    if all((target / name).is_file() for name in BINARIES):
        return target
    if shutil.which("go") is None:
        raise BuildError("Go is not installed; install Go >= 1.26 or set KUBEBUILDER_ASSETS")
    target.parent.mkdir(parents=True, exist_ok=True)
    log = target.parent / "build.log"
    staging = Path(tempfile.mkdtemp(prefix="bin-", dir=target.parent))
    steps = (
        ("etcd", _build_etcd),
        ("kwok", _build_kwok),
        ("kube-apiserver, kube-controller-manager, kube-scheduler", _build_kubernetes),
    )
    with tempfile.TemporaryDirectory(prefix="gpuops-build-") as tmp:
        for what, step in steps:
            started = time.monotonic()
            if verbose:
                print(f"testenv: building {what} (first time only; progress every {PROGRESS_EVERY:.0f}s; "
                      f"log: {log})", file=sys.stderr, flush=True)
            log.touch()
            with _Heartbeat(what, log) if verbose else contextlib.nullcontext():
                step(work=Path(tmp), out=staging, log=log)
            if verbose:
                print(f"testenv: built {what} in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target


if __name__ == "__main__":
    try:
        print(ensure_binaries())
    except BuildError as err:
        sys.exit(f"testenv build: {err}")
