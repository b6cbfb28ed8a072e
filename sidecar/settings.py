"""Validated sidecar settings: the one source of the sidecar's command line and environment.

Policy defaults come from the ``core`` configs (``BudgeterConfig`` for mode, bands, session cap,
latency limit and output budget; ``RegimeConfig`` for the thin-reuse thresholds; ``WarmthConfig``
and ``CompactionPolicy`` for the compaction gate), never restated here.

Every command-line flag is derived from a field of `Settings` that carries ``flag`` metadata
(`build_parser`), so no flag exists in only one place. A flag's default can also come from the
environment as ``PREFIXOPS_SIDECAR_<FIELD>`` (for example ``PREFIXOPS_SIDECAR_ENGINE``,
``PREFIXOPS_SIDECAR_MAX_HOLD_S``); tokens come from the environment only:
``PREFIXOPS_OPERATOR_TOKEN``, ``PREFIXOPS_VIEWER_TOKEN`` and ``PREFIXOPS_CLIENT_TOKEN``.
"""

from __future__ import annotations

import argparse
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from core.budgeter import CONTROLS, BudgeterConfig
from core.compaction import CompactionPolicy, WarmthConfig
from core.reuse import RegimeConfig

ENV_PREFIX = "PREFIXOPS_SIDECAR_"
TOKEN_ENV = {
    "operator_token": "PREFIXOPS_OPERATOR_TOKEN",
    "viewer_token": "PREFIXOPS_VIEWER_TOKEN",
    "client_token": "PREFIXOPS_CLIENT_TOKEN",
}
DEFAULT_ALLOWED_HOSTS = ("127.0.0.1", "localhost", "[::1]")

_BUDGETER = BudgeterConfig()
_REGIME = RegimeConfig()
_WARMTH = WarmthConfig()
_POLICY = CompactionPolicy()


class SettingsError(ValueError):
    """A sidecar setting is invalid; the message names the flag and the value."""


def flag(name: str, help: str = "", *, choices: Sequence[str] | None = None) -> dict[str, Any]:
    return {"flag": name, "help": help, "choices": tuple(choices) if choices else None}


def _f(default: Any, name: str, help: str = "", *, choices: Sequence[str] | None = None) -> Any:
    return field(default=default, metadata=flag(name, help, choices=choices))


