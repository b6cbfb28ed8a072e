"""core.attribution: exact splits of uncached tokens by cause."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.attribution import (
    CAUSES,
    Attributor,
    Events,
    Turn,
    attribute,
    attribute_all,
    recomputed_hits,
    split_uncached,
    totals,
)

NO_EVENTS = Events()


def turn(ts: float, prompt: int, cached: int | None, completion: int = 100, **kw: object) -> Turn:
    return Turn(
        ts=ts,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        session=kw.pop("session", "s1"),
        **kw,
    )  # type: ignore[arg-type]


def test_first_turn_of_a_session_is_cold() -> None:
    assert attribute(turn(0, 5000, 0), None, NO_EVENTS) == {"cold": 5000}
    assert attribute(turn(0, 5000, 4096), None, NO_EVENTS) == {"cold": 904}


def test_unknown_cached_count_is_never_a_miss() -> None:
    assert attribute(turn(5, 5000, None), turn(0, 4000, 4000), NO_EVENTS) == {}


def test_healthy_turn_is_new_tokens_and_the_partial_block_tail() -> None:
    prev = turn(0, 5000, 4992, completion=151)  # context 5150 -> 321 full blocks = 5136
    now = turn(10, 6150, 5136)
    assert attribute(now, prev, NO_EVENTS) == {"new": 1000, "partial-block": 14}


def test_missing_reusable_tokens_go_to_the_first_cause_that_applies() -> None:
    prev = turn(0, 5000, 4992, completion=153)  # context 5000 + 153 - 1 = 5152 = 322 blocks exactly
    now = turn(10, 6152, 0)
    base = {"new": 1000}
    assert attribute(now, prev, NO_EVENTS) == {**base, "unattributed": 5152}
    pressure = Events(pressure=[(4.0, 6.0)])
    assert attribute(now, prev, pressure) == {**base, "evicted-pressure": 5152}
    parked = turn(10, 6152, 0, parked_s=30.0)
    assert attribute(parked, prev, pressure) == {**base, "evicted-parked": 5152}
    moved = turn(10, 6152, 0, parked_s=30.0, sidecar="b")
    assert attribute(moved, prev, pressure) == {**base, "routed-away": 5152}
    rewritten = Events(prefix_changes={"doc": [5.0]}, pressure=[(4.0, 6.0)])
    compacted = turn(10, 6152, 0, parked_s=30.0, sidecar="b", subtree="doc")
    assert attribute(compacted, turn(0, 5000, 4992, completion=153, subtree="doc"), rewritten) == {
        **base,
        "prefix-changed": 5152,
    }


def test_events_outside_the_gap_between_turns_do_not_count() -> None:
    prev, now = turn(10, 5000, 4992, completion=153), turn(20, 6152, 2000)
    before = Events(prefix_changes={"doc": [9.0]}, pressure=[(2.0, 9.5)])
    after = Events(prefix_changes={"doc": [21.0]}, pressure=[(20.5, 30.0)])
    for events in (before, after):
        out = attribute(Turn(**{**now.__dict__, "subtree": "doc"}), prev, events)
        assert out == {"new": 1000, "unattributed": 3152}


def test_sessionless_turns_learn_their_subtree_prefix() -> None:
    a = Attributor(Events(prefix_changes={"kb": [25.0]}), block_size=16)
    rag = dict(session=None, subtree="kb", completion=50)
    assert a.add(turn(0, 7000, 0, **rag)) == {"cold": 7000}  # never served: cold
    assert a.add(turn(1, 7200, 6000, **rag)) == {"new": 1200}  # shared 6000 learnt
    assert a.add(turn(2, 6500, 2000, **rag)) == {"new": 500, "unattributed": 4000}
    assert a.add(turn(30, 6500, 0, **rag)) == {"new": 500, "prefix-changed": 6000}  # rewritten at 25
    assert a.add(turn(31, 6500, 6000, **rag)) == {"new": 500}  # re-learnt after the rewrite


def test_a_session_without_a_subtree_or_history_and_no_session_is_cold() -> None:
    assert attribute_all([turn(0, 300, 0, session=None)]) == [{"cold": 300}]


def test_attribute_all_sorts_by_time_and_tracks_sessions_across_sidecars() -> None:
    turns = [turn(10, 6152, 0, sidecar="b"), turn(0, 5000, 4992, completion=153, sidecar="a")]
    assert attribute_all(turns) == [{"cold": 8}, {"new": 1000, "routed-away": 5152}]


def test_totals_has_every_cause() -> None:
    assert totals([{"new": 3}, {"new": 2, "cold": 1}]) == {**dict.fromkeys(CAUSES, 0), "new": 5, "cold": 1}


def test_recomputed_hits() -> None:
    assert recomputed_hits(1200.0, 1000.0) == 200.0
    assert recomputed_hits(900.0, 1000.0) == 0.0
    assert recomputed_hits(None, 1000.0) is None


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block_size must be positive, got 0"):
        split_uncached(100, 0, 50, 0, "unattributed")


@given(
    prompt=st.integers(0, 50_000),
    cached=st.integers(0, 50_000),
    reusable=st.integers(0, 60_000),
    block=st.sampled_from([1, 16, 32]),
    cause=st.sampled_from(CAUSES),
)
def test_parts_always_add_up_to_the_uncached_count(
    prompt: int, cached: int, reusable: int, block: int, cause: str
) -> None:
    cached = min(cached, prompt)
    parts = split_uncached(prompt, cached, reusable, block, cause)
    assert sum(parts.values()) == prompt - cached
    assert all(v > 0 for v in parts.values())


def test_the_last_generated_token_has_no_kv() -> None:
    """The engine holds KV for prompt + completion - 1 tokens: the last sampled token is never computed."""
    assert turn(0, 5000, 0, completion=153).context == 5152
    assert turn(0, 5000, 0, completion=0).context == 5000
    # 5000 + 152 - 1 = 5151: 321 full blocks (5136) and a 15-token partial block, not 5152 = 322 blocks
    prev = turn(0, 5000, 4992, completion=152)
    assert attribute(turn(10, 6152, 5136), prev, NO_EVENTS) == {"new": 1001, "partial-block": 15}


def test_a_rewrite_after_the_turn_started_does_not_change_its_prefix() -> None:
    prev = turn(0, 5000, 4992, completion=153, subtree="doc")
    now = turn(20, 6152, 2000, subtree="doc", latency_s=5.0)  # forwarded at 15
    assert attribute(now, prev, Events(prefix_changes={"doc": [16.0]})) == {"new": 1000, "unattributed": 3152}
    assert attribute(now, prev, Events(prefix_changes={"doc": [14.0]})) == {
        "new": 1000,
        "prefix-changed": 3152,
    }


def test_sessionless_turns_started_before_the_new_version_was_computed_are_prefix_changed() -> None:
    """Rewritten at 25: turns forwarded before the first turn of the new version finished (31) could not
    reuse it; their missing prefix is the rewrite's, not their own new tokens."""
    a = Attributor(Events(prefix_changes={"kb": [25.0]}), block_size=16)
    rag = dict(session=None, subtree="kb", completion=50)
    assert a.add(turn(1, 7000, 0, **rag)) == {"cold": 7000}
    assert a.add(turn(3, 7000, 6000, latency_s=1.0, **rag)) == {"new": 1000}  # learnt 6000
    assert a.add(turn(31, 7000, 1024, latency_s=5.0, **rag)) == {"new": 1000, "prefix-changed": 4976}
    # forwarded at 27, before the version's first turn finished at 31: still the rewrite
    assert a.add(turn(32, 7000, 1024, latency_s=5.0, **rag)) == {"new": 1000, "prefix-changed": 4976}
    # forwarded at 33, after it: the new version could be reused (its prefix length is not learnt from
    # the two turns above, which found only the 1024-token preamble)
    assert a.add(turn(34, 7000, 1024, latency_s=1.0, **rag)) == {"new": 1000, "unattributed": 4976}


def test_old_version_turns_finishing_after_a_rewrite_do_not_stand_for_the_new_version() -> None:
    a = Attributor(Events(prefix_changes={"kb": [25.0]}), block_size=16)
    rag = dict(session=None, subtree="kb", completion=50)
    a.add(turn(1, 7000, 0, **rag))
    a.add(turn(3, 7000, 6000, latency_s=1.0, **rag))
    assert a.add(turn(26, 7000, 6000, latency_s=2.0, **rag)) == {"new": 1000}  # forwarded at 24: old version
    assert a.add(turn(30, 7000, 1024, latency_s=2.0, **rag)) == {"new": 1000, "prefix-changed": 4976}


def test_a_turn_forwarded_at_the_instant_of_a_rewrite_was_built_before_it() -> None:
    events = Events(prefix_changes={"kb": [10.0]})
    assert not events.changed("kb", 5.0, 10.0) and events.changed("kb", 5.0, 10.5)
    assert events.last_change("kb", 10.0) is None and events.last_change("kb", 10.5) == 10.0
