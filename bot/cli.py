"""The `gpuops` command line. `gpuops status|node|findings` answer the same commands
as Slack, from a kubeconfig (or the in-cluster ServiceAccount), once."""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import logging
import sys

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from workflows.config import ConfigError, GpuopsConfig, load_config
from workflows.kube import KubeError, KubeGateway
from workflows.watchcache import FleetCache


def _connect(args: argparse.Namespace, config: GpuopsConfig) -> FleetCache:
    gateway = KubeGateway.connect(kubeconfig=args.kubeconfig, context=args.context)
    return FleetCache(gateway, settings=config.inventory_settings(),
                      operator_namespace=config.cluster.operator_namespace).start(watch=False)


def _one_command(args: argparse.Namespace, words: list[str]) -> int:
    config = load_config(args.config)
    cache = _connect(args, config)
    try:
        user = getpass.getuser()
        actor = config.actor(f"cli:{user}", via="cli", name=user)
        actor = type(actor)(user_id=actor.user_id, name=actor.name, roles=frozenset(config.access.cli_roles),
                            pool_roles=actor.pool_roles, via="cli")
        reply = dispatch(" ".join(words), actor=actor, services=Services(config=config, fleet=cache),
                         now=dt.datetime.now(dt.timezone.utc))
    finally:
        cache.stop()
    print(render_text(reply), end="")
    return 0 if reply.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuops", description="GPU fleet operations for Kubernetes")
    parser.add_argument("--config", help="gpuops configuration file (YAML); default: $GPUOPS_CONFIG")
    parser.add_argument("--kubeconfig", help="kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("status", help="every pool at a glance, or one pool's nodes")
    p.add_argument("pool", nargs="?")
    p = sub.add_parser("node", help="one GPU node in full, with the driver owner's evidence")
    p.add_argument("name")
    p = sub.add_parser("findings", help="every problem found, most severe first")
    p.add_argument("scope", nargs="?", help="a pool or node")
    args = parser.parse_args(argv)
    if args.config is None:
        import os

        args.config = os.environ.get("GPUOPS_CONFIG")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    words = [args.command] + [w for w in (getattr(args, "pool", None), getattr(args, "name", None),
                                          getattr(args, "scope", None)) if w]
    try:
        return _one_command(args, words)
    except ConfigError as err:
        print(f"gpuops: configuration error:\n{err}", file=sys.stderr)
        return 2
    except KubeError as err:
        print(f"gpuops: Kubernetes API: {err}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
