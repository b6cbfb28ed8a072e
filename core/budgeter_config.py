"""The KV budgeter's vocabulary and validated settings (`core.budgeter` re-exports all of it).

Controls, session states, `BudgeterConfig` with its defaults (the one source the sidecar's flags,
the simulator and the alert rules take their bands from), and the errors a bad setting or an unknown
session raise. Split from `core.budgeter` so the state machine module stays one idea.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

CONTROLS: tuple[str, ...] = ("off", "admission-only", "latency-park", "session-cap-park", "budgeter-park")
ADMITTED = "admitted"
PARKED = "parked"
WAITING = "waiting"
SESSION_STATES: tuple[str, ...] = (ADMITTED, PARKED, WAITING)

Decision = Literal["forward", "hold"]


class ConfigError(ValueError):
    """A budgeter setting is invalid; the message names the field and the value, ``field`` the field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnknownSession(KeyError):
    """An operator action named a session the budgeter does not know."""

    def __str__(self) -> str:
        return f"unknown session {self.args[0]!r}"


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number, got {value!r}", name)
    result = float(value)
    if not math.isfinite(result):
        raise ConfigError(f"{name} must be a finite number, got {value!r}", name)
    return result


def _integer(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be a whole number, got {value!r}", name)
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value!r}", name)
    return value


@dataclass(frozen=True)
class BudgeterConfig:
    """Validated budgeter settings; invalid values raise ConfigError at construction."""

    mode: str = "budgeter-park"
    low: float = 0.75
    high: float = 0.95
    session_cap: int = 12
    latency_limit_s: float = 10.0
    latency_window: int = 20
    default_output_budget: int = 1024

    def __post_init__(self) -> None:
        if self.mode not in CONTROLS:
            raise ConfigError(f"mode must be one of {', '.join(CONTROLS)}; got {self.mode!r}", "mode")
        low = _number("low", self.low)
        high = _number("high", self.high)
        if not 0 < low < 1:
            raise ConfigError(f"low band must be between 0 and 1, got {self.low!r}", "low")
        if not 0 < high <= 1:
            raise ConfigError(f"high band must be above 0 and at most 1, got {self.high!r}", "high")
        if low >= high:
            raise ConfigError(f"low band must be below high band, got {self.low!r} >= {self.high!r}", "low")
        limit = _number("latency_limit_s", self.latency_limit_s)
        if limit <= 0:
            raise ConfigError(
                f"latency_limit_s must be positive, got {self.latency_limit_s!r}", "latency_limit_s"
            )
        _integer("session_cap", self.session_cap, 1)
        _integer("latency_window", self.latency_window, 1)
        _integer("default_output_budget", self.default_output_budget, 0)
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "latency_limit_s", limit)

    def replace(self, **changes: Any) -> BudgeterConfig:
        """A copy with ``changes`` applied, validated as a whole (partial updates)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ConfigError(
                f"unknown budgeter setting {unknown[0]!r}; known: {', '.join(sorted(known))}", unknown[0]
            )
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
