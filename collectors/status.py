"""`python -m collectors status`: each target's latest canonical signals, up/down and open alerts, from the DB."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from sqlalchemy import Connection

from core import signals as sig
from db import queries

TARGET_LEVEL = (sig.UP, sig.SCRAPE_DURATION_S)
STALE_AFTER_S = 30.0


def status_rows(conn: Connection, *, now: float | None = None) -> list[dict[str, Any]]:
    """One dict per (target, engine label). Keys: target, name, role, kind, engine, up, token_weighted
    (sidecar R_t, or the engine's R_t from its counters), kv_usage (0-1), requests_running,
    requests_waiting, alerts (open alerts: rule, severity, summary, started_ts, acknowledged_by),
    last_scrape_ts, last_success_ts, last_error, age_s (of the newest data), and every other
    canonical signal the target has."""
    now = time.time() if now is None else now
    targets = queries.targets(conn, configured_only=True)
    latest = queries.latest_signals(conn, target_ids=[t["id"] for t in targets])
    open_alerts = queries.open_alerts(conn)
    out: list[dict[str, Any]] = []
    for t in targets:
        entries = [e for e in latest if e["target_id"] == t["id"]]
        target_level = next((e for e in entries if e["engine"] is None), {})
        labelled = [e for e in entries if e["engine"] is not None]
        if not labelled:
            labelled = [target_level or {"engine": None}]
        for entry in labelled:
            row: dict[str, Any] = {
                "target": t["url"],
                "name": t["name"],
                "role": t["role"],
                "kind": t["kind"],
                "engine": entry.get("engine"),
                "up": bool(t["up"]) and t["last_success_ts"] is not None,
                "token_weighted": None,
                "kv_usage": None,
                "requests_running": None,
                "requests_waiting": None,
            }
            for source in (target_level, entry):
                for key, value in source.items():
                    if key in sig.ALL_SIGNALS and key != sig.UP:
                        row[key] = value
            if t["role"] == "engine":
                row["token_weighted"] = row.get(sig.ENGINE_HIT_RATIO)
            row["alerts"] = [
                {
                    "id": a["id"],
                    "rule": a["rule"],
                    "severity": a["severity"],
                    "summary": a["summary"],
                    "started_ts": a["started_ts"],
                    "acknowledged_by": a["acknowledged_by"],
                    "engine": a["engine"],
                }
                for a in open_alerts
                if a["target_id"] == t["id"] and (a["engine"] in (None, row["engine"]))
            ]
            row["last_scrape_ts"] = t["last_scrape_ts"]
            row["last_success_ts"] = t["last_success_ts"]
            row["last_error"] = t["last_error"]
            newest = entry.get("ts") or target_level.get("ts")
            row["age_s"] = None if newest is None else round(now - newest, 1)
            # No fresh data although the last scrape did not fail: the collector is not running or stuck.
            row["stale"] = row["age_s"] is None or row["age_s"] > max(
                STALE_AFTER_S, 5 * (t["interval_s"] or 1.0)
            )
            out.append(row)
    return out


def _fmt(value: Any, pct: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0%}" if pct else f"{value:.3g}"
    return str(value)


def render_table(rows: list[dict[str, Any]], heartbeat: list[dict[str, Any]], now: float) -> str:
    lines = []
    for hb in heartbeat:
        age = now - hb["last_beat_ts"]
        when = dt.datetime.fromtimestamp(hb["last_beat_ts"], dt.UTC).strftime("%H:%M:%S")
        lines.append(
            f"collector {hb['name']} pid {hb['pid']}: last heartbeat {when} UTC ({age:.0f} s ago)"
            f"{'  STALE' if age > 30 else ''}, {hb['targets_up']}/{hb['targets']} targets up"
        )
    if not heartbeat:
        lines.append("no collector heartbeat in this database")
    header = ("TARGET", "KIND", "ENGINE", "UP", "R_t", "KV", "RUN", "WAIT", "AGE", "ALERTS")
    table = [header]
    for r in rows:
        state = ("STALE" if r["stale"] else "up") if r["up"] else "DOWN"
        table.append(
            (
                r["target"],
                r["kind"] or "-",
                r["engine"] or "-",
                state,
                _fmt(r["token_weighted"], True),
                _fmt(r["kv_usage"], True),
                _fmt(r["requests_running"]),
                _fmt(r["requests_waiting"]),
                "-" if r["age_s"] is None else f"{r['age_s']:.0f}s",
                ",".join(a["rule"] for a in r["alerts"]) or "-",
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for r in rows:
        if not r["up"] and r["last_error"]:
            lines.append(f"  {r['target']}: {r['last_error']}")
        for a in r["alerts"]:
            lines.append(f"  [{a['severity']}] {a['rule']} on {r['target']}: {a['summary']}")
    if not rows:
        lines.append("(no configured targets)")
    return "\n".join(lines)
