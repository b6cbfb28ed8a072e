import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.budgeter import (
    ADMITTED,
    CONTROLS,
    PARKED,
    WAITING,
    Budgeter,
    BudgeterConfig,
    ConfigError,
    UnknownSession,
)

POOL = 100_000


def budgeter(mode="budgeter-park", **kw):
    return Budgeter(BudgeterConfig(mode=mode, **kw), pool_tokens=POOL)


def finish(b, sid, now, prompt, completion=0, latency=1.0):
    b.turn_finished(sid, now, prompt, completion, latency)


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"low": 0.9, "high": 0.8}, "low band must be below high band, got 0.9 >= 0.8"),
        ({"low": 0.0}, "low band must be between 0 and 1"),
        ({"high": 1.5}, "high band must be above 0 and at most 1"),
        ({"low": float("nan")}, "low must be a finite number"),
        ({"high": "NaN"}, "high must be a number, got 'NaN'"),
        ({"low": True}, "low must be a number"),
        ({"mode": "yolo"}, "mode must be one of"),
        ({"session_cap": 0}, "session_cap must be at least 1"),
        ({"bands": 1}, "unknown budgeter setting 'bands'"),
    ],
)
def test_invalid_settings_are_rejected_with_field_and_value(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        BudgeterConfig().replace(**changes)


def test_defaults_are_the_published_bands():
    config = BudgeterConfig()
    assert (config.mode, config.low, config.high) == ("budgeter-park", 0.75, 0.95)
    assert set(CONTROLS) == {"off", "admission-only", "latency-park", "session-cap-park", "budgeter-park"}


# ------------------------------------------------------------------ admission and demand
def test_demand_counts_context_or_inflight_prompt_plus_output_budget():
    b = budgeter()
    assert b.request_turn("a", 0.0, 10_000, 500) == "forward"
    assert b.demand_tokens() == 10_500
    finish(b, "a", 1.0, 10_000, 300)
    assert b.demand_tokens() == 10_300 + 500
    b.add_unsessioned("r1", 2_000)
    assert b.demand_tokens() == 12_800
    b.remove_unsessioned("r1")
    assert b.demand_tokens() == 10_800


def test_new_sessions_wait_above_low_band_and_are_admitted_fifo_when_demand_falls():
    b = budgeter()
    assert b.request_turn("a", 0.0, 70_000, 1_000) == "forward"
    assert b.request_turn("b", 1.0, 10_000, 1_000) == "forward"  # demand 71k < 75k
    assert b.request_turn("c", 2.0, 10_000, 1_000) == "hold"  # demand 82k >= 75k
    assert b.request_turn("d", 3.0, 1_000, 0) == "hold"  # FIFO: behind c
    assert b.session("c").state == WAITING
    finish(b, "a", 4.0, 70_000, 100)
    b.end_session("a", 4.0)
    assert b.release(5.0) == ["c", "d"]
    assert b.session("c").state == ADMITTED


def test_request_during_a_turn_in_flight_is_never_held():
    b = budgeter()
    b.request_turn("a", 0.0, 60_000, 0)
    assert b.request_turn("b", 0.0, 1_000, 0) == "forward"
    b.request_turn("a", 0.1, 94_500, 0)  # a's own turn grows demand over the high band
    assert b.park_set() == ["b"]
    # b is in the park set, but a second request of its current turn goes through
    assert b.request_turn("b", 0.5, 2_000, 0) == "forward"


def test_parks_newest_admitted_at_turn_boundary_above_high_band():
    b = budgeter()
    for i, sid in enumerate(["old", "mid", "new"]):
        assert b.request_turn(sid, float(i), 20_000, 1_000) == "forward"
        finish(b, sid, float(i) + 0.5, 20_000, 100)
    # old and mid grow: 2 x (45k + 1k) + 21.1k = 113.1k, over the high band (95k)
    for sid in ["old", "mid"]:
        assert b.request_turn(sid, 9.0, 44_000, 1_000) == "forward"
        finish(b, sid, 9.5, 44_000, 1_000)
    assert b.park_set() == ["new"]
    assert b.request_turn("old", 10.0, 46_000, 1_000) == "forward"  # oldest keeps going
    assert b.request_turn("new", 11.0, 21_000, 1_000) == "hold"
    assert b.session("new").state == PARKED
    assert b.session("new").parked_since == 11.0


def test_parked_session_readmitted_before_new_sessions_with_original_admission_time():
    b = budgeter()
    b.request_turn("a", 0.0, 60_000, 0)
    b.request_turn("b", 1.0, 10_000, 0)
    finish(b, "a", 2.0, 60_000)
    finish(b, "b", 2.0, 50_000)  # b grows: demand 110k > 95k
    assert b.request_turn("b", 3.0, 51_000, 0) == "hold"  # b is newest: parked
    assert b.request_turn("c", 4.0, 1_000, 0) == "hold"  # new session queues behind parked b
    b.end_session("a", 5.0)
    assert b.release(6.0) == ["b", "c"]
    assert b.session("b").admitted_at == 1.0


def test_manual_park_holds_until_manual_unpark_even_when_demand_is_low():
    b = budgeter()
    b.request_turn("a", 0.0, 1_000, 0)
    finish(b, "a", 1.0, 1_000)
    b.park("a", 2.0)
    assert b.request_turn("a", 3.0, 2_000, 0) == "hold"
    assert b.release(4.0) == []
    assert b.unpark("a", 5.0, pin=True) is True
    s = b.session("a")
    assert (s.state, s.pinned, s.manual, s.inflight) == (ADMITTED, True, False, 1)


def test_manual_unpark_admits_above_the_band_and_pin_exempts_from_parking():
    b = budgeter()
    b.request_turn("a", 0.0, 90_000, 0)
    b.request_turn("b", 1.0, 30_000, 0)  # waiting: demand 90k > 75k
    assert b.session("b").state == WAITING
    assert b.unpark("b", 2.0, pin=True) is True
    finish(b, "b", 3.0, 30_000)
    assert "b" not in b.park_set()
    assert b.request_turn("b", 4.0, 31_000, 0) == "forward"


def test_unknown_session_in_operator_action():
    b = budgeter()
    with pytest.raises(UnknownSession, match="unknown session 'ghost'"):
        b.park("ghost", 0.0)
    with pytest.raises(UnknownSession):
        b.unpark("ghost", 0.0)


def test_failed_turn_leaves_context_unchanged():
    b = budgeter()
    b.request_turn("a", 0.0, 5_000, 0)
    finish(b, "a", 1.0, 5_000, 100)
    b.request_turn("a", 2.0, 6_000, 0)
    b.turn_finished("a", 3.0, 6_000, 0, ok=False)
    s = b.session("a")
    assert (s.context_tokens, s.turns, s.inflight_prompt) == (5_100, 1, 0)


def test_cap_demand_lowers_output_budgets_only_and_keeps_totals_exact():
    b = budgeter()
    b.request_turn("a", 0.0, 5_000, 10**12)
    b.request_turn("b", 0.0, 100, 50)
    assert b.cap_demand(95_000) == ["a"]
    assert b.session("a").output_budget == 90_000 and b.session("b").output_budget == 50
    assert b.demand_tokens() == 95_000  # b waits: demand counts admitted sessions


def test_failed_turn_takes_its_output_budget_out_of_demand():
    b = budgeter()
    b.request_turn("a", 0.0, 5_000, 10**12)
    assert b.demand_tokens() == 5_000 + 10**12
    b.turn_finished("a", 1.0, 0, 0, ok=False)
    assert b.demand_tokens() == 0 and b.session("a").output_budget == 0


def test_no_pool_means_token_bands_do_not_act():
    b = Budgeter(BudgeterConfig(), pool_tokens=None)
    for i in range(50):
        assert b.request_turn(f"s{i}", float(i), 100_000, 0) == "forward"
    assert b.park_set() == []


def test_session_cap_park():
    b = budgeter("session-cap-park", session_cap=2)
    assert [b.request_turn(s, float(i), 100, 0) for i, s in enumerate("abc")] == [
        "forward",
        "forward",
        "hold",
    ]
    b.set_config(b.config.replace(session_cap=1))
    for sid in "ab":
        finish(b, sid, 5.0, 100)
    assert b.park_set() == ["b"]
    assert b.request_turn("b", 6.0, 200, 0) == "hold"


def test_latency_park_parks_when_turns_are_slow_and_readmits_one_per_finished_turn():
    b = budgeter("latency-park", latency_limit_s=2.0, latency_window=3)
    for i, sid in enumerate("abcd"):
        b.request_turn(sid, float(i), 100, 0)
    for sid in "abcd":
        b.turn_finished(sid, 10.0, 100, 10, latency_s=5.0)
    assert b.park_set() == ["d"]
    assert b.request_turn("d", 11.0, 200, 0) == "hold"
    for sid in "abc":
        b.request_turn(sid, 11.0, 200, 0)
        b.turn_finished(sid, 12.0, 200, 10, latency_s=0.5)
    assert b.release(13.0) == ["d"]


def test_admission_only_never_parks_sessions_inside():
    b = budgeter("admission-only")
    b.request_turn("a", 0.0, 200_000, 0)
    finish(b, "a", 1.0, 200_000)
    assert b.request_turn("a", 2.0, 201_000, 0) == "forward"
    assert b.request_turn("b", 3.0, 10, 0) == "hold"


def test_switching_to_off_releases_everyone():
    b = budgeter()
    b.request_turn("a", 0.0, 99_000, 0)
    b.request_turn("b", 1.0, 1_000, 0)
    b.set_config(b.config.replace(mode="off"))
    assert b.release(2.0) == ["b"]


def test_idle_sessions_expire_but_manual_parks_do_not():
    b = budgeter()
    b.request_turn("a", 0.0, 100, 0)
    finish(b, "a", 1.0, 100)
    b.request_turn("m", 0.0, 100, 0)
    finish(b, "m", 1.0, 100)
    b.park("m", 2.0)
    assert b.idle_sessions(700.0, 600.0) == ["a"]


def test_restart_round_trip_keeps_overrides_and_context():
    b = budgeter(low=0.6, high=0.8)
    b.request_turn("a", 0.0, 5_000, 0)
    finish(b, "a", 1.0, 5_000, 100)
    b.request_turn("b", 0.0, 100, 0)
    b.park("b", 2.0)
    b.request_turn("c", 0.0, 100, 0)
    b.unpark("c", 3.0, pin=True)
    restored = Budgeter.from_dict(b.to_dict())
    assert restored.config == b.config
    assert restored.counts() == b.counts()
    assert restored.session("a").context_tokens == 5_100
    assert restored.session("b").manual and restored.session("b").state == PARKED
    assert restored.session("c").pinned
    # a's context survives; c's prompt in flight died with the process; b is parked
    assert restored.demand_tokens() == 5_100


def test_preview_does_not_change_the_budgeter():
    b = budgeter()
    b.request_turn("a", 0.0, 50_000, 0)
    b.request_turn("b", 1.0, 20_000, 0)
    finish(b, "a", 2.0, 50_000)
    finish(b, "b", 2.0, 20_000)
    before = b.to_dict()
    preview = b.preview(b.config.replace(low=0.5, high=0.6), 3.0)
    assert preview.would_park == ["b"]
    assert b.to_dict() == before


# ------------------------------------------------------------------ properties
event = st.one_of(
    st.tuples(st.just("turn"), st.integers(0, 7), st.integers(0, 60_000), st.integers(0, 4_000)),
    st.tuples(st.just("finish"), st.integers(0, 7), st.integers(0, 60_000), st.booleans()),
    st.tuples(st.just("end"), st.integers(0, 7)),
    st.tuples(st.just("park"), st.integers(0, 7)),
    st.tuples(st.just("unpark"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("release")),
    st.tuples(st.just("mode"), st.sampled_from(CONTROLS)),
)


def apply(b, ev, now):
    kind = ev[0]
    if kind == "turn":
        sid = f"s{ev[1]}"
        before_demand = b.demand_tokens()
        was_new = sid not in b
        was_admitted_idle = not was_new and b.session(sid).state == ADMITTED and b.session(sid).inflight == 0
        in_park_set = sid in b.park_set()
        decision = b.request_turn(sid, now, ev[2], ev[3])
        if b.config.mode == "budgeter-park" and decision == "forward":
            if was_new and b.pool_tokens and len([s for s in b.sessions() if s.state == ADMITTED]) > 1:
                assert before_demand < b.config.low * b.pool_tokens  # bands respected for newcomers
            if was_admitted_idle:
                assert not in_park_set  # nobody in the park set passes a turn boundary
    elif kind == "finish":
        sid = f"s{ev[1]}"
        if sid in b and b.session(sid).inflight > 0:
            b.turn_finished(sid, now, ev[2], 100, 1.0, ok=ev[3])
    elif kind == "end":
        b.end_session(f"s{ev[1]}", now)
    elif kind == "park" and f"s{ev[1]}" in b:
        b.park(f"s{ev[1]}", now)
    elif kind == "unpark" and f"s{ev[1]}" in b:
        b.unpark(f"s{ev[1]}", now, pin=ev[2])
    elif kind == "release":
        b.release(now)
    elif kind == "mode":
        b.set_config(b.config.replace(mode=ev[1]))


@settings(max_examples=200, deadline=None)
@given(st.lists(event, max_size=60))
def test_invariants_under_any_sequence_of_events(events):
    b = budgeter()
    for i, ev in enumerate(events):
        apply(b, ev, float(i))
        assert b.demand_tokens() >= 0
        sessions = b.sessions()
        # the running totals equal what they summarise
        assert b.demand_tokens() == sum(s.demand_tokens for s in sessions if s.state == ADMITTED)
        assert b.counts() == {
            st: sum(1 for s in sessions if s.state == st) for st in (ADMITTED, PARKED, WAITING)
        }
        for s in sessions:
            assert s.state in (ADMITTED, PARKED, WAITING)
            assert s.inflight >= 0
            assert not (s.held and s.state == ADMITTED)
            assert not (s.pinned and s.state != ADMITTED)


@settings(max_examples=200, deadline=None)
@given(st.lists(event, max_size=60))
def test_every_parked_session_is_readmitted_once_load_falls(events):
    b = budgeter()
    for i, ev in enumerate(events):
        apply(b, ev, float(i))
    now = float(len(events))
    # load falls: every admitted session finishes its turn and ends
    for s in b.sessions():
        if s.state == ADMITTED:
            b.end_session(s.id, now)
    # queued sessions are admitted one release at a time as the ones before them end
    for _ in range(len(b.sessions()) + 1):
        b.release(now)
        for s in b.sessions():
            if s.state == ADMITTED:
                b.end_session(s.id, now)
    leftovers = [s for s in b.sessions() if not (s.state == PARKED and s.manual)]
    assert leftovers == []
    assert math.isfinite(b.demand_tokens())
