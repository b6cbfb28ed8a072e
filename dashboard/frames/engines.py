"""Engines and targets for the pages: what an engine is, the targets' health, the collectors' heartbeats.

What an "engine" is here: an engine target (role ``engine``) together with the
sidecar(s) whose ``engine_url`` is its URL. A sidecar whose engine is not
scraped still makes an engine entry (named after the sidecar). Engines are listed
in natural name order (engine-2 before engine-10).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from db import queries as dbq

_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[Any, ...]:
    """Sort key putting engine-2 before engine-10."""
    return tuple(int(part) if part.isdigit() else part.lower() for part in _DIGITS.split(text))


@dataclass(frozen=True)
class EngineRef:
    key: str
    engine_target_id: int | None
    sidecar_target_id: int | None
    engine_url: str | None
    sidecar_url: str | None
    kind: str
    sidecar_name: str | None = None
    labels: tuple[str, ...] = ()  # "key=value" labels of its targets (for the Overview's filter)

    @property
    def target_ids(self) -> tuple[int, ...]:
        return tuple(t for t in (self.engine_target_id, self.sidecar_target_id) if t is not None)


@dataclass(frozen=True)
class TargetHealth:
    target_id: int
    role: str
    name: str
    url: str
    up: bool
    last_scrape_ts: float | None
    last_success_ts: float | None
    last_error: str | None
    consecutive_failures: int


@dataclass
class Latest:
    """Latest sample per (target, engine label, signal)."""

    values: dict[tuple[int, str, str], tuple[float, float]] = field(default_factory=dict)

    def get(self, target_id: int | None, signal: str, label: str = "") -> tuple[float, float] | None:
        if target_id is None:
            return None
        return self.values.get((target_id, label, signal))

    def value(self, target_id: int | None, signal: str, label: str = "") -> float | None:
        got = self.get(target_id, signal, label)
        return None if got is None else got[1]

    def labels(self, target_id: int | None) -> list[str]:
        return sorted({lab for (tid, lab, _sig) in self.values if tid == target_id})

    def summed(self, target_id: int | None, signal: str) -> float | None:
        """Sum over engine labels (for additive signals: rates, counts, pool)."""
        vals = [v for (tid, _lab, sig), (_ts, v) in self.values.items() if tid == target_id and sig == signal]
        return sum(vals) if vals else None


def list_engines(conn: Connection) -> list[EngineRef]:
    configured = dbq.targets(conn, configured_only=True)
    engines = [t for t in configured if t["role"] == "engine"]
    sidecars = [t for t in configured if t["role"] == "sidecar"]
    # A sidecar configured without `engine` still names the engine it fronts in its /state.
    reported = {
        r["target_id"]: r["state"].get("engine")
        for r in dbq.sidecar_state(conn)
        if isinstance(r["state"], dict)
    }
    by_engine_url: dict[str, Any] = {}
    for s in sorted(sidecars, key=lambda t: (t["name"] or "", t["id"])):
        engine_url = s["engine_url"] or reported.get(s["id"])
        if isinstance(engine_url, str) and engine_url:
            by_engine_url.setdefault(engine_url.rstrip("/"), s)
    result: list[EngineRef] = []
    used: set[int] = set()

    def labels(*found: Any) -> tuple[str, ...]:
        pairs = {
            f"{k}={v}"
            for t in found
            if t is not None and isinstance(t["labels"], dict)
            for k, v in t["labels"].items()
        }
        return tuple(sorted(pairs))

    for e in engines:
        s = by_engine_url.get(e["url"].rstrip("/"))
        if s is not None:
            used.add(s["id"])
        result.append(
            EngineRef(
                key=e["name"] or e["url"],
                engine_target_id=e["id"],
                sidecar_target_id=s["id"] if s else None,
                engine_url=e["url"],
                sidecar_url=s["url"] if s else None,
                kind=e["kind"],
                sidecar_name=(s["name"] or s["url"]) if s else None,
                labels=labels(e, s),
            )
        )
    for s in sidecars:
        if s["id"] not in used:
            result.append(
                EngineRef(
                    key=s["name"] or s["url"],
                    engine_target_id=None,
                    sidecar_target_id=s["id"],
                    engine_url=s["engine_url"],
                    sidecar_url=s["url"],
                    kind="unknown",
                    sidecar_name=s["name"] or s["url"],
                    labels=labels(s),
                )
            )
    return sorted(result, key=lambda r: natural_key(r.key))


def target_health(conn: Connection, as_of: float | None = None) -> dict[int, TargetHealth]:
    """Each target's health now (the ``targets`` row), or with `as_of` at that time, from its stored ``up``
    samples (`db.queries.up_as_of`): up = the outcome of its newest scrape then; the error text and the
    failure count are not kept over time (None and 0). A target not scraped by then is down, never scraped."""
    if as_of is not None:
        then = {r["target_id"]: r for r in dbq.up_as_of(conn, as_of)}
        out = {}
        for t in dbq.targets(conn):
            r = then.get(t["id"], {})
            out[t["id"]] = TargetHealth(
                t["id"],
                t["role"],
                t["name"] or t["url"],
                t["url"],
                bool(r.get("up", False)),
                r.get("ts"),
                r.get("last_success_ts"),
                None,
                0,
            )
        return out
    return {
        t["id"]: TargetHealth(
            t["id"],
            t["role"],
            t["name"] or t["url"],
            t["url"],
            bool(t["up"]),
            t["last_scrape_ts"],
            t["last_success_ts"],
            t["last_error"],
            t["consecutive_failures"] or 0,
        )
        for t in dbq.targets(conn)
    }


def heartbeats(conn: Connection) -> list[dict[str, Any]]:
    return [
        {k: h[k] for k in ("name", "pid", "host", "started_ts", "last_beat_ts", "targets", "targets_up")}
        for h in dbq.heartbeat(conn)
    ]
