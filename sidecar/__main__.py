"""``python -m sidecar --engine http://127.0.0.1:8000 --port 8100``."""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys

import uvicorn

from .settings import Settings, SettingsError

log = logging.getLogger("sidecar")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Settings()
    p = argparse.ArgumentParser(prog="python -m sidecar", description=__doc__)
    p.add_argument("--engine", default=d.engine, help="engine base URL (vLLM, SGLang or the simulator)")
    p.add_argument("--host", default=d.host, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--state-db", default=d.state_db, help="SQLite state database (default data/sidecar.db)")
    p.add_argument("--pool-tokens", type=int, default=None, help="KV pool size in tokens (overrides the engine's)")
    p.add_argument("--max-hold", type=float, default=d.max_hold_s, help="seconds a held turn waits before 503")
    p.add_argument("--window-s", type=float, default=d.window_s, help="reuse time window in seconds")
    p.add_argument("--last-n", type=int, default=d.last_n, help="turns in the last-N reuse window")
    p.add_argument("--idle-timeout", type=float, default=d.idle_timeout_s, help="seconds before an idle session ends")
    p.add_argument("--mode", default=d.mode, help="initial control mode (operator changes persist and win)")
    p.add_argument("--low", type=float, default=d.low, help="initial low band")
    p.add_argument("--high", type=float, default=d.high, help="initial high band")
    p.add_argument("--session-cap", type=int, default=d.session_cap)
    p.add_argument("--latency-limit", type=float, default=d.latency_limit_s)
    p.add_argument("--default-output-budget", type=int, default=d.default_output_budget)
    p.add_argument("--regime-enter", type=float, default=d.regime_enter)
    p.add_argument("--regime-exit", type=float, default=d.regime_exit)
    p.add_argument("--regime-min-turns", type=int, default=d.regime_min_turns)
    p.add_argument("--warmth-window", type=float, default=d.warmth_window_s)
    p.add_argument("--warmth-floor", type=int, default=d.warmth_floor)
    p.add_argument("--top-k-pinned", type=int, default=d.top_k_pinned)
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--engine-timeout", type=float, default=d.engine_timeout_s)
    p.add_argument("--engine-transport", default=d.engine_transport, choices=["fast", "httpcore"],
                   help="httpx transport to the engine: the sidecar's lean keep-alive pool, or httpx's default")
    p.add_argument("--pool-refresh", type=float, default=d.pool_refresh_s)
    p.add_argument("--log-level", default="info")
    p.add_argument("--access-log", action="store_true", help="log every request (costs throughput)")
    p.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"], help="uvicorn event loop")
    p.add_argument("--http", default="auto", choices=["auto", "h11", "httptools"], help="uvicorn HTTP parser")
    return p.parse_args(argv)


def raise_fd_limit() -> None:
    """Each held request keeps a client connection open: allow as many as the hard limit permits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", soft, exc)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        settings = Settings(
            engine=args.engine, host=args.host, port=args.port, state_db=args.state_db,
            pool_tokens=args.pool_tokens, max_hold_s=args.max_hold, window_s=args.window_s, last_n=args.last_n,
            idle_timeout_s=args.idle_timeout, mode=args.mode, low=args.low, high=args.high,
            session_cap=args.session_cap, latency_limit_s=args.latency_limit,
            default_output_budget=args.default_output_budget, regime_enter=args.regime_enter,
            regime_exit=args.regime_exit, regime_min_turns=args.regime_min_turns,
            warmth_window_s=args.warmth_window, warmth_floor=args.warmth_floor, top_k_pinned=args.top_k_pinned,
            max_body_bytes=args.max_body_bytes, engine_timeout_s=args.engine_timeout,
            pool_refresh_s=args.pool_refresh, engine_transport=args.engine_transport,
            operator_token=os.environ.get("PREFIXOPS_OPERATOR_TOKEN") or None,
            viewer_token=os.environ.get("PREFIXOPS_VIEWER_TOKEN") or None,
        )
    except (SettingsError, ValueError) as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return 2
    raise_fd_limit()
    from .app import create_app

    try:
        app = create_app(settings)
    except Exception as exc:  # e.g. an unreadable state db path: one line, no traceback
        print(f"sidecar: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    log.info("sidecar for %s on http://%s:%d (state db %s)", settings.engine, settings.host, settings.port,
             settings.state_db)
    uvicorn.run(app, host=settings.host, port=settings.port, workers=1, log_level=args.log_level.lower(),
                access_log=args.access_log, timeout_graceful_shutdown=5, backlog=4096, timeout_keep_alive=75, loop=args.loop, http=args.http)
    return 0


if __name__ == "__main__":
    sys.exit(main())
