"""A fleet of N engines, each behind a sidecar, for the Overview at fleet scale (issue 13 item 9).

Few signals and a coarse step keep it fast to build (a few seconds for 200 engines), so a browser
test can take a screenshot of the real page. States are spread over the fleet: a few down, collapsed,
queueing at the sidecar and in thin reuse; the rest healthy with R_t spread between 0.6 and 0.95.

    .venv/bin/python -m tests.dashboard.fill_fleet data/fleet.db 200
"""

from __future__ import annotations

import math
import random
import sys
import time
from typing import Any

from sqlalchemy import Engine, insert

from db import make_engine
from db.migrate import upgrade
from db.models import Alert, CollectorHeartbeat, Sample, Series, SidecarState, Target

STEP = 15.0
SPAN = 3600.0
POOL = 400_000


def kind_of(i: int) -> str:
    return (
        "down"
        if i % 40 == 3
        else "collapsed"
        if i % 40 == 7
        else "queueing"
        if i % 40 == 11
        else "thin-reuse"
        if i % 20 == 5
        else "healthy"
    )


def fill_fleet(engine: Engine, n: int = 200, now: float | None = None, seed: int = 0) -> float:
    now = time.time() if now is None else now
    rng = random.Random(seed)
    upgrade(engine)
    times = [now - SPAN + STEP * k for k in range(int(SPAN / STEP) + 1)]
    with engine.begin() as conn:
        samples: list[dict[str, Any]] = []
        for i in range(n):
            kind = kind_of(i)
            down = kind == "down"
            last_ok = now - 600 if down else now - 1
            base = 0.6 + 0.35 * rng.random()
            ids = {}
            for role in ("engine", "sidecar"):
                tid = conn.execute(
                    insert(Target)
                    .values(
                        url=f"http://fleet-{role}-{i}:{8000 if role == 'engine' else 8100}",
                        role=role,
                        kind="vllm" if role == "engine" else "sidecar",
                        configured_kind="vllm" if role == "engine" else "sidecar",
                        name=f"engine-{i}" if role == "engine" else f"sidecar-{i}",
                        labels={"cluster": f"c{i % 4}"},
                        engine_url=f"http://fleet-engine-{i}:8000" if role == "sidecar" else None,
                        configured=True,
                        interval_s=1.0,
                        up=not (down and role == "engine"),
                        last_scrape_ts=now - 1,
                        last_success_ts=last_ok if role == "engine" else now - 1,
                        last_error="ReadTimeout" if down and role == "engine" else None,
                        consecutive_failures=600 if down and role == "engine" else 0,
                        created_ts=now - 86400,
                    )
                    .returning(Target.id)
                ).scalar_one()
                ids[role] = tid
            signals = {
                "engine": ("kv_usage", "up"),
                "sidecar": (
                    "token_weighted",
                    "request_weighted",
                    "divergence",
                    "demand_fraction",
                    "waiting",
                    "up",
                ),
            }
            for role, names in signals.items():
                for name in names:
                    sid = conn.execute(
                        insert(Series)
                        .values(
                            target_id=ids[role],
                            engine_label="0" if role == "engine" and name != "up" else "",
                            signal=name,
                        )
                        .returning(Series.id)
                    ).scalar_one()
                    for t in times:
                        if role == "engine" and down and t > last_ok:
                            continue
                        late = t > now - 900
                        rt = 0.1 if kind == "collapsed" and late else base + 0.02 * math.sin(t / 300 + i)
                        value = {
                            "token_weighted": rt,
                            "request_weighted": 0.93,
                            "divergence": 0.93 - rt,
                            "demand_fraction": 1.05
                            if kind == "collapsed" and late
                            else 0.5 + 0.3 * rng.random(),
                            "waiting": 14.0 if kind == "queueing" and late else 0.0,
                            "kv_usage": 0.5 + 0.3 * rng.random(),
                            "up": 0.0 if down and role == "engine" and t > last_ok else 1.0,
                        }[name]
                        samples.append({"series_id": sid, "ts": t, "value": value})
            rt_now = 0.1 if kind == "collapsed" else base
            regime = "thin-reuse" if kind in ("thin-reuse", "collapsed") else "normal"
            if kind == "thin-reuse":
                rt_now = 0.35
            waiting = 14 if kind == "queueing" else 0
            conn.execute(
                insert(SidecarState).values(
                    target_id=ids["sidecar"],
                    ts=now - 1,
                    regime=regime,
                    budgeter_mode="budgeter-park",
                    warnings=[],
                    state={
                        "reuse": {
                            "token_weighted": rt_now,
                            "request_weighted": 0.93,
                            "divergence": 0.93 - rt_now,
                            "regime": regime,
                        },
                        "budgeter": {"mode": "budgeter-park", "low": 0.75, "high": 0.95, "pool_tokens": POOL},
                        "backlog": {
                            "admitted": 12,
                            "parked": 0,
                            "waiting": waiting,
                            "oldest_waiting_s": 95.0 if waiting else None,
                            "oldest_parked_s": None,
                        },
                    },
                )
            )
            for rule, when in (
                ("collapse", kind == "collapsed"),
                ("admission-wait", kind == "queueing"),
                ("target-down", down),
            ):
                if when:
                    conn.execute(
                        insert(Alert).values(
                            rule=rule,
                            target_id=ids["engine" if rule == "target-down" else "sidecar"],
                            engine_label="",
                            severity="critical" if rule != "admission-wait" else "warning",
                            state="firing",
                            started_ts=now - 600,
                            last_eval_ts=now,
                            summary=f"{rule} on engine-{i}",
                            values={},
                        )
                    )
        for k in range(0, len(samples), 20000):
            conn.execute(insert(Sample), samples[k : k + 20000])
        conn.execute(
            insert(CollectorHeartbeat).values(
                name="collectors",
                pid=1,
                host="fleet",
                started_ts=now - 86400,
                last_beat_ts=now - 1,
                targets=2 * n,
                targets_up=2 * n,
                info={},
            )
        )
    return now


if __name__ == "__main__":
    path, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200
    started = time.perf_counter()
    fill_fleet(make_engine(f"sqlite:///{path}"), count)
    print(f"{path}: {count} engines in {time.perf_counter() - started:.1f} s")
