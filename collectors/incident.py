"""``python -m collectors export-incident --engine E --from T1 --to T2 --out FILE`` (issue 16 item 4).

Writes a self-contained incident bundle: one JSON document (gzip-compressed when FILE ends in ``.gz``)
holding, for the engine named E (its ``name`` in ``collectors status``, or its URL) and the sidecars
fronting it, over ``[T1, T2]``:

- ``targets``: url, role, kind, name, labels, engine_url of each;
- ``series``: every stored signal of those targets, raw points (``{"target", "engine", "signal",
  "ts": [...], "value": [...]}``);
- ``alerts``: alert episodes of those targets firing at any time in the window;
- ``audit``: audit actions (sidecar and dashboard) in the window; ``decisions``: compaction decisions;
- ``turns``: the turn trace;
- ``sessions``: the sessions the sidecars saw in the window: ``session_id``, ``first_seen_ts``,
  ``last_seen_ts`` and the ``output_budget`` its client declared (what ``simulator replay`` gives each
  session, as the sidecar's budgeter counted it);
- ``settings``: the settings in force: each sidecar's newest stored /state budgeter and compaction
  sections, and every budgeter change in the window (from the audit).

T1 and T2 are RFC 3339 times (``2026-12-01T14:00:00Z``) or epoch seconds. Nothing secret is written:
any key naming a token (not a token count: ``prompt_tokens`` stays), password, secret, authorization,
cookie or header(s) is dropped wherever it appears (`scrub`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import re
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, select

from db import queries
from db.models import Sample, Series

FORMAT = "prefixops-incident/1"
# "token" but not "tokens" (prompt_tokens, pool_tokens, ... are counts, not secrets)
SECRET_KEY = re.compile(
    r"token(?!s)|password|passphrase|secret|authorization|cookie|^headers?$|api[_-]?key", re.I
)


class IncidentError(ValueError):
    """A bad argument of export-incident; the message names it."""


def parse_time(text: str, flag: str) -> float:
    """RFC 3339 or epoch seconds -> epoch seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise IncidentError(
            f"{flag} must be an RFC 3339 time (2026-12-01T14:00:00Z) or epoch seconds, got {text!r}"
        ) from None
    if parsed.tzinfo is None:
        raise IncidentError(f"{flag} {text!r} has no time zone: add Z or an offset")
    return parsed.timestamp()


