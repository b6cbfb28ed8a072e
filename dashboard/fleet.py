"""The Overview's fleet view, built from plain data (no Streamlit): one row per engine, worst first,
and fleet charts as distributions across engines.

- `fleet_rows`: one dict per engine with its state (`dashboard.status`, precedence documented
  there), the cause and next step, R_t/R_r/D from the same sidecar ``/state`` snapshot as the
  regime (the badge agrees with its row), the queue at the sidecar, and each target's own last good
  scrape (engine and sidecar apart).
- `sort_rows`: worst state first, then lowest R_t, then natural name order.
- `matches`: the filter by name or ``key=value`` label.
- `table_numbers`: the number columns as float columns, NaN where a value is unknown, so the table sorts
  them as numbers (negative D included); the page draws NaN as a blank cell (`st.dataframe(placeholder="")`,
  not "None", which reads like a value). `NUMBER_COLUMNS` says how each is formatted and, in its help
  text, where it comes from and what a blank means.
- `quantile_frame`: p10/p50/p90 of a signal across engines per time bucket; `worst`: the few engines
  drawn on top of the distribution.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from dashboard.frames import EngineRef, Latest, TargetHealth, natural_key
from dashboard.status import EngineStatus, Queue, age_text, engine_status

_SIDECAR_BLANK = "Blank: no sidecar fronts this engine, or it has not reported this yet."
_ENGINE_BLANK = "Blank: the engine's /metrics has not reported it (not scraped yet, or down since the start)."
# column -> (format: printf-style or "percent", help text)
NUMBER_COLUMNS: dict[str, tuple[str, str]] = {
    "R_t": ("%.2f", f"token-weighted hit rate (sidecar). {_SIDECAR_BLANK}"),
    "R_r": ("%.2f", f"request-weighted hit rate (sidecar). {_SIDECAR_BLANK}"),
    "D": ("%.2f", f"R_r - R_t, same /state snapshot as the state. {_SIDECAR_BLANK}"),
    "demand / pool": (
        "percent",
        f"KV demand of the admitted sessions / the KV pool (sidecar). {_SIDECAR_BLANK}",
    ),
    "waiting at sidecar": ("%d", f"sessions waiting for admission (sidecar). {_SIDECAR_BLANK}"),
    "parked": ("%d", f"sessions parked by the budgeter or an operator (sidecar). {_SIDECAR_BLANK}"),
    "in system": ("%d", f"sessions in the system (sidecar). {_SIDECAR_BLANK}"),
    "turns/s": ("%.2f", f"turns per second through the sidecar. {_SIDECAR_BLANK}"),
    "KV usage": ("percent", f"the engine's KV-cache usage gauge, mean over its labels. {_ENGINE_BLANK}"),
    "engine running": ("%d", f"requests running in the engine, summed over its labels. {_ENGINE_BLANK}"),
    "engine waiting": ("%d", f"requests waiting in the engine, summed over its labels. {_ENGINE_BLANK}"),
    "open alerts": ("%d", "alerts firing on the engine or its sidecar"),
}


def table_numbers(table: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """``table`` with each of ``columns`` it has as a float column, NaN where the value is unknown
    (None, NaN or not a number), so that sorting the column sorts the numbers."""
    out = table.copy()
    for column in columns:
        if column in out:
            out[column] = pd.to_numeric(out[column], errors="coerce").astype("float64")
    return out


def column_format(fmt: str) -> str:
    """A `NUMBER_COLUMNS` format as `st.column_config.NumberColumn` takes it ("percent": 0.5 -> 50%)."""
    return "percent" if fmt == "percent" else fmt


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def sidecar_snapshot(
    side: Mapping[str, Any], latest: Latest, sidecar_id: int | None
) -> dict[str, float | None]:
    """R_t, R_r, D and the queue from the sidecar's newest /state (one snapshot), else its newest samples."""
    state = side.get("state") if isinstance(side.get("state"), dict) else {}
    reuse = state.get("reuse") or {}
    backlog = state.get("backlog") or {}
    out: dict[str, float | None] = {}
    for key, section, field in (
        ("R_t", reuse, "token_weighted"),
        ("R_r", reuse, "request_weighted"),
        ("D", reuse, "divergence"),
        ("waiting", backlog, "waiting"),
        ("parked", backlog, "parked"),
        ("oldest_waiting_s", backlog, "oldest_waiting_s"),
        ("oldest_parked_s", backlog, "oldest_parked_s"),
    ):
        value = _num(section.get(field)) if side else None
        out[key] = value if value is not None else latest.value(sidecar_id, field)
    return out