@dataclass(frozen=True)
class Settings:
    engine: str = _f("http://127.0.0.1:8000", "--engine", "engine base URL (vLLM, SGLang or the simulator)")
    host: str = _f("127.0.0.1", "--host", "bind address")
    port: int = _f(8100, "--port", "port to listen on")
    state_db: str = _f("data/sidecar.db", "--state-db", "SQLite state database")
    pool_tokens: int | None = _f(None, "--pool-tokens", "KV pool size in tokens (overrides the engine's)")
    max_hold_s: float = _f(600.0, "--max-hold", "seconds a held turn waits before 503")
    window_s: float = _f(60.0, "--window-s", "reuse time window in seconds")
    last_n: int = _f(200, "--last-n", "turns in the last-N reuse window")
    idle_timeout_s: float = _f(600.0, "--idle-timeout", "seconds before an idle session ends")
    mode: str = _f(
        _BUDGETER.mode, "--mode", "initial control mode (operator changes persist and win)", choices=CONTROLS
    )
    low: float = _f(_BUDGETER.low, "--low", "initial low band (fraction of the pool)")
    high: float = _f(_BUDGETER.high, "--high", "initial high band (fraction of the pool)")
    session_cap: int = _f(_BUDGETER.session_cap, "--session-cap", "admitted sessions in session-cap-park")
    latency_limit_s: float = _f(_BUDGETER.latency_limit_s, "--latency-limit", "seconds, for latency-park")
    default_output_budget: int = _f(
        _BUDGETER.default_output_budget,
        "--default-output-budget",
        "output tokens assumed when a request sets no max_tokens",
    )
    regime_enter: float = _f(_REGIME.enter, "--regime-enter", "thin reuse is entered when D >= this")
    regime_exit: float = _f(_REGIME.exit, "--regime-exit", "thin reuse is left when D < this")
    regime_min_turns: int = _f(
        _REGIME.min_turns, "--regime-min-turns", "known turns needed to judge the regime"
    )
    warmth_window_s: float = _f(
        _WARMTH.window_s, "--warmth-window", "seconds of hits that keep a subtree warm"
    )
    warmth_floor: int = _f(
        _WARMTH.floor, "--warmth-floor", "hits in the warmth window that make a subtree warm"
    )
    top_k_pinned: int = _f(
        _POLICY.top_k_pinned, "--top-k-pinned", "hottest subtrees kept under storage pressure"
    )
    turns_retention_s: float = _f(
        86400.0, "--turns-retention", "seconds of turn trace (GET /turns) kept in the state store"
    )
    max_body_bytes: int = _f(16 * 1024 * 1024, "--max-body-bytes", "largest proxied request body")
    control_body_bytes: int = 64 * 1024
    pool_refresh_s: float = _f(60.0, "--pool-refresh", "seconds between reads of the engine's pool size")
    tick_s: float = 0.5
    persist_every_s: float = 1.0
    engine_timeout_s: float = _f(600.0, "--engine-timeout", "seconds the engine may take to answer")
    engine_connect_timeout_s: float = 5.0
    read_timeout_s: float = _f(
        30.0, "--read-timeout", "seconds a client may take to send its request (head and body)"
    )
    max_sessions: int = _f(
        100_000,
        "--max-sessions",
        "sessions tracked at most; beyond it the oldest idle one is ended (reason evicted)",
    )
    allowed_hosts: tuple[str, ...] = _f(
        (),
        "--allowed-hosts",
        "comma-separated Host names answered (default: 127.0.0.1, localhost, "
        "[::1] and the bind host; '*' allows any); others get 421",
    )
    chars_per_token: float = 4.0
    ended_keep: int = 1000
    engine_transport: str = _f(
        "fast",
        "--engine-transport",
        "httpx transport to the engine: the sidecar's lean keep-alive pool, or httpx's default",
        choices=("fast", "httpcore"),
    )
    log_level: str = _f("info", "--log-level", "log level: debug, info, warning or error")
    access_log: bool = _f(False, "--access-log", "log every request (costs throughput)")
    loop: str = _f("auto", "--loop", "uvicorn event loop", choices=("auto", "asyncio", "uvloop"))
    http: str = _f("auto", "--http", "uvicorn HTTP parser", choices=("auto", "h11", "httptools"))
    operator_token: str | None = None
    viewer_token: str | None = None
    client_token: str | None = None

    def __post_init__(self) -> None:
        if not self.engine.startswith(("http://", "https://")):
            raise SettingsError(f"--engine must be an http(s) URL, got {self.engine!r}")
        for name in ("engine_transport", "mode", "loop", "http"):
            choices = _meta(name)["choices"]
            if getattr(self, name) not in choices:
                raise SettingsError(
                    f"{_meta(name)['flag']} must be one of {', '.join(choices)}, got {getattr(self, name)!r}"
                )
        if self.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise SettingsError(f"--log-level must be debug, info, warning or error, got {self.log_level!r}")
        positive = (
            "max_hold_s",
            "window_s",
            "idle_timeout_s",
            "warmth_window_s",
            "pool_refresh_s",
            "tick_s",
            "persist_every_s",
            "engine_timeout_s",
            "engine_connect_timeout_s",
            "chars_per_token",
            "latency_limit_s",
            "read_timeout_s",
            "turns_retention_s",
        )
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise SettingsError(f"{name} must be a finite number > 0, got {value!r}")
        for name in (
            "last_n",
            "regime_min_turns",
            "warmth_floor",
            "max_body_bytes",
            "control_body_bytes",
            "ended_keep",
            "session_cap",
            "max_sessions",
        ):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.top_k_pinned < 0 or self.default_output_budget < 0:
            raise SettingsError("top_k_pinned and default_output_budget must be >= 0")
        if self.pool_tokens is not None and self.pool_tokens < 1:
            raise SettingsError(
                f"--pool-tokens must be a positive number of tokens, got {self.pool_tokens!r}"
            )
        for name in ("operator_token", "client_token"):
            token = getattr(self, name)
            if token is not None and len(token) < 8:
                raise SettingsError(f"{TOKEN_ENV[name]} must be at least 8 characters")
        for host in self.allowed_hosts:
            if not host or any(c.isspace() for c in host):
                raise SettingsError(f"--allowed-hosts entries must be host names, got {host!r}")

    def hosts(self) -> frozenset[str]:
        """Host header values answered (lower case, without port); empty = any."""
        if "*" in self.allowed_hosts:
            return frozenset()
        bind = self.host if ":" not in self.host or self.host.startswith("[") else f"[{self.host}]"
        chosen = self.allowed_hosts or (*DEFAULT_ALLOWED_HOSTS, bind)
        return frozenset(h.lower() for h in chosen)


