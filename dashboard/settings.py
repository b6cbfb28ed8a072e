"""Server-side settings of the dashboard, read from environment variables.

Optional settings come from the environment, not `st.secrets`: with no secrets
file `st.secrets.get(key, default)` raises instead of returning the default.
Nothing here is ever rendered: operator tokens stay on the server. Operator
accounts live in the database (`python -m dashboard accounts ...`). The D threshold drawn on charts is the regime's own (`core.reuse.DEFAULT_REGIME.enter`, or the
sidecar's `regime_enter`), not a setting: one source for every policy default.

| variable | default | meaning |
|---|---|---|
| PREFIXOPS_DATABASE_URL | sqlite:///data/prefixops.db | database the collectors write (`DATABASE_URL` still read when unset) |
| PREFIXOPS_REFRESH_SECONDS | 2 | live panels' refresh interval (also the cache ttl); slower while a page draws slower (`dashboard.live`) |
| PREFIXOPS_STALE_SECONDS | 10 | a target whose last good scrape is older is shown stale |
| PREFIXOPS_HEARTBEAT_STALE_SECONDS | 15 | the collectors' heartbeat older than this: collectors down |
| PREFIXOPS_CACHED_TOKEN_PRICE | 0.1 | price of a cached prompt token relative to an uncached one |
| PREFIXOPS_OPERATOR_ALLOWLIST | (empty) | comma-separated OIDC identities (email or sub) allowed to act |
| PREFIXOPS_OPERATOR_TOKEN | (unset) | operator bearer token for every sidecar |
| PREFIXOPS_CONFIG | (unset) | the fleet TOML (`collectors.config`); `[[sidecars]]` entries may carry `operator_token` |
| PREFIXOPS_CONTROL_TIMEOUT | 5 | seconds to wait for a sidecar's control API |
| PREFIXOPS_FIT | (unset) | `simulator fit` files (a file, a directory of `*.json`, or several joined by `:`): the Budgeter forecast's cost model for the engine each names |
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.environment import setting
from core.reuse import DEFAULT_REGIME
from db import DEFAULT_DATABASE_URL

logger = logging.getLogger(__name__)


class SettingsError(ValueError):
    """An environment variable holds a value the dashboard cannot use."""


def _float(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from exc
    if value < minimum:
        raise SettingsError(f"{name} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    refresh_seconds: float = 2.0
    stale_after_seconds: float = 10.0
    heartbeat_stale_seconds: float = 15.0
    divergence_threshold: float = DEFAULT_REGIME.enter
    cached_token_price: float = 0.1
    operator_allowlist: frozenset[str] = frozenset()
    default_operator_token: str | None = field(default=None, repr=False)
    config_path: str | None = None
    control_timeout: float = 5.0
    fit_path: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        allow = frozenset(
            item.strip().lower()
            for item in env.get("PREFIXOPS_OPERATOR_ALLOWLIST", "").split(",")
            if item.strip()
        )
        return cls(
            database_url=setting(env, "DATABASE_URL") or DEFAULT_DATABASE_URL,
            refresh_seconds=_float(env, "PREFIXOPS_REFRESH_SECONDS", 2.0, minimum=0.5),
            stale_after_seconds=_float(env, "PREFIXOPS_STALE_SECONDS", 10.0, minimum=1.0),
            heartbeat_stale_seconds=_float(env, "PREFIXOPS_HEARTBEAT_STALE_SECONDS", 15.0, minimum=1.0),
            cached_token_price=_float(env, "PREFIXOPS_CACHED_TOKEN_PRICE", 0.1),
            operator_allowlist=allow,
            default_operator_token=env.get("PREFIXOPS_OPERATOR_TOKEN") or None,
            config_path=env.get("PREFIXOPS_CONFIG") or None,
            control_timeout=_float(env, "PREFIXOPS_CONTROL_TIMEOUT", 5.0, minimum=0.1),
            fit_path=env.get("PREFIXOPS_FIT") or None,
        )


def settings() -> Settings:
    """The settings in force for this script run (environment read each run; cheap)."""
    return Settings.from_env()