def scrub(value: Any) -> Any:
    """`value` without any key that could hold a secret (recursively)."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if not (isinstance(k, str) and SECRET_KEY.search(k))}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


def find_targets(conn: Connection, engine: str) -> list[dict[str, Any]]:
    targets = queries.targets(conn)
    found = [t for t in targets if t["role"] == "engine" and engine in (t["name"], t["url"])]
    if not found:
        names = sorted(str(t["name"] or t["url"]) for t in targets if t["role"] == "engine")
        raise IncidentError(
            f"--engine {engine!r} is not an engine the collectors know; known: {', '.join(names)}"
        )
    eng = found[0]
    return [eng, *(t for t in targets if t["role"] == "sidecar" and t["engine_url"] == eng["url"])]


def _series(
    conn: Connection, targets: list[dict[str, Any]], start: float, end: float
) -> list[dict[str, Any]]:
    by_id = {t["id"]: t["url"] for t in targets}
    rows = conn.execute(
        select(Series.id, Series.target_id, Series.engine_label, Series.signal, Sample.ts, Sample.value)
        .join(Sample, Sample.series_id == Series.id)
        .where(Series.target_id.in_(list(by_id)), Sample.ts >= start, Sample.ts <= end)
        .order_by(Series.id, Sample.ts)
    ).all()
    out: dict[int, dict[str, Any]] = {}
    for sid, tid, label, signal, ts, value in rows:
        s = out.setdefault(
            sid, {"target": by_id[tid], "engine": label or None, "signal": signal, "ts": [], "value": []}
        )
        s["ts"].append(ts)
        s["value"].append(value)
    return list(out.values())


def bundle(
    conn: Connection, engine: str, start: float, end: float, now: float | None = None
) -> dict[str, Any]:
    if end <= start:
        raise IncidentError(f"--to ({end}) must be after --from ({start})")
    targets = find_targets(conn, engine)
    ids = [t["id"] for t in targets]
    sidecar_ids = [t["id"] for t in targets if t["role"] == "sidecar"]
    alerts = [a for a in queries.alerts(conn, target_id=ids, since_ts=start, until_ts=end, limit=10_000)]
    audit = queries.audit(
        conn, target_id=sidecar_ids, since_ts=start, until_ts=end, limit=100_000
    ) + queries.audit(conn, source="dashboard", since_ts=start, until_ts=end, limit=100_000)
    audit = [a for a in audit if a["source"] != "dashboard" or a["target_id"] in (None, *ids)]
    states = {s["target_id"]: s for s in queries.sidecar_state(conn, sidecar_ids)} if sidecar_ids else {}
    settings = {
        "sidecars": {
            t["url"]: {
                k: (states.get(t["id"], {}).get("state") or {}).get(k) for k in ("budgeter", "compaction")
            }
            | {"as_of": states.get(t["id"], {}).get("ts")}
            for t in targets
            if t["role"] == "sidecar"
        },
        "changes": sorted(
            (
                {"ts": a["ts"], "actor": a["actor"], "action": a["action"], "params": a["params"]}
                for a in audit
                if (a["action"] or "").startswith("budgeter")
            ),
            key=lambda a: a["ts"],
        ),
    }
    doc = {
        "format": FORMAT,
        "exported_at": time.time() if now is None else now,
        "engine": engine,
        "from": start,
        "to": end,
        "targets": [
            {k: t[k] for k in ("url", "role", "kind", "name", "labels", "engine_url")} for t in targets
        ],
        "series": _series(conn, targets, start, end),
        "alerts": sorted(alerts, key=lambda a: a["started_ts"]),
        "audit": sorted(audit, key=lambda a: a["ts"]),
        "decisions": sorted(
            queries.compaction_decisions(
                conn, target_id=sidecar_ids, since_ts=start, until_ts=end, limit=100_000
            ),
            key=lambda d: d["ts"],
        )
        if sidecar_ids
        else [],
        "turns": queries.turns(conn, target_id=sidecar_ids, start_ts=start, end_ts=end)
        if sidecar_ids
        else [],
        "sessions": _sessions(conn, sidecar_ids, start, end) if sidecar_ids else [],
        "settings": settings,
    }
    scrubbed: dict[str, Any] = scrub(doc)
    return scrubbed


def _sessions(conn: Connection, sidecar_ids: list[int], start: float, end: float) -> list[dict[str, Any]]:
    rows = queries.sessions(
        conn, target_id=sidecar_ids, present_only=False, seen_between=(start, end), limit=1_000_000
    )
    return sorted(
        (
            {
                "target": r["target_url"],
                "session_id": r["session_id"],
                "first_seen_ts": r["first_seen_ts"],
                "last_seen_ts": r["last_seen_ts"],
                "output_budget": (r["data"] if isinstance(r["data"], dict) else {}).get("output_budget"),
            }
            for r in rows
        ),
        key=lambda r: (r["first_seen_ts"], r["session_id"]),
    )


def write_bundle(doc: dict[str, Any], out: str | Path) -> Path:
    path = Path(out)
    data = json.dumps(doc, separators=(",", ":"), default=str).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def read_bundle(path: str | Path) -> dict[str, Any]:
    """A bundle written by `write_bundle` (gzip or not); raises IncidentError naming the file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except (OSError, ValueError, EOFError) as exc:
        raise IncidentError(f"{p}: not a readable incident bundle ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise IncidentError(f"{p}: not an incident bundle (format is not {FORMAT!r})")
    return doc


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m collectors export-incident",
        description="Write an incident bundle (series, alerts, audit actions, turns, settings "
        "in force) of one engine over a time range; no tokens or passwords.",
    )
    p.add_argument(
        "--engine", required=True, help="the engine's name as `collectors status` shows it (or its URL)"
    )
    p.add_argument(
        "--from", dest="start", required=True, metavar="T1", help="start: RFC 3339 or epoch seconds"
    )
    p.add_argument("--to", dest="end", required=True, metavar="T2", help="end: RFC 3339 or epoch seconds")
    p.add_argument(
        "--out", required=True, metavar="FILE", help="output JSON file; gzip-compressed when it ends in .gz"
    )
    p.add_argument(
        "--database-url",
        metavar="URL",
        help="SQLAlchemy URL (default $PREFIXOPS_DATABASE_URL, else $DATABASE_URL, else "
        "sqlite:///data/prefixops.db)",
    )
    return p


def main(argv: list[str]) -> int:
    import sys

    from db import database_url, make_engine

    args = parser().parse_args(argv)
    try:
        start, end = parse_time(args.start, "--from"), parse_time(args.end, "--to")
        engine = make_engine(database_url(args.database_url))
        with engine.connect() as conn:
            doc = bundle(conn, args.engine, start, end)
        path = write_bundle(doc, args.out)
    except IncidentError as exc:
        print(f"export-incident: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {path}: {len(doc['series'])} series, {len(doc['alerts'])} alerts, {len(doc['audit'])} audit "
        f"actions, {len(doc['turns'])} turns, {len(doc['sessions'])} sessions"
    )
    return 0
