"""`AlertSettings`: every threshold and duration of the alert rules, validated at construction.

Policy defaults are not restated here: the thin-reuse judgement comes from `core.reuse.RegimeConfig`
(enter 0.5, exit 0.4, 20 known turns), the high band from `core.budgeter.BudgeterConfig` (0.95) and the
collapse hit-ratio test from `core.runs` (0.3 over 5 minutes), the collapse-risk warning's thresholds and hold
times from `core.risk.RiskSettings`. The fleet TOML's ``[alerts]`` table may
override any field (`AlertSettings.from_mapping`); unknown keys and bad values are rejected with the
key and the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from core import risk, runs
from core.budgeter import BudgeterConfig
from core.reuse import DEFAULT_REGIME, RegimeConfig

_BUDGETER = BudgeterConfig()
_RISK = risk.RiskSettings()


@dataclass(frozen=True)
class AlertSettings:
    """Thresholds and durations; rejects bad values at construction."""

    down_after_failures: int = 3
    down_for_s: float = 5.0
    up_for_s: float = 5.0
    stale_after_s: float = 30.0
    thin_reuse_enter: float = DEFAULT_REGIME.enter
    thin_reuse_exit: float = DEFAULT_REGIME.exit
    thin_reuse_min_turns: int = DEFAULT_REGIME.min_turns
    thin_reuse_for_s: float = 30.0
    thin_reuse_clear_s: float = 30.0
    demand_band_high: float = _BUDGETER.high
    demand_exit_margin: float = 0.03
    demand_for_s: float = 60.0
    demand_clear_s: float = 30.0
    compaction_hold_s: float = 600.0
    admission_wait_s: float = 60.0
    admission_wait_exit_fraction: float = 0.5
    admission_wait_for_s: float = 15.0
    admission_wait_clear_s: float = 30.0
    collapse_window_s: float = runs.WINDOW_MIN * 60.0
    collapse_baseline_s: float = 1800.0
    collapse_hit_below: float = runs.DEGRADED_THRESHOLD
    collapse_recover_hit: float = 0.5
    collapse_throughput_fraction: float = 0.6
    collapse_backlog_growth: float = 2.0
    collapse_for_s: float = 15.0
    collapse_clear_s: float = 30.0
    collapse_eval_every_s: float = 5.0
    risk_enter: float = _RISK.warn_enter
    risk_exit: float = _RISK.warn_exit
    risk_for_s: float = _RISK.warn_for_s
    risk_clear_s: float = _RISK.warn_clear_s
    risk_prefill_capacity_tokens_per_s: float = _RISK.prefill_capacity_tokens_per_s

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"alert setting {f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"alert setting {f.name} must not be negative, got {value}")
        if self.thin_reuse_exit >= self.thin_reuse_enter:
            raise ValueError(
                "thin_reuse_exit must be below thin_reuse_enter (hysteresis), "
                f"got {self.thin_reuse_exit} >= {self.thin_reuse_enter}"
            )
        if self.thin_reuse_enter > 1:
            raise ValueError(f"thin_reuse_enter must be at most 1, got {self.thin_reuse_enter}")
        if self.thin_reuse_min_turns < 1 or self.thin_reuse_min_turns != int(self.thin_reuse_min_turns):
            raise ValueError(
                f"thin_reuse_min_turns must be a whole number >= 1, got {self.thin_reuse_min_turns}"
            )
        if self.collapse_recover_hit <= self.collapse_hit_below:
            raise ValueError(
                "collapse_recover_hit must be above collapse_hit_below (hysteresis), "
                f"got {self.collapse_recover_hit} <= {self.collapse_hit_below}"
            )
        if not 0 < self.collapse_throughput_fraction < 1:
            raise ValueError(
                f"collapse_throughput_fraction must be in (0, 1), got {self.collapse_throughput_fraction}"
            )
        if self.collapse_window_s <= 0:
            raise ValueError(f"collapse_window_s must be positive, got {self.collapse_window_s}")
        if self.down_after_failures < 1:
            raise ValueError(f"down_after_failures must be at least 1, got {self.down_after_failures}")
        if self.risk_exit >= self.risk_enter or self.risk_enter > 1:
            raise ValueError(
                "risk_exit must be below risk_enter (hysteresis) and risk_enter at most 1, "
                f"got {self.risk_exit} and {self.risk_enter}"
            )
        if self.risk_prefill_capacity_tokens_per_s <= 0:
            raise ValueError(
                "risk_prefill_capacity_tokens_per_s must be positive, "
                f"got {self.risk_prefill_capacity_tokens_per_s}"
            )
        if self.admission_wait_s <= 0:
            raise ValueError(f"admission_wait_s must be positive, got {self.admission_wait_s}")
        if not 0 < self.admission_wait_exit_fraction < 1:
            raise ValueError(
                "admission_wait_exit_fraction must be in (0, 1) (hysteresis), "
                f"got {self.admission_wait_exit_fraction}"
            )

    @property
    def regime(self) -> RegimeConfig:
        """The thin-reuse judgement these settings describe (the same one the sidecar's regime uses)."""
        return RegimeConfig(
            enter=self.thin_reuse_enter, exit=self.thin_reuse_exit, min_turns=int(self.thin_reuse_min_turns)
        )

    @property
    def admission_wait_exit_s(self) -> float:
        """The oldest wait must fall to this (or nobody wait) before ``admission-wait`` resolves."""
        return self.admission_wait_s * self.admission_wait_exit_fraction

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> AlertSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown alert setting(s) {unknown}; known: {sorted(known)}")
        return cls(**data)  # type: ignore[arg-type]
