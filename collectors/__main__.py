"""Command line: ``python -m collectors [...]`` runs the collectors; ``python -m collectors status`` reports;
``python -m collectors export-incident`` writes an incident bundle (collectors/incident.py).

    python -m collectors [--config FILE] [--engine [NAME=]URL]... [--sidecar [NAME=]URL]... [--database-url URL]
                         [--once] [--interval S] [--log-level LEVEL]
    python -m collectors status [--json] [--database-url URL]
    python -m collectors export-rules --out DIR [--config FILE] [--runbook-base URL] [--dashboard-url URL]

Exit codes: 0 ok (also with --once when targets are down: that is data), 2 bad arguments or
configuration, 1 database unreachable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from sqlalchemy.exc import SQLAlchemyError

from collectors.config import ConfigError
from core.environment import setting

log = logging.getLogger("collectors")


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m collectors",
        description="Scrape engines and sidecars into the PrefixOps database and "
        "evaluate alerts. `python -m collectors status` reports from the database.",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        default=setting(os.environ, "CONFIG"),
        help="the fleet TOML: targets, webhooks and settings (reloaded on change; default $PREFIXOPS_CONFIG)",
    )
    p.add_argument(
        "--engine",
        metavar="[NAME=]URL",
        action="append",
        default=[],
        help="engine base URL (the collector adds /metrics), optionally with a display name: "
        "gpu-a=http://10.0.0.5:8000; repeatable",
    )
    p.add_argument(
        "--sidecar",
        metavar="[NAME=]URL",
        action="append",
        default=[],
        help="sidecar base URL (the collector adds /state, /sessions, ...), optionally NAME=URL; repeatable",
    )
    p.add_argument(
        "--database-url",
        metavar="URL",
        help="SQLAlchemy URL (default $PREFIXOPS_DATABASE_URL, else $DATABASE_URL, else "
        "sqlite:///data/prefixops.db)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="scrape every target enough times for rates, evaluate alerts, and exit",
    )
    p.add_argument(
        "--interval", type=float, metavar="S", help="default scrape interval in seconds (default 1)"
    )
    p.add_argument(
        "--log-level",
        default=setting(os.environ, "LOG_LEVEL") or "INFO",
        help="logging level (default $PREFIXOPS_LOG_LEVEL, else INFO)",
    )
    return p


def _status_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m collectors status",
        description="Latest signals, up/down and open alerts per target, from the database.",
    )
    p.add_argument(
        "--json", action="store_true", help="print a JSON list (one object per target and engine label)"
    )
    p.add_argument(
        "--database-url",
        metavar="URL",
        help="SQLAlchemy URL (default $PREFIXOPS_DATABASE_URL, else $DATABASE_URL, else "
        "sqlite:///data/prefixops.db)",
    )
    return p


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Skipped runs of a slow target are counted in the heartbeat, not logged every second.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)


def status_main(argv: list[str]) -> int:
    args = _status_parser().parse_args(argv)
    from db import database_url, make_engine, queries, sqlite_path

    url = database_url(args.database_url)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        print(
            f"no database at {path}: start `python -m collectors` first (or pass --database-url)",
            file=sys.stderr,
        )
        return 1
    from collectors.status import render_table, status_rows

    engine = make_engine(url, read_only=True)
    now = time.time()
    try:
        with engine.connect() as conn:
            rows = status_rows(conn, now=now)
            beats = queries.heartbeat(conn)
    except SQLAlchemyError as exc:
        print(
            f"cannot read the database at {engine.url.render_as_string(hide_password=True)}: "
            f"{str(exc).splitlines()[0]}",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print(render_table(rows, beats, now))
    return 0


def run_main(argv: list[str]) -> int:
    args = _run_parser().parse_args(argv)
    _setup_logging(args.log_level)
    from collectors.config import config_from_args
    from collectors.service import Collector
    from db import database_url, make_engine
    from db.migrate import upgrade

    try:
        config = config_from_args(args.config, args.engine, args.sidecar, args.interval)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not config.engines and not config.sidecars and not args.config:
        print("error: no targets: pass --config FILE or at least one --engine/--sidecar URL", file=sys.stderr)
        return 2
    url = database_url(args.database_url)
    engine = make_engine(url)
    try:
        upgrade(engine)
    except SQLAlchemyError as exc:
        print(
            f"error: cannot open or migrate the database at "
            f"{engine.url.render_as_string(hide_password=True)}: {str(exc).splitlines()[0]}",
            file=sys.stderr,
        )
        return 1
    log.info("database %s (schema at the newest revision)", engine.url.render_as_string(hide_password=True))
    collector = Collector(
        config, engine, config_path=args.config, cli_engines=args.engine, cli_sidecars=args.sidecar
    )
    if args.once:
        collector.run_once()
        up = sum(1 for h in collector.evaluator.health.values() if h.last_attempt_ok)
        log.info("--once: %d of %d target(s) up", up, len(collector.scrapers))
        return 0
    collector.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "export-rules":
        from collectors.prom_export import main as export_main

        return export_main(argv[1:])
    if argv and argv[0] == "export-incident":
        from collectors.incident import main as incident_main

        return incident_main(argv[1:])
    if argv and argv[0] == "status":
        try:
            return status_main(argv[1:])
        except BrokenPipeError:  # `... status | head`
            sys.stderr.close()
            return 0
    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
