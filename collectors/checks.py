"""Range checks on what targets report, before it reaches the writer.

A value out of range for its field becomes None (that field only: the rest of the scrape is
kept), and the target's checker logs ONE warning per field naming the target, the field and
the value; the same fault on every later scrape is counted, not logged again.

Ranges (``SIGNAL_RANGES``): fractions and ratios within [0, 1] (KV usage, hit ratios, R_t,
R_r, the bands), D within [-1, 1], every count, rate, size and duration >= 0, and nothing
beyond 2**53 (the last integer a float holds exactly; engines do not count that far). Hits
never exceed queries: when they do, the hit rates and the ratio built on them are dropped.
Row fields (sessions, subtrees, decisions, audit entries): integers within [0, 2**53] and
floats finite within +/-2**53, so no value can overflow a database column.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from core import signals as sig

log = logging.getLogger(__name__)

LIMIT = float(2**53)
UNIT = (0.0, 1.0)
NON_NEGATIVE = (0.0, LIMIT)
SIGNAL_RANGES: dict[str, tuple[float, float]] = {
    **{name: NON_NEGATIVE for name in sig.ALL_SIGNALS},
    **{
        name: UNIT
        for name in (
            sig.KV_USAGE,
            sig.ENGINE_HIT_RATIO,
            sig.TOKEN_WEIGHTED,
            sig.REQUEST_WEIGHTED,
            sig.THIN_REUSE,
            sig.BAND_LOW,
            sig.BAND_HIGH,
            sig.LOW_HALF_CACHED_FRACTION,
            sig.UP,
        )
    },
    sig.DIVERGENCE: (-1.0, 1.0),
}
# (part, whole, signals derived from the part): part <= whole, else the part and what it fed are dropped
NOT_ABOVE = (
    (sig.PREFIX_CACHE_HITS_PER_S, sig.PREFIX_CACHE_QUERIES_PER_S, (sig.ENGINE_HIT_RATIO,)),
    (sig.CACHED_TOKENS_PER_S, sig.PROMPT_TOKENS_PER_S, (sig.ENGINE_HIT_RATIO,)),
)
SKIP_FIELDS = frozenset({"data", "params"})  # JSON documents kept as sent


def in_range(name: str, value: float) -> bool:
    lo, hi = SIGNAL_RANGES.get(name, (-LIMIT, LIMIT))
    return math.isfinite(value) and lo <= value <= hi


class Checker:
    """Per-target range checks with one warning per (field, fault)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.warned: set[str] = set()
        self.dropped = 0  # values nulled so far (all fields)

    def warn_once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            log.warning("%s", message)

    def _drop(self, field: str, value: Any, why: str) -> None:
        self.dropped += 1
        self.warn_once(
            field,
            f"{self.url}: {field} = {value!r:.40} is {why}: stored as null "
            "(warned once; later values out of range are dropped silently)",
        )

    def signals(self, values: dict[str, float], label: str = "") -> dict[str, float]:
        """Signals of one engine label (or a sidecar) with out-of-range values removed."""
        where = f" (engine {label})" if label else ""
        out: dict[str, float] = {}
        for name, value in values.items():
            if value is None:
                continue
            if in_range(name, value):
                out[name] = value
            else:
                lo, hi = SIGNAL_RANGES.get(name, (-LIMIT, LIMIT))
                self._drop(f"{name}{where}", value, f"outside [{lo:g}, {hi:g}]")
        for part, whole, derived in NOT_ABOVE:
            if part in out and whole in out and out[part] > out[whole] * (1 + 1e-9) + 1e-9:
                self._drop(f"{part}{where}", out[part], f"above {whole} = {out[whole]!r}")
                for name in (part, *derived):
                    out.pop(name, None)
        return out

    def samples(self, samples: Iterable[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
        by_label: dict[str, dict[str, float]] = {}
        for label, name, value in samples:
            by_label.setdefault(label, {})[name] = value
        return [
            (label, name, value)
            for label, values in by_label.items()
            for name, value in self.signals(values, label).items()
        ]

    def row(self, row: dict[str, Any] | None, document: str) -> dict[str, Any] | None:
        """A parsed sidecar row with every numeric field in range (others are nulled);
        None for a row whose id itself is out of range (it could not be stored)."""
        if row is None:
            return None
        for key, value in list(row.items()):
            if key in SKIP_FIELDS or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, int):
                ok = 0 <= value <= LIMIT
            else:
                ok = math.isfinite(value) and -LIMIT <= value <= LIMIT
            if ok:
                continue
            if key == "remote_id":
                self._drop(f"{document} id", value, "not an id that can be stored")
                return None
            self._drop(f"{document} {key}", value, "out of range")
            row[key] = None
        return row
