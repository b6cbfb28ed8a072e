"""``python -m sidecar --engine http://127.0.0.1:8000 --port 8100``.

Every flag comes from a field of ``sidecar.settings.Settings``; see ``--help`` or docs/sidecar-flags.md.
"""

from __future__ import annotations

import logging
import os
import resource
import sys

from .settings import Settings, SettingsError, build_parser, settings_from_args

log = logging.getLogger("sidecar")


def parse_settings(argv: list[str] | None = None) -> Settings:
    return settings_from_args(argv, os.environ)


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
    try:
        settings = parse_settings(argv)
    except (SettingsError, ValueError) as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    raise_fd_limit()
    from .app import create_app
    from .server import protocol_for, serve

    try:
        protocol = protocol_for(settings)
        app = create_app(settings, body_deadline=protocol is None)
    except Exception as exc:  # e.g. an unreadable state db path: one line, no traceback
        print(f"sidecar: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    log.info(
        "sidecar for %s on http://%s:%d (state db %s)",
        settings.engine,
        settings.host,
        settings.port,
        settings.state_db,
    )
    serve(app, settings, protocol)
    return 0


__all__ = ["build_parser", "main", "parse_settings"]

if __name__ == "__main__":
    sys.exit(main())
