"""Fill a database with a realistic picture of a small fleet, through the collectors' models.

Three engines, each fronted by a sidecar:

- ``a``: vLLM, collapsed. Healthy until ``COLLAPSE_AGO`` seconds before `now`,
  then a burst: ``R_t`` falls to ~0.1 while ``R_r`` stays ~0.9 (``D`` ~0.8,
  thin-reuse), demand goes past the high band, sessions pile up and some are
  parked. A collapse alert and a thin-reuse alert are firing, an operator parked
  sessions and deferred compaction, and the gate deferred compactions.
- ``b``: vLLM with two data-parallel ranks (engine labels "0" and "1"), healthy.
- ``c``: down: its engine stopped answering ``DOWN_AGO`` seconds ago and its
  sidecar's state is that old too.

Used by the AppTests, the browser tests and the bench (no collectors needed);
runnable by hand::

    .venv/bin/python -m tests.dashboard.fill data/filled.db
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from sqlalchemy import Engine, insert
from sqlalchemy.orm import Session as OrmSession

from db import make_engine
from db.models import (
    Alert,
    AuditEntry,
    Base,
    CollectorHeartbeat,
    CollectorState,
    CompactionDecision,
    Rollup1m,
    Sample,
    Series,
    Session,
    SidecarState,
    Silence,
    Subtree,
    Target,
    Turn,
)
from db.queries import ROLLUP_WATERMARK_KEY
from tests.dashboard.fill_turns import turn_rows

RAW_SECONDS = 2 * 3600  # raw samples over the last two hours
RAW_STEP = 5.0
SPARSE_RAW_SECONDS = 24 * 3600  # before that, one raw sample a minute (keeps the fill fast)
ROLLUP_DAYS = 2  # 1-minute rollups over the last two days
COLLAPSE_AGO = 30 * 60
DOWN_AGO = 10 * 60
POOL_TOKENS = 400_000
NASTY_SESSION = "<b>sess</b>*md* [x](javascript:alert(1))"

ENGINES = {
    "a": {"engine_url": "http://127.0.0.1:18000", "sidecar_url": "http://127.0.0.1:18100", "labels": [""]},
    "b": {
        "engine_url": "http://127.0.0.1:18001",
        "sidecar_url": "http://127.0.0.1:18101",
        "labels": ["0", "1"],
    },
    "c": {"engine_url": "http://127.0.0.1:18002", "sidecar_url": "http://127.0.0.1:18102", "labels": [""]},
}


def _wave(t: float, period: float = 600.0, amp: float = 0.02) -> float:
    return amp * math.sin(2 * math.pi * t / period)


def engine_signals(name: str, t: float, now: float) -> dict[str, float]:
    """Engine /metrics signals of one rank at time t."""
    collapsed = name == "a" and t >= now - COLLAPSE_AGO
    hit = (0.1 if collapsed else 0.9) + _wave(t)
    prompt = 9000.0 if collapsed else 12000.0
    return {
        "engine_hit_ratio": hit,
        "kv_usage": (0.97 if collapsed else 0.55) + _wave(t, 300, 0.02),
        "requests_running": 40.0 if collapsed else 8.0,
        "requests_waiting": 25.0 if collapsed else 0.0,
        "preemptions_per_s": 3.0 if collapsed else 0.0,
        "prompt_tokens_per_s": prompt,
        "cached_tokens_per_s": prompt * hit,
        "generation_tokens_per_s": 300.0 if collapsed else 900.0,
        "prefix_cache_queries_per_s": prompt,
        "prefix_cache_hits_per_s": prompt * hit,
        "ttft_p50": 2.0 if collapsed else 0.15,
        "ttft_p90": 3.5 if collapsed else 0.3,
        "ttft_p99": 5.0 if collapsed else 0.6,
        "pool_tokens": float(POOL_TOKENS),
        "up": 1.0,
    }


def sidecar_signals(name: str, t: float, now: float) -> dict[str, float]:
    collapsed = name == "a" and t >= now - COLLAPSE_AGO
    rt = (0.1 if collapsed else 0.88) + _wave(t)
    rr = (0.9 if collapsed else 0.95) + _wave(t, 900, 0.01)
    demand = (0.99 if collapsed else 0.6) * POOL_TOKENS
    return {
        "token_weighted": rt,
        "request_weighted": rr,
        "divergence": rr - rt,
        "thin_reuse": 1.0 if collapsed else 0.0,
        "pool_tokens": float(POOL_TOKENS),
        "demand_tokens": demand,
        "demand_fraction": demand / POOL_TOKENS,
        "band_low": 0.75,
        "band_high": 0.95,
        "turns_per_s": 0.4 if collapsed else 1.2,
        "sessions_in_system": 120.0 if collapsed else 9.0,
        "admitted": 90.0 if collapsed else 9.0,
        "parked": 12.0 if collapsed else 0.0,
        "waiting": 18.0 if collapsed else 0.0,
        "low_half_cached_fraction": 0.85 if collapsed else 0.05,
        "up": 1.0,
    }


def raw_times(last_t: float, raw_seconds: float) -> list[float]:
    """Every RAW_STEP s over the last `raw_seconds`, every minute over the 24 h before (raw retention)."""
    sparse = [last_t - raw_seconds - 60.0 * i for i in range(int(SPARSE_RAW_SECONDS / 60), 0, -1)]
    dense = [last_t - raw_seconds + RAW_STEP * i for i in range(int(raw_seconds / RAW_STEP) + 1)]
    return sparse + dense


def fill_database(
    engine: Engine,
    now: float | None = None,
    *,
    heartbeat_age: float = 1.0,
    raw_seconds: float = RAW_SECONDS,
    rollup_days: float = ROLLUP_DAYS,
) -> float:
    """Create the schema in `engine` and insert the fleet described above; returns `now`."""
    now = time.time() if now is None else now
    Base.metadata.create_all(engine)
    with OrmSession(engine) as db:
        targets: dict[tuple[str, str], Target] = {}
        for name, spec in ENGINES.items():
            down = name == "c"
            last_ok = now - DOWN_AGO if down else now - 1.0
            eng = Target(
                url=spec["engine_url"],
                role="engine",
                kind="vllm",
                configured_kind="auto",
                name=name,
                labels={},
                interval_s=1.0,
                up=not down,
                last_scrape_ts=now - 1.0,
                last_success_ts=last_ok,
                last_error="ConnectError: connection refused" if down else None,
                last_error_ts=now - 1.0 if down else None,
                scrape_duration_s=0.004,
                consecutive_failures=DOWN_AGO if down else 0,
                created_ts=now - 9 * 86400,
            )
            side = Target(
                url=spec["sidecar_url"],
                role="sidecar",
                kind="sidecar",
                configured_kind="sidecar",
                name=f"{name}-sidecar",
                labels={},
                engine_url=spec["engine_url"],
                interval_s=1.0,
                up=not down,
                last_scrape_ts=now - 1.0,
                last_success_ts=last_ok,
                last_error="ConnectError: connection refused" if down else None,
                consecutive_failures=DOWN_AGO if down else 0,
                created_ts=now - 9 * 86400,
            )
            db.add_all([eng, side])
            targets[(name, "engine")] = eng
            targets[(name, "sidecar")] = side
        db.flush()

        samples: list[dict[str, Any]] = []
        rollups: list[dict[str, Any]] = []
        for name, spec in ENGINES.items():
            last_t = now - DOWN_AGO if name == "c" else now - 1.0
            for role, labels, fn in (
                ("engine", spec["labels"], engine_signals),
                ("sidecar", [""], sidecar_signals),
            ):
                target = targets[(name, role)]
                for label in labels:
                    sig_ids: dict[str, int] = {}
                    for signal in fn(name, now, now):
                        series = Series(target_id=target.id, engine_label=label, signal=signal)
                        db.add(series)
                        db.flush()
                        sig_ids[signal] = series.id
                    for t in raw_times(last_t, raw_seconds):
                        for signal, value in fn(name, t, now).items():
                            samples.append({"series_id": sig_ids[signal], "ts": t, "value": value})
                    minute = math.floor((last_t - rollup_days * 86400) / 60) * 60
                    while minute <= last_t - 60:
                        for signal, value in fn(name, minute + 30, now).items():
                            rollups.append(
                                {
                                    "series_id": sig_ids[signal],
                                    "ts": float(minute),
                                    "min": value,
                                    "max": value,
                                    "mean": value,
                                    "last": value,
                                    "count": 12,
                                }
                            )
                        minute += 60
        db.flush()
        for chunk in range(0, len(samples), 5000):
            db.execute(insert(Sample), samples[chunk : chunk + 5000])
        for chunk in range(0, len(rollups), 5000):
            db.execute(insert(Rollup1m), rollups[chunk : chunk + 5000])

        for name in ENGINES:
            side = targets[(name, "sidecar")]
            state_ts = now - DOWN_AGO if name == "c" else now - 1.0
            sig = sidecar_signals(name, state_ts, now)
            collapsed = name == "a"
            state = {
                "reuse": {
                    "token_weighted": sig["token_weighted"],
                    "request_weighted": sig["request_weighted"],
                    "divergence": sig["divergence"],
                    "regime": "thin-reuse" if collapsed else "normal",
                    "window_s": 60.0,
                },
                "budgeter": {
                    "mode": "budgeter-park",
                    "low": 0.75,
                    "high": 0.95,
                    "pool_tokens": POOL_TOKENS,
                    "demand_tokens": int(sig["demand_tokens"]),
                },
                "backlog": {
                    "admitted": int(sig["admitted"]),
                    "parked": int(sig["parked"]),
                    "waiting": int(sig["waiting"]),
                },
                "compaction": {"deferred_until": now + 900 if collapsed else None},
                "warnings": ["engine reports no kv_cache_size_tokens; pool from num_gpu_blocks x block_size"]
                if collapsed
                else [],
            }
            db.add(
                SidecarState(
                    target_id=side.id,
                    ts=state_ts,
                    state=state,
                    regime=state["reuse"]["regime"],
                    budgeter_mode="budgeter-park",
                    compaction_deferred_until=state["compaction"]["deferred_until"],
                    warnings=state["warnings"],
                )
            )

        # Sessions: engine a has many, some parked (manual and automatic), some waiting.
        a_side = targets[("a", "sidecar")]
        for i in range(30):
            state = "parked" if i < 6 else ("waiting" if i >= 26 else "admitted")
            sid = NASTY_SESSION if i == 29 else f"agent-{i:03d}"
            db.add(
                Session(
                    target_id=a_side.id,
                    session_id=sid,
                    state=state,
                    context_tokens=10_000 + 1000 * i,
                    turns=1 + i % 17,
                    manual=(i < 2) if state == "parked" else False,
                    pinned=(i == 10),
                    last_cached_fraction=0.08 + 0.01 * (i % 5) if i > 10 else 0.93,
                    present=True,
                    first_seen_ts=now - 3000 + 60 * i,
                    last_seen_ts=now - 1.0,
                    data={
                        "id": sid,
                        "state": state,
                        "arrived_at": now - 3000 + 60 * i,
                        "admitted_at": None if state == "waiting" else now - 2900 + 60 * i,
                        "parked_since": now - 600 + 30 * i if state == "parked" else None,
                        "output_budget": 1024,
                    },
                )
            )
        b_side = targets[("b", "sidecar")]
        for i in range(5):
            db.add(
                Session(
                    target_id=b_side.id,
                    session_id=f"rag-{i}",
                    state="admitted",
                    context_tokens=20_000,
                    turns=4,
                    manual=False,
                    pinned=False,
                    last_cached_fraction=0.9,
                    present=True,
                    first_seen_ts=now - 500,
                    last_seen_ts=now - 1.0,
                    data={
                        "id": f"rag-{i}",
                        "state": "admitted",
                        "admitted_at": now - 500,
                        "output_budget": 1024,
                    },
                )
            )

        for i, (tokens, hits) in enumerate(((6000, 40.0), (3000, 12.0), (2500, 0.0), (8000, 0.5))):
            db.add(
                Subtree(
                    target_id=a_side.id,
                    subtree_id=f"system-prompt-{i}",
                    tokens=tokens,
                    warm=hits > 1,
                    pinned=i == 0,
                    recent_hits=hits,
                    last_hit_ts=now - 5 - 100 * i,
                    present=True,
                    first_seen_ts=now - 5000,
                    last_seen_ts=now - 1.0,
                    data={},
                )
            )

        for i in range(12):
            ts = now - COLLAPSE_AGO + 120 * i
            granted = i in (0, 1)
            db.add(
                CompactionDecision(
                    target_id=a_side.id,
                    remote_id=i + 1,
                    ts=ts,
                    subtree_id=f"system-prompt-{i % 4}",
                    decision="granted" if granted else "deferred",
                    granted=granted,
                    reason="subtree cold, D below threshold"
                    if granted
                    else "thin-reuse regime (D=0.80 above 0.50) and warm targets",
                    divergence=0.2 if granted else 0.8,
                    data={},
                )
            )

        audit = [
            AuditEntry(
                source="sidecar",
                target_id=a_side.id,
                remote_id=1,
                ts=now - 20 * 60,
                actor="alice",
                action="park",
                params={"session_id": "agent-000"},
                outcome="ok",
                data={"before": {"state": "admitted"}, "after": {"state": "parked"}},
            ),
            AuditEntry(
                source="sidecar",
                target_id=a_side.id,
                remote_id=2,
                ts=now - 19 * 60,
                actor="alice",
                action="compaction.defer",
                params={"minutes": 45},
                outcome="ok",
                data={"before": {"deferred_until": None}, "after": {"deferred_until": now + 900}},
            ),
            AuditEntry(
                source="sidecar",
                target_id=targets[("b", "sidecar")].id,
                remote_id=1,
                ts=now - 3 * 3600,
                actor="bob",
                action="budgeter",
                params={"low": 0.7, "high": 0.9},
                outcome="ok",
                data={"before": {"low": 0.75, "high": 0.95}, "after": {"low": 0.7, "high": 0.9}},
            ),
            AuditEntry(
                source="dashboard",
                target_id=None,
                remote_id=None,
                ts=now - 21 * 60,
                actor="alice",
                action="sign-in",
                params={"method": "passphrase"},
                outcome="ok",
                data={},
            ),
        ]
        db.add_all(audit)
        db.execute(insert(Turn), turn_rows(a_side.id, now, COLLAPSE_AGO))

        db.add_all(
            [
                Alert(
                    rule="collapse",
                    target_id=targets[("a", "sidecar")].id,
                    engine_label="",
                    severity="critical",
                    state="firing",
                    started_ts=now - COLLAPSE_AGO + 120,
                    resolved_ts=None,
                    last_eval_ts=now - 1,
                    summary="engine a collapsed: hit ratio 0.10, backlog 120 and growing",
                    values={"hit_ratio": 0.1, "backlog": 120},
                ),
                Alert(
                    rule="thin-reuse",
                    target_id=targets[("a", "sidecar")].id,
                    engine_label="",
                    severity="warning",
                    state="firing",
                    started_ts=now - COLLAPSE_AGO + 60,
                    resolved_ts=None,
                    last_eval_ts=now - 1,
                    summary="D = 0.80 above 0.50 for 60 s",
                    values={"divergence": 0.8},
                    acknowledged_by="alice",
                    acknowledged_ts=now - 20 * 60,
                ),
                Alert(
                    rule="target-down",
                    target_id=targets[("c", "engine")].id,
                    engine_label="",
                    severity="critical",
                    state="firing",
                    started_ts=now - DOWN_AGO + 5,
                    resolved_ts=None,
                    last_eval_ts=now - 1,
                    summary="engine c is down: ConnectError",
                    values={"consecutive_failures": 600},
                ),
                Alert(
                    rule="demand-over-band",
                    target_id=targets[("b", "sidecar")].id,
                    engine_label="",
                    severity="warning",
                    state="resolved",
                    started_ts=now - 5 * 3600,
                    resolved_ts=now - 4.5 * 3600,
                    last_eval_ts=now - 1,
                    summary="demand 0.97 of pool above high band 0.95",
                    values={"demand_fraction": 0.97},
                ),
            ]
        )
        db.add(
            Silence(
                rule="demand-over-band",
                target_id=targets[("b", "sidecar")].id,
                starts_ts=now - 600,
                ends_ts=now + 3000,
                created_by="bob",
                created_ts=now - 600,
                comment="load test",
            )
        )
        db.add(
            CollectorHeartbeat(
                name="collectors",
                pid=4242,
                host="localhost",
                started_ts=now - 9 * 86400,
                last_beat_ts=now - heartbeat_age,
                targets=6,
                targets_up=4,
                config_path=None,
                info={},
            )
        )
        db.add(CollectorState(key=ROLLUP_WATERMARK_KEY, value=math.floor((now - 120) / 60) * 60))
        db.commit()
    return now


def filled_engine(url: str, now: float | None = None, **kwargs: Any) -> tuple[Engine, float]:
    engine = make_engine(url)
    return engine, fill_database(engine, now, **kwargs)


if __name__ == "__main__":
    target_url = sys.argv[1] if len(sys.argv) > 1 else "data/filled.db"
    if "://" not in target_url:
        target_url = f"sqlite:///{target_url}"
    started = time.perf_counter()
    filled_engine(target_url)
    print(f"filled {target_url} in {time.perf_counter() - started:.1f} s")
