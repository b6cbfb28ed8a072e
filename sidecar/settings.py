"""Validated sidecar settings (command line and environment)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.budgeter import CONTROLS


class SettingsError(ValueError):
    """A sidecar setting is invalid; the message names the flag and the value."""


@dataclass(frozen=True)
class Settings:
    engine: str = "http://127.0.0.1:8000"
    host: str = "127.0.0.1"
    port: int = 8100
    state_db: str = "data/sidecar.db"
    pool_tokens: int | None = None
    max_hold_s: float = 600.0
    window_s: float = 60.0
    last_n: int = 200
    idle_timeout_s: float = 600.0
    mode: str = "budgeter-park"
    low: float = 0.75
    high: float = 0.95
    session_cap: int = 12
    latency_limit_s: float = 10.0
    default_output_budget: int = 1024
    regime_enter: float = 0.5
    regime_exit: float = 0.4
    regime_min_turns: int = 20
    warmth_window_s: float = 120.0
    warmth_floor: int = 3
    top_k_pinned: int = 3
    max_body_bytes: int = 16 * 1024 * 1024
    control_body_bytes: int = 64 * 1024
    pool_refresh_s: float = 60.0
    tick_s: float = 0.5
    persist_every_s: float = 1.0
    engine_timeout_s: float = 600.0
    engine_connect_timeout_s: float = 5.0
    chars_per_token: float = 4.0
    ended_keep: int = 1000
    engine_transport: str = "fast"
    operator_token: str | None = None
    viewer_token: str | None = None

    def __post_init__(self) -> None:
        if not self.engine.startswith(("http://", "https://")):
            raise SettingsError(f"--engine must be an http(s) URL, got {self.engine!r}")
        if self.engine_transport not in ("fast", "httpcore"):
            raise SettingsError(f"--engine-transport must be fast or httpcore, got {self.engine_transport!r}")
        if self.mode not in CONTROLS:
            raise SettingsError(f"--mode must be one of {', '.join(CONTROLS)}, got {self.mode!r}")
        positive = ("max_hold_s", "window_s", "idle_timeout_s", "warmth_window_s", "pool_refresh_s", "tick_s",
                    "persist_every_s", "engine_timeout_s", "engine_connect_timeout_s", "chars_per_token",
                    "latency_limit_s")
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise SettingsError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("last_n", "regime_min_turns", "warmth_floor", "max_body_bytes", "control_body_bytes",
                     "ended_keep", "session_cap"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.top_k_pinned < 0 or self.default_output_budget < 0:
            raise SettingsError("top_k_pinned and default_output_budget must be >= 0")
        if self.pool_tokens is not None and self.pool_tokens < 1:
            raise SettingsError(f"--pool-tokens must be a positive number of tokens, got {self.pool_tokens!r}")
        if self.operator_token is not None and len(self.operator_token) < 8:
            raise SettingsError("PREFIXOPS_OPERATOR_TOKEN must be at least 8 characters")
