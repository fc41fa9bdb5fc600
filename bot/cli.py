"""The `gpuops` command line.

    gpuops run [--http]               the Slack bot (Socket Mode by default); the replica
                                      holding the engine Lease also runs the engine, the
                                      scheduler, the notifier and the Events sender
                                      ($POD_NAME names it)
    gpuops console --as U0ALICE       the bot's logic in a terminal
    gpuops status|node|findings       one command, printed, from the cluster
    gpuops upgrade POOL to VERSION [--also POOL,...] --dry-run
                                      the plan /gpu upgrade would ask approval for (nothing is
                                      stored; whoever may read the fleet: cli_roles)
    gpuops audit verify|export        check or export the hash-chained audit log
    gpuops database copy SQLITE_PATH [postgresql://...]
                                      copy every row into an empty database (default target:
                                      $GPUOPS_DATABASE_URL or _FILE), the audit head kept
    gpuops config check|schema        check a configuration file, or print its JSON Schema

Options shared by all: --config (or $GPUOPS_CONFIG), --kubeconfig/--context (else
$KUBECONFIG, ~/.kube/config, or in-cluster), --database (else the configuration's
`database` or `database_url_file`, else the default path; a PostgreSQL URL with its
password comes from $GPUOPS_DATABASE_URL or the file $GPUOPS_DATABASE_URL_FILE names,
never from the command line). Slack secrets come only from the environment
(SLACK_BOT_TOKEN, SLACK_APP_TOKEN, SLACK_SIGNING_SECRET, or the same names with _FILE).
SLACK_API_URL points the bot at another Web API (a local fake Slack for demos and tests).

Exit codes: 0 done, 1 the command failed (or the audit log is broken), 2 bad
configuration, credentials or database, 3 the Kubernetes API could not be used, 4 Slack
could not be used.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from bot import messages as msg
from bot.credentials import CredentialsError, Mode, load_credentials
from bot.health import DEFAULT_METRICS_PORT
from bot.health import DEFAULT_PORT as DEFAULT_HEALTH_PORT
from bot.health import HealthServer, MetricsServer, Readiness
from bot.logs import RedactSecrets, configure_logging, protect
from bot.metrics import Metrics
from bot.render_text import render_text
from bot.wiring import DATABASE_URL, Runtime, build_runtime, count_api_calls, database_target, replica_identity
from commands.catalog import dispatch_words
from commands.registry import Call
from commands.upgrade import preview_upgrade
from commands.reply import Reply
from commands.services import Services
from storage import audit
from storage.copying import CopyRefused, copy_database
from storage.database import open_database
from storage.errors import StorageError
from storage.locations import DatabaseLocation, database_location
from workflows.access import Actor
from workflows.config import ConfigError, GpuopsConfig, config_json_schema, load_config
from workflows.fleet.watchcache import FleetCache
from workflows.kube.errors import KubeError

log = logging.getLogger("gpuops.bot.cli")

EXIT_FAILED, EXIT_CONFIG, EXIT_KUBE, EXIT_SLACK = 1, 2, 3, 4


def _database(args: argparse.Namespace, config: GpuopsConfig) -> DatabaseLocation:
    """Where the database is (bot.wiring.database_target); its password, if any, is kept
    to be blanked out of any error printed (`_without_secrets`)."""
    location = database_target(config, args.database)
    args.secrets = (*getattr(args, "secrets", ()), *location.secrets)
    return location


def _without_secrets(args: argparse.Namespace, text: str) -> str:
    return RedactSecrets(getattr(args, "secrets", ())).redact(text)


def _runtime(args: argparse.Namespace, config: GpuopsConfig, *, watch: bool) -> Runtime:
    return build_runtime(config, kubeconfig=args.kubeconfig, context=args.context,
                         database=_database(args, config).target, watch=watch)


# ------------------------------------------------------------------ one-shot commands


def _cli_actor(config: GpuopsConfig) -> Actor:
    user = getpass.getuser()
    actor = config.actor(f"cli:{user}", via="cli", name=user)
    return Actor(user_id=actor.user_id, name=actor.name, roles=frozenset(config.access.cli_roles),
                 pool_roles=actor.pool_roles, via="cli")


def one_command(words: list[str], *, actor: Actor, services: Services, now: dt.datetime) -> Reply:
    """The reply to a one-shot command: argv's words go to the dispatcher each as it is
    (as a typed line's words once split), never joined into a line and split again, so a
    quote or a space in a word is that word's."""
    return dispatch_words(words, actor=actor, services=services, now=now)


def _one_command(args: argparse.Namespace, words: list[str]) -> int:
    config = load_config(args.config)
    runtime = _runtime(args, config, watch=False)
    try:
        reply = one_command(words, actor=_cli_actor(config), services=runtime.services(),
                            now=dt.datetime.now(dt.timezone.utc))
    finally:
        runtime.close()
    print(render_text(reply), end="")
    return 0 if reply.ok else EXIT_FAILED


def _upgrade_preview(args: argparse.Namespace, words: list[str]) -> int:
    """`gpuops upgrade ... --dry-run`: the preview, for the command line's reader role."""
    config = load_config(args.config)
    runtime = _runtime(args, config, watch=False)
    try:
        now = dt.datetime.now(dt.timezone.utc)
        reply = preview_upgrade(Call(actor=_cli_actor(config), now=now, services=runtime.services()), words)
    finally:
        runtime.close()
    print(render_text(reply), end="")
    return 0 if reply.ok else EXIT_FAILED


# ------------------------------------------------------------------ run


def _stop_event() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info(msg.stopping())
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    return stop


# How long stopping waits for the Socket Mode connection to close (of Kubernetes' 30 s grace).
SOCKET_CLOSE_WAIT = dt.timedelta(seconds=10)


def _within(work: Callable[[], object], limit: dt.timedelta) -> bool:
    """Run `work` on a daemon thread; whether it ended within `limit` (else it is left behind)."""
    thread = threading.Thread(target=work, name="gpuops-closing", daemon=True)
    thread.start()
    thread.join(timeout=limit.total_seconds())
    return not thread.is_alive()


def _run(args: argparse.Namespace) -> int:
    from slack_bolt.adapter.socket_mode import SocketModeHandler

    from bot.http_server import SlackHttpServer
    from bot.slack_api import web_client
    from bot.slack_app import SlackRejectedToken, build_app

    mode: Mode = "http" if args.http else "socket"
    try:
        credentials = load_credentials(mode)
    except CredentialsError as err:
        print(f"gpuops run: {err}", file=sys.stderr)
        return EXIT_CONFIG
    protect(credentials.secrets())
    client = web_client(credentials.bot_token, base_url=os.environ.get("SLACK_API_URL") or None)
    try:
        client.auth_test()  # before the cluster is listed: a wrong token fails in a second
    except Exception as err:  # noqa: BLE001 - say what, without a stack trace
        response = getattr(err, "response", None)
        if response is not None and hasattr(response, "get"):
            print(f"gpuops run: {msg.slack_rejected_token(str(response.get('error')))}", file=sys.stderr)
            return EXIT_CONFIG
        print(f"gpuops run: {msg.slack_unreachable(type(err).__name__ + ': ' + str(err))}", file=sys.stderr)
        return EXIT_SLACK
    config = load_config(args.config)
    # Counted from the first call, the fleet's first list included.
    metrics = Metrics()
    count_api_calls(metrics)
    runtime = _runtime(args, config, watch=True)
    try:
        try:
            app, slack_bot = build_app(runtime, client=client,
                                       signing_secret=credentials.signing_secret if mode == "http" else None)
        except SlackRejectedToken as err:
            print(f"gpuops run: {err}", file=sys.stderr)
            return EXIT_CONFIG
        # Before a delivery is acknowledged: this replica beats, and answers what a silent one
        # acknowledged and never answered (bot.heartbeat).
        runtime.start_heartbeat(redo=slack_bot.redo)
        stop = _stop_event()
        # Published in the log as well as in each handover post (`audit verify --expected`).
        log.info(msg.audit_head_log(audit.head_of(runtime.database.get()).text))
        # Every replica answers Slack; the one holding the engine Lease also runs the
        # engine, the scheduler, the notifier and the Events sender (stopped by runtime.close()).
        try:
            health = _serve_health(runtime, metrics, health_port=args.health_port, metrics_port=args.metrics_port)
        except _PortUnavailable as err:
            print(f"gpuops run: {err}", file=sys.stderr)
            return EXIT_CONFIG
        runtime.start_background(replica_identity(), slack=client)
        if mode == "socket":
            handler = SocketModeHandler(app, credentials.app_token)
            handler.connect()
            log.info(msg.started("Socket Mode", "no inbound port"))
            stop.wait()
            # slack_sdk's close() joins its receiving thread, which a dropped socket can
            # leave blocked in a read for good: past a bound, stop anyway, so the Lease is
            # given back (runtime.close) before the pod's grace period runs out.
            if not _within(handler.close, SOCKET_CLOSE_WAIT):
                log.warning(msg.socket_close_stalled_log(SOCKET_CLOSE_WAIT.total_seconds()))
        else:
            server = SlackHttpServer(app, signing_secret=str(credentials.signing_secret), host=args.host,
                                     port=args.port).start()
            log.info(msg.started("HTTP", server.url))
            stop.wait()
            server.stop()
        for health_server in health:
            health_server.stop()
    finally:
        runtime.close()
    return 0


class _PortUnavailable(Exception):
    pass


def _serve_health(runtime: Runtime, metrics: Metrics, *, health_port: int,
                  metrics_port: int) -> tuple[HealthServer, MetricsServer]:
    """/healthz and /readyz on `health_port`, /metrics on `metrics_port`, each its own
    server (bot.health), reading the runtime's state."""
    cache = runtime.fleet if isinstance(runtime.fleet, FleetCache) else None
    metrics.sources.database, metrics.sources.fleet, metrics.sources.leader = (runtime.database.get, cache,
                                                                               runtime.leading)
    others = None
    if runtime.clusters is not None:  # several clusters: each one's metrics, the others' lines in /readyz
        metrics.sources.clusters = runtime.clusters.sources  # type: ignore[assignment]  # both kinds have a cache
        others = {name: c for name, c in runtime.clusters.sources.items() if name != runtime.clusters.home}
    readiness = Readiness(database=runtime.database.get, cache=cache, leader=runtime.leading, others=others,
                          reach=runtime.database_probe.check if runtime.database_probe else None)
    try:
        probes = HealthServer(readiness, port=health_port)
    except OSError as err:  # the port is taken, or not ours to bind
        raise _PortUnavailable(msg.health_port_unavailable(health_port, str(err))) from None
    try:
        scrapes = MetricsServer(metrics, port=metrics_port)
    except OSError as err:
        probes.stop()
        raise _PortUnavailable(msg.metrics_port_unavailable(metrics_port, str(err))) from None
    probes.start(), scrapes.start()
    log.info(msg.health_serving(probes.base_url, scrapes.base_url))
    return probes, scrapes


# ------------------------------------------------------------------ console


def _console(args: argparse.Namespace) -> int:
    from bot.console import Console, run_console, terminal_reader

    config = load_config(args.config)
    runtime = _runtime(args, config, watch=True)
    try:
        # The console runs the engine and the scheduler too (never the Slack notifier), so
        # an approved run really executes, but only while it holds the engine's Lease: with
        # a gpuops already running against this cluster, that one keeps acting.
        runtime.start_background(f"console-{replica_identity()}", slack=None)
        if sys.stdin.isatty():
            return Console(runtime, out=sys.stdout, as_user=args.as_user, read=terminal_reader()).run()
        return run_console(sys.stdin, runtime=runtime, out=sys.stdout, as_user=args.as_user, echo=True)
    finally:
        runtime.close()


# ------------------------------------------------------------------ audit


def _audit(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    location = _database(args, config)
    if location.dialect == "sqlite" and not Path(location.target).is_file():
        print(f"gpuops audit: {msg.no_database(location.shown)}", file=sys.stderr)
        return EXIT_CONFIG
    expected = None
    if args.audit_command == "verify" and args.expected is not None:
        try:
            expected = audit.parse_head(args.expected)
        except audit.BadHead as err:
            print(f"gpuops audit verify: --expected: {err}", file=sys.stderr)
            return EXIT_CONFIG
    db = open_database(location.target)
    try:
        if args.audit_command == "verify":
            result = audit.verify(db, expected=expected)
            if result.ok:
                print(msg.audit_intact(result.checked, head=audit.head_of(db).text,
                                       expected=expected.text if expected else None))
                return 0
            print(msg.audit_broken(result.checked, result.first_bad_seq, result.problem or "unknown"))
            return EXIT_FAILED
        if args.output:
            output = Path(args.output)
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as stream:
                count = audit.export_jsonl(db, stream)
            print(msg.audit_exported(count, str(output)), file=sys.stderr)
        else:
            count = audit.export_jsonl(db, sys.stdout)
            print(msg.audit_exported(count, "standard output"), file=sys.stderr)
        return 0
    finally:
        db.close()


# ------------------------------------------------------------------ database


def _database_copy(args: argparse.Namespace) -> int:
    """`gpuops database copy SOURCE [TARGET]`: storage.copying, said in a few lines."""
    source = database_location(args.source)
    if source.dialect != "sqlite":
        print(f"gpuops database copy: {msg.copy_source_not_sqlite(source.shown)}", file=sys.stderr)
        return EXIT_CONFIG
    if args.target:
        target = database_location(args.target)
        if target.has_password:
            print(f"gpuops database copy: {msg.database_password_on_command_line(target.shown, DATABASE_URL)}",
                  file=sys.stderr)
            return EXIT_CONFIG
    else:
        target = _database(args, load_config(args.config))
    args.secrets = (*getattr(args, "secrets", ()), *target.secrets)
    try:
        result = copy_database(source, target)
    except CopyRefused as err:
        print(f"gpuops database copy: {_without_secrets(args, str(err))}", file=sys.stderr)
        return EXIT_FAILED
    for table, rows in result.rows.items():
        print(msg.copy_table_done(table, rows))
    print(msg.copy_done(source.shown, target.shown, checked=result.checked, head=result.head.text))
    return 0


# ------------------------------------------------------------------ parsing


def _common(*, suppress: bool) -> argparse.ArgumentParser:
    """Shared options, accepted before or after the subcommand."""
    default = argparse.SUPPRESS if suppress else None
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=default, help="gpuops configuration file (YAML); default: $GPUOPS_CONFIG")
    common.add_argument("--kubeconfig", default=default,
                        help="kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    common.add_argument("--context", default=default, help="kubeconfig context (default: the current one)")
    common.add_argument("--database", default=default,
                        help="the gpuops database: a SQLite file or a postgresql:// URL without its password "
                             "(default: $GPUOPS_DATABASE_URL or _FILE, else `database` in the configuration, "
                             "else /var/lib/gpuops/gpuops.db in a pod or ./.gpuops/gpuops.db)")
    common.add_argument("-v", "--verbose", action="store_true", default=default)
    return common


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="gpuops", description="GPU fleet operations for Kubernetes",
                                  parents=[_common(suppress=False)])
    shared = [_common(suppress=True)]
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser("status", parents=shared, help="every pool at a glance, or one pool's nodes")
    p.add_argument("pool", nargs="?")
    p = sub.add_parser("node", parents=shared, help="one GPU node in full, with the driver owner's evidence")
    p.add_argument("name")
    p = sub.add_parser("findings", parents=shared, help="every problem found, most severe first")
    p.add_argument("scope", nargs="?", help="a pool or node")
    p = sub.add_parser("upgrade", parents=shared, help="preview a pool's driver upgrade plan (--dry-run)",
                       description="Plan a pool's driver upgrade as `/gpu upgrade` would and print it; "
                                   "nothing is stored. Ask for it in Slack, where the approvers are.")
    p.add_argument("words", nargs="+", metavar="WORD", help="POOL to VERSION [at TIME | next-window] [reason]")
    p.add_argument("--downgrade", action="store_true", help="allow a version older than the pool runs")
    p.add_argument("--also", action="append", metavar="POOL[,POOL...]",
                   help="other pools the shared ClusterPolicy moves too, as /gpu upgrade --also")
    p.add_argument("--dry-run", action="store_true", help="required: the command line only previews")
    p = sub.add_parser("run", parents=shared, help="run the Slack bot (Socket Mode unless --http)",
                       description="Run the Slack bot. Socket Mode (default) needs SLACK_BOT_TOKEN and "
                                   "SLACK_APP_TOKEN; --http needs SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET "
                                   "and serves POST /slack/events. Each may instead be read from the file "
                                   "named by NAME_FILE.")
    p.add_argument("--http", action="store_true", help="HTTP mode instead of Socket Mode")
    p.add_argument("--host", default="0.0.0.0", help="HTTP mode: address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=3000, help="HTTP mode: port to listen on (default 3000)")
    p.add_argument("--health-port", type=int, default=DEFAULT_HEALTH_PORT,
                   help=f"/healthz and /readyz (the kubelet's probes), in both modes (default {DEFAULT_HEALTH_PORT})")
    p.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                   help=f"/metrics (Prometheus), in both modes (default {DEFAULT_METRICS_PORT})")
    p = sub.add_parser("console", parents=shared, help="the bot's logic in a terminal, as a given Slack user",
                       description="Type /gpu commands and read the replies as text; type a button's number "
                                   "to click it; ':as USER' switches identity. Reads a script from stdin "
                                   "when stdin is not a terminal.")
    p.add_argument("--as", dest="as_user", required=True, metavar="SLACK_USER_ID",
                   help="act as this Slack user id (roles from the configuration)")
    p = sub.add_parser("config", parents=shared, help="check a configuration file")
    config_sub = p.add_subparsers(dest="config_command", required=True)
    c = config_sub.add_parser("check", parents=shared, help="every error with file, line and column; exit 1 if any",
                              description="Read a configuration as the bot does at start and report every "
                                          "problem as file:line:column: key: reason (exit 1), or a summary "
                                          "of what it configures (exit 0). The bot refuses to start on the "
                                          "same errors.")
    c.add_argument("file", nargs="?", help="the file to check (default: --config or $GPUOPS_CONFIG)")
    config_sub.add_parser("schema", parents=shared, help="the configuration's JSON Schema, for editors",
                          description="Print the JSON Schema of the configuration file (every key with its "
                                      "type, default and meaning), for an editor's completion and checks.")
    p = sub.add_parser("audit", parents=shared, help="verify or export the audit log")
    audit_sub = p.add_subparsers(dest="audit_command", required=True)
    v = audit_sub.add_parser("verify", parents=shared, help="check every hash of the chain; exit 1 if broken")
    v.add_argument("--expected", metavar="SEQ:HASH",
                   help="a chain head gpuops published earlier (in a handover post or its log): that entry "
                        "must still be in the chain with that hash, which a rewritten database cannot fake")
    e = audit_sub.add_parser("export", parents=shared, help="every entry as JSON lines")
    e.add_argument("--output", "-o", help="file to write (default: standard output)")
    p = sub.add_parser("database", parents=shared, help="copy the database into another one")
    database_sub = p.add_subparsers(dest="database_command", required=True)
    d = database_sub.add_parser(
        "copy", parents=shared, help="copy every row into an empty database, e.g. SQLite into PostgreSQL",
        description="Copy every table of SOURCE (a gpuops SQLite file) into TARGET, which must hold no data: "
                    "rows keep their ids, the audit chain its seq and hashes, all in one transaction that "
                    "commits only if the copy's audit chain verifies with the source's head (printed). "
                    "TARGET is migrated to this gpuops's schema first.")
    d.add_argument("source", metavar="SQLITE_PATH", help="the gpuops SQLite file to copy")
    d.add_argument("target", nargs="?", metavar="TARGET",
                   help=f"a postgresql:// URL without its password (PGPASSWORD or ~/.pgpass), or a SQLite "
                        f"path (default: ${DATABASE_URL} or ${DATABASE_URL}_FILE, else the configuration's)")
    return top


def _config_check(path: str | None) -> int:
    if not path:
        print(f"gpuops config check: {msg.config_check_needs_file()}", file=sys.stderr)
        return EXIT_FAILED
    try:
        config = load_config(path)
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return EXIT_FAILED
    pools = sorted(config.pools) if not config.clusters else sorted(
        f"{cluster}/{pool}" for cluster, entry in config.clusters.items() for pool in entry.pools)
    print(msg.config_check_ok(path, pools=pools, rotations=len(config.rotations),
                              users=len(config.access.users)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.config is None:
        args.config = os.environ.get("GPUOPS_CONFIG")
    # The bot is a daemon: it logs its life at INFO; one-shot commands only warnings.
    try:
        configure_logging(verbose=bool(args.verbose) or args.command == "run")
    except ValueError as err:  # a GPUOPS_LOG_FORMAT it does not know
        print(f"gpuops: {err}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "console":
            return _console(args)
        if args.command == "audit":
            return _audit(args)
        if args.command == "database":
            return _database_copy(args)
        if args.command == "config" and args.config_command == "schema":
            print(json.dumps(config_json_schema(), indent=2))
            return 0
        if args.command == "config":
            return _config_check(args.file or args.config)
        if args.command == "upgrade":
            if not args.dry_run:
                print(f"gpuops upgrade: {msg.upgrade_only_dry_run()}", file=sys.stderr)
                return EXIT_FAILED
            return _upgrade_preview(args, [*args.words, *(["--downgrade"] if args.downgrade else []),
                                           *(["--also", ",".join(args.also)] if args.also else [])])
        words = [args.command] + [w for w in (getattr(args, "pool", None), getattr(args, "name", None),
                                              getattr(args, "scope", None)) if w]
        return _one_command(args, words)
    except ConfigError as err:
        print(f"gpuops: configuration error:\n{err}", file=sys.stderr)
        return EXIT_CONFIG
    except StorageError as err:
        print(f"gpuops: database: {_without_secrets(args, str(err))}", file=sys.stderr)
        return EXIT_CONFIG
    except KubeError as err:
        print(f"gpuops: Kubernetes API: {err}", file=sys.stderr)
        return EXIT_KUBE


if __name__ == "__main__":
    sys.exit(main())