def fleet_rows(
    engines: Iterable[EngineRef],
    *,
    health: Mapping[int, TargetHealth],
    latest: Latest,
    states: Mapping[int, Mapping[str, Any]],
    firing: Mapping[int, set[str]],
    now: float,
    stale_after: float,
    collectors_ok: bool,
    collectors_age: float | None,
    admission_wait_s: float | None,
) -> list[dict[str, Any]]:
    rows = []
    for ref in engines:
        rules = set().union(*(firing.get(t, set()) for t in ref.target_ids)) if ref.target_ids else set()
        side = states.get(ref.sidecar_target_id or -1, {})
        snap = sidecar_snapshot(side, latest, ref.sidecar_target_id)
        queue = Queue(snap["waiting"], snap["oldest_waiting_s"], snap["oldest_parked_s"])
        status = engine_status(
            ref,
            dict(health),
            now=now,
            stale_after=stale_after,
            collectors_ok=collectors_ok,
            collectors_age=collectors_age,
            firing_rules=rules,
            regime=side.get("regime"),
            divergence=snap["D"],
            queue=queue if ref.sidecar_target_id else None,
            admission_wait_s=admission_wait_s,
        )
        s_id, e_id = ref.sidecar_target_id, ref.engine_target_id
        demand = latest.value(s_id, "demand_tokens")
        pool = latest.value(s_id, "pool_tokens") or latest.summed(e_id, "pool_tokens")
        rows.append(
            {
                "ref": ref,
                "status": status,
                "engine": ref.key,
                "state": status.badge,
                "why": status.why,
                "R_t": snap["R_t"],
                "R_r": snap["R_r"],
                "D": snap["D"],
                "demand / pool": None if demand is None or not pool else demand / pool,
                "waiting at sidecar": snap["waiting"],
                "oldest wait": snap["oldest_waiting_s"],
                "parked": snap["parked"],
                "oldest parked": snap["oldest_parked_s"],
                "in system": latest.value(s_id, "sessions_in_system"),
                "turns/s": latest.value(s_id, "turns_per_s"),
                "KV usage": _mean_over_labels(latest, e_id, "kv_usage"),
                "engine running": latest.summed(e_id, "requests_running"),
                "engine waiting": latest.summed(e_id, "requests_waiting"),
                "open alerts": len(rules),
                "engine: last good scrape": _scrape_age(health.get(e_id) if e_id is not None else None, now),
                "sidecar: last good scrape": _scrape_age(health.get(s_id) if s_id is not None else None, now),
            }
        )
    return rows


def _scrape_age(h: TargetHealth | None, now: float) -> str:
    if h is None:
        return "-"
    age = age_text(now - h.last_success_ts) if h.last_success_ts else "never"
    return age if h.up else f"{age} (DOWN)"


def _mean_over_labels(latest: Latest, target_id: int | None, signal: str) -> float | None:
    vals = [latest.value(target_id, signal, lab) for lab in latest.labels(target_id)]
    known = [v for v in vals if v is not None]
    return sum(known) / len(known) if known else None


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worst first: state precedence, then lowest R_t (unknown last), then natural name order."""

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        status: EngineStatus = row["status"]
        r_t = row["R_t"]
        return (status.rank, r_t is None, r_t if r_t is not None else 0.0, natural_key(row["engine"]))

    return sorted(rows, key=key)


def state_counts(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"].state] = counts.get(row["status"].state, 0) + 1
    return counts


def matches(ref: EngineRef, text: str) -> bool:
    """Case-insensitive substring of the engine's name, its sidecar's name, or one of its labels."""
    needle = text.strip().lower()
    if not needle:
        return True
    haystack = [ref.key, ref.sidecar_name or "", *ref.labels]
    return any(needle in item.lower() for item in haystack)


def quantile_frame(
    frame: pd.DataFrame, signal: str, quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
) -> pd.DataFrame:
    """Per time bucket, the given quantiles of `signal` across targets (columns ``ts``, ``p10``, ...,
    ``engines`` = how many engines had a value). `frame` holds bucketed points (same ts per bucket)."""
    part = frame[frame["signal"] == signal]
    columns = ["ts", *(f"p{round(q * 100)}" for q in quantiles), "engines"]
    if part.empty:
        return pd.DataFrame(columns=columns)
    wide = part.pivot_table(index="ts", columns="target_id", values="value", aggfunc="mean")
    out = wide.quantile(list(quantiles), axis=1).T
    out.columns = [f"p{round(q * 100)}" for q in quantiles]
    out["engines"] = wide.notna().sum(axis=1)
    return out.reset_index()[columns]


def worst(
    rows: Iterable[dict[str, Any]], column: str, n: int = 3, *, highest: bool = False
) -> list[EngineRef]:
    """The `n` engines with the lowest (or highest) current `column`, skipping unknown values."""
    known = [r for r in rows if r.get(column) is not None]
    known.sort(key=lambda r: (-r[column] if highest else r[column], natural_key(r["engine"])))
    return [r["ref"] for r in known[:n]]
