"""core/compaction.py: the compaction gate never acts on request counts; warmth, regime, deferral, pressure."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.compaction import (
    CompactionConfigError,
    CompactionPolicy,
    SubtreeStats,
    SubtreeTracker,
    WarmthConfig,
    decide_compaction,
    pinned_subtrees,
)


def sub(sid: str, hits: int, cached: int = 0, turns: int = 0, floor: int = 3) -> SubtreeStats:
    return SubtreeStats(sid, turns or hits, cached * 2, cached, hits, cached, cached * 2, hits >= floor, 0.0)


STATS = {
    "hot": sub("hot", 10, 60_000),
    "warm": sub("warm", 4, 20_000),
    "cold": sub("cold", 1, 500),
    "idle": sub("idle", 0, 0),
}


def verdicts(targets: list[str], **kw: object) -> dict[str, str]:
    args: dict[str, object] = dict(regime="normal", urgency="normal", now=100.0, deferred_until=None)
    args.update(kw)
    return {d.subtree_id: d.decision for d in decide_compaction(targets, STATS, **args)}  # type: ignore[arg-type]


def test_normal_grants_cold_and_defers_warm() -> None:
    assert verdicts(["hot", "cold", "idle", "never-seen"]) == {
        "hot": "deferred",
        "cold": "granted",
        "idle": "granted",
        "never-seen": "granted",
    }


def test_thin_reuse_with_a_warm_target_defers_everything() -> None:
    assert verdicts(["cold", "warm"], regime="thin-reuse") == {"cold": "deferred", "warm": "deferred"}


def test_thin_reuse_with_only_cold_targets_grants() -> None:
    assert verdicts(["cold", "idle"], regime="thin-reuse") == {"cold": "granted", "idle": "granted"}


def test_storage_pressure_keeps_top_k_hottest_even_in_thin_reuse() -> None:
    policy = CompactionPolicy(top_k_pinned=2)
    got = verdicts(
        ["hot", "warm", "cold", "idle"], urgency="storage-pressure", regime="thin-reuse", policy=policy
    )
    assert got == {"hot": "deferred", "warm": "deferred", "cold": "granted", "idle": "granted"}


def test_operator_deferral_overrides_everything_until_it_ends() -> None:
    for urgency in ("normal", "storage-pressure"):
        assert set(verdicts(["cold", "idle"], urgency=urgency, deferred_until=200.0).values()) == {"deferred"}
    assert verdicts(["cold"], deferred_until=100.0) == {"cold": "granted"}


def test_every_decision_has_a_reason() -> None:
    for d in decide_compaction(
        ["hot", "cold"], STATS, regime="thin-reuse", urgency="normal", now=0, deferred_until=None
    ):
        assert d.reason


def test_unknown_urgency_is_rejected() -> None:
    with pytest.raises(CompactionConfigError, match="urgency"):
        decide_compaction(["a"], {}, regime="normal", urgency="panic", now=0, deferred_until=None)  # type: ignore[arg-type]


stats_strategy = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.tuples(st.integers(0, 10), st.integers(0, 100_000), st.integers(1, 10_000), st.integers(0, 2)),
    max_size=5,
).map(lambda d: {k: dataclasses.replace(sub(k, h, c, t), in_flight=f) for k, (h, c, t, f) in d.items()})


@settings(max_examples=300, deadline=None)
@given(
    stats_strategy,
    st.lists(st.sampled_from(["a", "b", "c", "d", "e", "z"]), min_size=1, max_size=6),
    st.sampled_from(["normal", "thin-reuse"]),
    st.sampled_from(["normal", "storage-pressure"]),
    st.integers(1, 10_000),
)
def test_decisions_never_depend_on_request_counts(
    stats: dict[str, SubtreeStats], targets: list[str], regime: str, urgency: str, scale: int
) -> None:
    """Multiplying every subtree's turn count changes nothing: the gate reads tokens and warmth only."""
    scaled = {k: dataclasses.replace(v, turns=v.turns * scale) for k, v in stats.items()}
    kw: dict[str, object] = dict(regime=regime, urgency=urgency, now=0.0, deferred_until=None)
    a = decide_compaction(targets, stats, **kw)  # type: ignore[arg-type]
    b = decide_compaction(targets, scaled, **kw)  # type: ignore[arg-type]
    assert [d.decision for d in a] == [d.decision for d in b]