def _meta(name: str) -> Mapping[str, Any]:
    return next(f.metadata for f in fields(Settings) if f.name == name)


def _converter(hint: Any) -> Any:
    if typing.get_origin(hint) is tuple:
        return lambda text: tuple(p.strip() for p in text.split(",") if p.strip())
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    if base in (int, float, str):
        return base
    raise TypeError(f"no command-line conversion for {hint!r}")


def build_parser(
    environ: Mapping[str, str] | None = None, prog: str = "python -m sidecar", description: str | None = None
) -> argparse.ArgumentParser:
    """The sidecar's argument parser, one flag per `Settings` field with ``flag`` metadata; defaults from
    the field, or ``PREFIXOPS_SIDECAR_<FIELD>`` in ``environ``."""
    environ = environ or {}
    hints = typing.get_type_hints(Settings)
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for f in fields(Settings):
        meta = f.metadata
        if "flag" not in meta:
            continue
        default = f.default if f.default is not MISSING else None
        env_name = ENV_PREFIX + f.name.upper()
        help_text = f"{meta['help']} (env {env_name})" if meta["help"] else f"env {env_name}"
        if hints[f.name] is bool:
            env_value = environ.get(env_name)
            if env_value is not None:
                default = env_value.strip().lower() in ("1", "true", "yes")
            parser.add_argument(
                meta["flag"], dest=f.name, action="store_true", default=default, help=help_text
            )
            continue
        convert = _converter(hints[f.name])
        if env_name in environ:
            try:
                default = convert(environ[env_name])
            except ValueError:
                raise SettingsError(
                    f"{env_name} must be a {getattr(convert, '__name__', 'value')}, got {environ[env_name]!r}"
                ) from None
        shown = ",".join(default) if isinstance(default, tuple) else default
        parser.add_argument(
            meta["flag"],
            dest=f.name,
            type=convert,
            default=default,
            choices=meta["choices"],
            help=f"{help_text} (default: {shown})",
        )
    return parser


def settings_from_args(argv: Sequence[str] | None, environ: Mapping[str, str]) -> Settings:
    """Settings from the command line and the environment (tokens from the environment only)."""
    args = build_parser(environ).parse_args(argv)
    values = vars(args)
    for name, env_name in TOKEN_ENV.items():
        values[name] = environ.get(env_name) or None
    return Settings(**values)


def flags_table() -> str:
    """docs/sidecar-flags.md: one row per flag, generated from `Settings` (a test checks it is current)."""
    rows = [
        "# Sidecar flags",
        "",
        "Generated from `sidecar.settings.Settings` by `python -m sidecar.settings > docs/sidecar-flags.md`;",
        "a test fails when this file drifts. Each flag's default may also come from the environment",
        "variable shown. Tokens are read from the environment only: "
        + ", ".join(f"`{v}`" for v in TOKEN_ENV.values())
        + ".",
        "",
        "| flag | setting | environment | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for f in fields(Settings):
        if "flag" not in f.metadata:
            continue
        default = f.default
        shown = ",".join(default) if isinstance(default, tuple) else default
        choices = f.metadata["choices"]
        meaning = f.metadata["help"] + (f" (one of: {', '.join(choices)})" if choices else "")
        rows.append(
            f"| `{f.metadata['flag']}` | `{f.name}` | `{ENV_PREFIX}{f.name.upper()}` | `{shown}` | "
            f"{meaning.replace('|', '/')} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(flags_table(), end="")
