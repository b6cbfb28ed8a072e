"""db.queries.turns: stored turns, and missed tokens by cause from turns, granted compactions and demand samples."""

from __future__ import annotations

from sqlalchemy import insert

from db import make_engine, queries
from db.migrate import upgrade
from db.models import CompactionDecision, Sample, Series, Target, Turn

T0 = 1_800_000_000.0


def test_missed_tokens_by_cause_per_bucket_and_per_session(db_url):
    engine = make_engine(db_url)
    upgrade(engine)
    with engine.begin() as conn:
        a, b = (
            conn.execute(
                insert(Target).values(
                    url=u,
                    role="sidecar",
                    kind="sidecar",
                    configured_kind="sidecar",
                    labels={},
                    configured=True,
                    interval_s=1.0,
                    up=True,
                    consecutive_failures=0,
                    created_ts=T0,
                )
            ).inserted_primary_key[0]
            for u in ("http://a", "http://b")
        )
        n = iter(range(1, 100))

        def turn(target: int, ts: float, session: str, prompt: int, cached: int, **kw: object) -> dict:
            return {
                "target_id": target,
                "epoch": 0,
                "remote_id": next(n),
                "ts": T0 + ts,
                "session_id": session,
                "subtree_id": kw.get("subtree"),
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "completion_tokens": 160,
                "held_s": kw.get("parked", 0.0),
                "parked_s": kw.get("parked", 0.0),
                "latency_s": 0.1,
                "outcome": kw.get("outcome", "ok"),
                "model": None,
            }

        conn.execute(
            insert(Turn),
            [
                turn(a, 0, "s1", 1000, 0),  # cold 1000 (before the window: not counted)
                turn(a, 70, "s1", 2000, 1152),  # context 1000+160-1 = 1159: 72 blocks (1152), new 841, tail 7
                turn(b, 80, "s1", 3000, 0),  # previous turn on sidecar a: routed-away
                turn(a, 90, "s2", 500, 0),  # cold
                turn(a, 95, "s2", 1000, 0, parked=30.0),  # parked between turns
                turn(a, 130, "s3", 800, 0, subtree="doc"),  # cold
                turn(a, 170, "s3", 1800, 0, subtree="doc"),  # compaction granted at 150
                turn(a, 175, "s4", 100, 0, outcome="held_503"),  # never reached the engine: ignored
            ],
        )
        conn.execute(
            insert(CompactionDecision).values(
                target_id=a, epoch=0, remote_id=1, ts=T0 + 150, subtree_id="doc", decision="granted", data={}
            )
        )
        sid = conn.execute(
            insert(Series).values(target_id=a, engine_label="", signal="demand_fraction")
        ).inserted_primary_key[0]
        conn.execute(
            insert(Sample),
            [{"series_id": sid, "ts": T0 + t, "value": v} for t, v in ((0, 0.5), (40, 1.2), (50, 0.9))],
        )
    with engine.connect() as conn:
        assert [t["session_id"] for t in queries.turns(conn, target_id=b)] == ["s1"]
        assert queries.pressure_intervals(conn, T0, T0 + 200) == [(T0 + 40, T0 + 50)]
        out = queries.miss_attribution(
            conn,
            sidecar_ids=[a, b],
            start_ts=T0 + 60,
            end_ts=T0 + 180,
            bucket_s=60,
            engine_hits={T0 + 60: 2000.0, T0 + 120: 0.0},
        )
        only_a = queries.miss_attribution(
            conn, sidecar_ids=[a], start_ts=T0 + 60, end_ts=T0 + 180, bucket_s=60
        )
    b1, b2 = out["buckets"]
    assert (
        b1["ts"],
        b1["cached"],
        b1["new"],
        b1["partial-block"],
        b1["routed-away"],
        b1["cold"],
        b1["evicted-parked"],
    ) == (T0 + 60, 1152, 841 + 841 + 341, 7 + 15 + 3, 2144, 500, 656)
    assert b1["recomputed"] == 2000 - 1152
    assert (b2["cold"], b2["new"], b2["partial-block"], b2["prefix-changed"], b2["recomputed"]) == (
        800,
        1800 - 959,
        15,
        944,
        0.0,
    )
    # s1 context before its routed turn: 2000 + 160 - 1 = 2159 = 134 full blocks (2144) and 15 tokens
    assert out["totals"]["unattributed"] == 0 and out["totals"]["evicted-pressure"] == 0
    assert [s["session"] for s in out["sessions"]] == ["s1", "s3", "s2"]
    assert [s["missed"] for s in out["sessions"]] == [2144, 800 + 944, 500 + 656]
    assert only_a["totals"]["routed-away"] == 0 and only_a["buckets"][0]["recomputed"] is None
    engine.dispose()
