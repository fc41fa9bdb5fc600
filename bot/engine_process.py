"""`python -m bot.engine_process`: one engine replica as a process of its own, against a
kubeconfig and a database (the integration tests' way to run, kill and restart an engine;
`gpuops run` runs the same engine inside the bot). Its arguments, signals and the tests'
crash hook live here, beside the bot's other process code."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence

from bot.wiring import build_runtime
from storage import audit
from storage.database import Database
from workflows.config import ConfigError, load_config
from workflows.engine.lease import LeaseSettings
from workflows.engine.loop import EngineSettings, run_engine

CRASH_AFTER_ENV = "GPUOPS_TEST_CRASH_AFTER"


def _crash_hook(db: Database) -> Callable[[int], None] | None:
    """Tests only: with GPUOPS_TEST_CRASH_AFTER=N the process SIGKILLs itself right after
    its Nth committed transition, and with GPUOPS_TEST_CRASH_AFTER=<audit action> (e.g.
    `pod.delete`) right after the commit that wrote the first audit row of that action:
    to prove that a restart repeats no side effect."""
    value = os.environ.get(CRASH_AFTER_ENV)
    if not value:
        return None
    if value.isdigit():
        limit = int(value)

        def reached(commits: int) -> bool:
            return commits >= limit
    else:
        def reached(commits: int) -> bool:
            newest = audit.recent(db, 1)
            return bool(newest) and newest[0].action == value

    def crash(commits: int) -> None:
        if reached(commits):
            logging.getLogger("gpuops.engine").warning("%s=%s: killing myself after commit %d",
                                                      CRASH_AFTER_ENV, value, commits)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    return crash


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bot.engine_process`: one engine replica against a kubeconfig and a database."""
    parser = argparse.ArgumentParser(prog="python -m bot.engine_process", description=main.__doc__)
    parser.add_argument("--db", required=True, help="the gpuops database file")
    parser.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--config", help="gpuops configuration (YAML): the pool label, the operator namespace, and "
                        "the pools' policies checked before every wave (without it, none are)")
    parser.add_argument("--identity", default=f"{socket.gethostname()}-{os.getpid()}",
                        help="this replica's name in the lease and the audit log (default: host-pid)")
    parser.add_argument("--lease-namespace", default=LeaseSettings.namespace)
    parser.add_argument("--lease-name", default=LeaseSettings.name)
    parser.add_argument("--lease-seconds", type=float, default=LeaseSettings.duration.total_seconds())
    parser.add_argument("--max-parallel-nodes", type=int, default=EngineSettings.max_parallel_nodes)
    parser.add_argument("--exit-when-idle", action="store_true",
                        help="stop once no run is left unfinished (tests, one-off runs)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # The same composition as the bot's (bot.wiring): gateway, watch cache, database.
    runtime = build_runtime(config, kubeconfig=args.kubeconfig, context=args.context, database=args.db)
    assert runtime.gateway is not None  # build_runtime connects to the cluster
    db = runtime.database.get()
    settings = EngineSettings(
        lease=LeaseSettings(namespace=args.lease_namespace, name=args.lease_name,
                            duration=dt.timedelta(seconds=args.lease_seconds)),
        max_parallel_nodes=args.max_parallel_nodes, display_zone=runtime.config.display_zone,
        people=runtime.config.names)
    try:
        # NB: the home cluster's engine (runtime.config is its view of a several-cluster
        # configuration); the other clusters' engines run in `gpuops run`.
        run_engine(settings, runtime.gateway, runtime.fleet, db, args.identity, stop,  # type: ignore[arg-type]  # a cluster's: a watch cache
                   on_commit=_crash_hook(db), exit_when_idle=args.exit_when_idle,
                   pools=runtime.config.pools if args.config else None, cluster=runtime.config.cluster_name,
                   health=runtime.config.signals.health_queries() if runtime.config.signals is not None else None,
                   signals=runtime.signals)
    finally:
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
