"""The Incident page's pieces (issue 16 item 4): an incident bundle (`collectors.incident`) as the Engine
page's frames and event markers, read-only. Pure functions of the bundle; no database."""

from __future__ import annotations

from typing import Any

import pandas as pd

from dashboard import frames as q

COLUMNS = ["ts", "target_id", "engine_label", "signal", "value"]


def signal_frames(doc: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every series of the bundle, the engine's series with data-parallel ranks combined) as chart frames;
    targets are numbered in the bundle's order."""
    ids = {t["url"]: i for i, t in enumerate(doc.get("targets", []), start=1)}
    roles = {t["url"]: t["role"] for t in doc.get("targets", [])}
    side: list[dict[str, Any]] = []
    eng: list[dict[str, Any]] = []
    for s in doc.get("series", []):
        rows = eng if roles.get(s["target"]) == "engine" else side
        for ts, value in zip(s["ts"], s["value"], strict=True):
            rows.append(
                {
                    "ts": ts,
                    "target_id": ids.get(s["target"], 0),
                    "engine_label": s.get("engine") or "",
                    "signal": s["signal"],
                    "value": value,
                }
            )
    side_frame = pd.DataFrame.from_records(side, columns=COLUMNS)
    eng_frame = q.combine_ranks(pd.DataFrame.from_records(eng, columns=COLUMNS))
    return pd.concat([side_frame, eng_frame], ignore_index=True), eng_frame


def events(doc: dict[str, Any]) -> pd.DataFrame:
    """Markers: audit actions, compaction decisions, alerts opening and closing (as on the Engine page)."""
    start, end = doc["from"], doc["to"]
    records: list[dict[str, Any]] = []
    for a in doc.get("audit", []):
        if a.get("action") in ("sign-in", "sign-out"):
            continue
        records.append(
            {
                "ts": a["ts"],
                "kind": "action",
                "label": f"{a.get('actor') or '?'}: {a.get('action')}",
                "text": f"{a.get('actor') or '?'}: {a.get('action')} {a.get('params') or ''} -> "
                f"{a.get('outcome')}",
            }
        )
    for d in doc.get("decisions", []):
        records.append(
            {
                "ts": d["ts"],
                "kind": "compaction",
                "label": "",
                "text": f"compaction {d.get('decision') or '?'} {d.get('subtree_id') or ''}: "
                f"{d.get('reason') or ''}",
            }
        )
    for a in doc.get("alerts", []):
        if start <= a["started_ts"] <= end:
            records.append(
                {
                    "ts": a["started_ts"],
                    "kind": "alert",
                    "label": f"{a['rule']} fired",
                    "text": f"alert {a['rule']} ({a.get('severity')}) opened: {a.get('summary')}",
                }
            )
        if a.get("resolved_ts") is not None and start <= a["resolved_ts"] <= end:
            records.append(
                {
                    "ts": a["resolved_ts"],
                    "kind": "alert",
                    "label": f"{a['rule']} resolved",
                    "text": f"alert {a['rule']} closed",
                }
            )
    frame = pd.DataFrame.from_records(records, columns=["ts", "kind", "label", "text"])
    return frame.sort_values("ts").reset_index(drop=True)


def timeline(doc: dict[str, Any]) -> pd.DataFrame:
    """The alerts and actions of the bundle in time order, for a table."""
    ev = events(doc)
    ev = ev[ev["kind"] != "compaction"]
    return pd.DataFrame({"ts": ev["ts"], "what": ev["kind"], "detail": ev["text"]}).reset_index(drop=True)