@settings(max_examples=300, deadline=None)
@given(
    stats_strategy,
    st.lists(st.sampled_from(["a", "b", "c", "d", "e", "z"]), min_size=1, max_size=6),
    st.sampled_from(["normal", "thin-reuse"]),
    st.integers(0, 4),
)
def test_invariants(stats: dict[str, SubtreeStats], targets: list[str], regime: str, k: int) -> None:
    normal = decide_compaction(targets, stats, regime=regime, urgency="normal", now=0.0, deferred_until=None)
    assert len(normal) == len(targets)
    for d in normal:
        if d.decision == "granted":
            assert not d.warm  # a warm subtree is never granted under normal urgency
            s = stats.get(d.subtree_id)
            assert s is None or s.in_flight == 0  # nor one with a turn in flight
    if regime == "thin-reuse" and any(d.warm for d in normal):
        assert all(d.decision == "deferred" for d in normal)
    pressure = decide_compaction(
        targets,
        stats,
        regime=regime,
        urgency="storage-pressure",
        now=0.0,
        deferred_until=None,
        policy=CompactionPolicy(top_k_pinned=k),
    )
    pinned = set(pinned_subtrees(stats, k))
    assert len(pinned) <= k
    for d in pressure:
        assert (d.decision == "deferred") == (d.subtree_id in pinned)


def test_tracker_warmth_follows_recent_hits() -> None:
    tracker = SubtreeTracker(WarmthConfig(window_s=60, floor=3))
    for t in (0, 1, 2):
        tracker.record("rag", t, 6000, 5000)
    tracker.record("rag", 3, 6000, None)  # unknown: neither hit nor miss
    s = tracker.get("rag", 3)
    assert s is not None and s.warm and s.recent_hits == 3 and s.turns == 4
    assert s.prompt_tokens == 18000 and s.cached_tokens == 15000
    later = tracker.get("rag", 63.0)
    assert later is not None and not later.warm and later.recent_hits == 0
    assert later.turns == 4  # lifetime totals stay


def test_a_cold_subtree_with_a_turn_in_flight_is_deferred_in_either_regime() -> None:
    """The turn in flight is loading the subtree's blocks: a rewrite would waste that prefill."""
    stats = {**STATS, "loading": dataclasses.replace(STATS["cold"], subtree_id="loading", in_flight=1)}
    for regime in ("normal", "thin-reuse"):
        got = decide_compaction(
            ["loading", "idle"], stats, regime=regime, urgency="normal", now=0.0, deferred_until=None
        )
        assert [(d.subtree_id, d.decision, d.reason) for d in got] == [
            ("loading", "deferred", "cold (1 recent cache hits) but 1 turn(s) in flight loading its blocks"),
            ("idle", "granted", "cold: 0 recent cache hits"),
        ]
    # storage pressure does not wait for it
    pressure = decide_compaction(
        ["loading"],
        stats,
        regime="normal",
        urgency="storage-pressure",
        now=0.0,
        deferred_until=None,
        policy=CompactionPolicy(top_k_pinned=0),
    )
    assert pressure[0].decision == "granted"


def test_tracker_counts_turns_in_flight_until_they_end_or_one_window_passes() -> None:
    tracker = SubtreeTracker(WarmthConfig(window_s=60, floor=3))
    tracker.begin("rag", 10.0)
    tracker.begin("rag", 20.0)
    s = tracker.get("rag", 21.0)
    assert s is not None and (s.in_flight, s.turns, s.warm) == (2, 0, False)
    assert s.as_dict()["in_flight"] == 2
    tracker.end("rag")
    tracker.record("rag", 22.0, 6000, 5000)
    s = tracker.get("rag", 22.0)
    assert s is not None and (s.in_flight, s.turns, s.recent_hits) == (1, 1, 1)
    # the other one never ends: it stops counting one warmth window after it began
    s = tracker.get("rag", 79.9)
    assert s is not None and s.in_flight == 1
    s = tracker.get("rag", 80.0)
    assert s is not None and s.in_flight == 0
    tracker.end("rag")  # a late end changes nothing
    tracker.end("never-begun")
    s = tracker.get("rag", 80.0)
    assert s is not None and s.in_flight == 0 and tracker.get("never-begun", 80.0) is None


def test_tracker_misses_do_not_warm() -> None:
    tracker = SubtreeTracker(WarmthConfig(window_s=60, floor=2))
    for t in range(10):
        tracker.record("storm", t, 100, 0)
    s = tracker.get("storm", 10)
    assert s is not None and not s.warm and s.recent_hits == 0


def test_tracker_is_bounded() -> None:
    tracker = SubtreeTracker(max_subtrees=3)
    for i in range(10):
        tracker.record(f"s{i}", i, 10, 5)
    assert len(tracker) == 3 and set(tracker.stats(10)) == {"s7", "s8", "s9"}


@pytest.mark.parametrize("kwargs", [dict(window_s=0), dict(window_s=float("nan")), dict(floor=0)])
def test_warmth_config_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(CompactionConfigError):
        WarmthConfig(**kwargs)  # type: ignore[arg-type]
