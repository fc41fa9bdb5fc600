"""`python -m testenv build|up|down|status|demo|serve`: the local control plane with the
real GPU Operator and a simulated GPU fleet, for the demo and for working by hand.

`up` starts a background process (`serve`) that owns the control plane and the operand
simulator, and returns when the fleet is in place; `down` stops it and everything it
started. The kubeconfig goes to .gpuops/testenv/kubeconfig.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from testenv import build, firstbuild, operator
from testenv.helm import helm_binary
from testenv.prometheus import prometheus_binary
from testenv.toxiproxy import toxiproxy_binary
from testenv import fleet as fl
from testenv.controlplane import ControlPlaneError
from testenv.install import CrdsMissing, crds_folder

DEFAULT_FOLDER = Path(".gpuops/testenv")


def _state_file(folder: Path) -> Path:
    return folder / "state.json"


def _read_state(folder: Path) -> dict | None:
    try:
        state = json.loads(_state_file(folder).read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(state["serve_pid"], 0)
    except (OSError, KeyError):
        return None
    return state


def cmd_build(args: argparse.Namespace) -> int:
    # Everything is built here, not inside a test's time limit on a fresh machine: the
    # control plane, the real GPU Operator the fleets run on, helm for the chart's tests,
    # Prometheus for the metrics tests and Toxiproxy for the API-faults suite.
    firstbuild.build_all()
    print(f"testenv: binaries ready in {build.ensure_binaries()}")
    print(f"testenv: the GPU Operator is ready at {operator.operator_binary()}")
    print(f"testenv: helm is ready at {helm_binary()}")
    print(f"testenv: Prometheus is ready at {prometheus_binary()}")
    print(f"testenv: Toxiproxy is ready at {toxiproxy_binary()}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Run in the foreground until SIGTERM/SIGINT: what `up` starts in the background."""
    from testenv.bot_identity import grant_bot_rbac
    from testenv.environment import Environment

    folder: Path = args.folder.resolve()
    spec = fl.load_fleet(args.fleet)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    env = Environment(folder=folder / "plane")
    try:
        env.start()
        env.apply_fleet(spec)
        # Where gpuops itself would run (its engine Lease lives there), with its own
        # least-privilege identity: the kubeconfig's "bot" context, which the demo acts as.
        env.installer().create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuops"}},
                               exist_ok=True)
        grant_bot_rbac(env.installer())
        link = folder / "kubeconfig"
        link.unlink(missing_ok=True)
        link.write_text(env.kubeconfig.read_text())
        link.chmod(0o600)
        env.plane.write_state(_state_file(folder), serve_pid=os.getpid(), fleet=spec.name,
                              kubeconfig=str(link))
        print(f"testenv: fleet {spec.name!r} is up", flush=True)
        stop.wait()
    finally:
        env.stop()
        _state_file(folder).unlink(missing_ok=True)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    if (state := _read_state(folder)) is not None:
        print(f"testenv: already running (fleet {state['fleet']!r}); kubeconfig: {state['kubeconfig']}")
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    _state_file(folder).unlink(missing_ok=True)
    # A bad fleet name, missing CRDs or a missing GPU Operator fail here, before anything starts.
    spec = fl.load_fleet(args.fleet)
    if spec.operator.real:
        operator.operator_binary()
    elif spec.operator.installed:
        crds_folder()
    log = folder / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "testenv", "serve", "--fleet", args.fleet, "--folder", str(folder)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if _read_state(folder) is not None:
            break
        if process.poll() is not None:
            print(f"testenv: the control plane did not come up (exit {process.returncode}); "
                  f"log: {log}\n{_tail(log)}", file=sys.stderr)
            return 1
        time.sleep(0.2)
    else:
        process.terminate()
        print(f"testenv: not up after {args.timeout:.0f}s; log: {log}\n{_tail(log)}", file=sys.stderr)
        return 1
    from testenv.summary import wait_converged

    kubeconfig = (folder / "kubeconfig").resolve()
    # Return only once the simulated GPUs are advertised: a command run right after sees
    # the fleet as it is, not 0 GPUs everywhere.
    try:
        wait_converged(kubeconfig, timeout=max(10.0, deadline - time.monotonic()))
    except TimeoutError as err:
        print(f"testenv: the control plane is up but the fleet did not settle: {err}; log: {log}", file=sys.stderr)
        return 1
    print(f"testenv: up (fleet {args.fleet!r}, every GPU node advertising); kubeconfig: {kubeconfig}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    state = _read_state(folder)
    if state is None:
        print("testenv: not running")
        return 0
    os.kill(state["serve_pid"], signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(state["serve_pid"], 0)
        except OSError:
            break
        time.sleep(0.1)
    else:
        with contextlib.suppress(OSError):
            os.killpg(state["pgid"], signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(state["serve_pid"], signal.SIGKILL)
    _state_file(folder).unlink(missing_ok=True)
    print("testenv: stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = _read_state(args.folder)
    if state is None:
        print("testenv: not running")
        return 1
    from testenv.summary import print_summary

    print_summary(Path(state["kubeconfig"]), fleet=state["fleet"])
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    code = cmd_up(args)
    if code:
        return code
    from testenv.bot_identity import BOT_CONTEXT
    from testenv.summary import print_summary

    state = _read_state(args.folder)
    assert state is not None
    kubeconfig = Path(state["kubeconfig"]).resolve()
    print_summary(kubeconfig, fleet=state["fleet"])
    print(f"\nkubeconfig: {kubeconfig}\n  kubectl --kubeconfig {kubeconfig} get nodes")
    print(f"gpuops acts as its own ServiceAccount (context {BOT_CONTEXT!r}, the RBAC of deploy/rbac.yaml), "
          "not as admin: what it may not do, the cluster refuses it here as it would in yours.")
    print("Stop the control plane with: make testenv-down")
    return 0


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testenv", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build or find the control plane binaries").set_defaults(func=cmd_build)
    for name, func, text in (
        ("up", cmd_up, "start the control plane with a fleet in the background"),
        ("demo", cmd_demo, "up, then print a summary of the fleet"),
        ("serve", cmd_serve, "run the control plane in the foreground (what up starts)"),
        ("down", cmd_down, "stop what up started"),
        ("status", cmd_status, "print a summary of the running fleet"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
        p.add_argument("--fleet", default="demo")
        p.add_argument("--timeout", type=float, default=180.0)
        p.set_defaults(func=func)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (build.BuildError, FileNotFoundError, CrdsMissing, ControlPlaneError, operator.OperatorMissing) as err:
        print(f"testenv: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
