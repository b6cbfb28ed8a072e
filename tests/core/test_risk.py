"""core.risk: each input's value and pressure, the score, the leading inputs, validation; exact values."""

from __future__ import annotations

import dataclasses

import pytest

from core import risk
from core import signals as sig
from core.risk import RiskSettings, assess, ramp, slope_per_min

# Explicit ramps and weights, so the expected numbers below do not move when the defaults are retuned.
S = RiskSettings(
    level_s=30,
    trend_s=60,
    reference_s=300,
    prefill_capacity_tokens_per_s=10_000,
    projection_horizon_s=60,
    projection_lo=1.0,
    projection_hi=1.5,
    demand_lo=1.0,
    demand_hi=1.25,
    demand_trend_floor=0.9,
    demand_growth_lo=0.0,
    demand_growth_hi=0.2,
    flow_lo=0.0,
    flow_hi=4.0,
    missed_lo=0.2,
    missed_hi=0.6,
    drop_lo=0.1,
    drop_hi=0.5,
    kv_lo=0.8,
    kv_hi=1.0,
    queue_lo=0.0,
    queue_hi=20.0,
    queue_growth_lo=0.0,
    queue_growth_hi=10.0,
    preempt_lo=0.0,
    preempt_hi=1.0,
    w_demand_projection=0.5,
    w_kv_demand=0.5,
    w_demand_trend=0.25,
    w_session_flow=0.25,
    w_missed_prefill=0.5,
    w_rt_trend=0.25,
    w_kv_usage=0.5,
    w_queue=0.25,
    w_queue_growth=0.25,
    w_preemptions=0.25,
    w_hit_trend=0.5,
    w_throughput=0.25,
    warn_enter=0.6,
    warn_exit=0.3,
    warn_for_s=10,
    warn_clear_s=60,
)


def points(seconds: int, **series) -> list[tuple[float, dict[str, float]]]:
    """One point per second t = 1..seconds; each keyword is a constant or a function of t."""
    out = []
    for t in range(1, seconds + 1):
        out.append((float(t), {name: (f(t) if callable(f) else float(f)) for name, f in series.items()}))
    return out


def by_name(a: risk.Assessment) -> dict[str, risk.RiskInput]:
    return {i.name: i for i in a.inputs}


def test_ramp_and_slope():
    assert ramp(None, 0, 1) == 0.0
    assert ramp(0.0, 0, 1) == 0.0
    assert ramp(0.25, 0, 1) == 0.25
    assert ramp(1.5, 0, 1) == 1.0
    assert slope_per_min([(0, 1.0), (30, 2.0), (60, 3.0)]) == pytest.approx(2.0)
    assert slope_per_min([(0, 1.0), (30, 2.0)]) is None


def test_settings_reject_bad_values_with_the_key_and_value():
    with pytest.raises(ValueError, match=r"demand_lo must be below demand_hi, got 1.3 >= 1.25"):
        RiskSettings(demand_lo=1.3)
    with pytest.raises(ValueError, match=r"warn_exit must be below warn_enter"):
        RiskSettings(warn_enter=0.5, warn_exit=0.5)
    with pytest.raises(ValueError, match=r"level_s must be positive, got 0"):
        RiskSettings(level_s=0)
    with pytest.raises(ValueError, match=r"w_queue must be a finite number, got nan"):
        RiskSettings(w_queue=float("nan"))
    with pytest.raises(ValueError, match=r"unknown risk setting\(s\) \['nope'\]"):
        RiskSettings.from_mapping({"nope": 1})


def test_no_data_is_unknown_not_zero():
    a = assess([], 100.0, "sidecar", S)
    assert a.score is None and a.signals() == {} and a.summary() == "collapse risk unknown (no data)"
    with pytest.raises(ValueError, match="unknown risk mode 'bare'"):
        assess([], 1.0, "bare", S)  # type: ignore[arg-type]


def test_sidecar_inputs_exact():
    # demand 1.1 of the pool growing 0.1/min, sessions +2/min, 3000 missed tokens/s from the engine, R_t flat
    pts = points(
        120,
        **{
            sig.DEMAND_FRACTION: lambda t: 0.9 + t / 600,
            sig.SESSIONS_IN_SYSTEM: lambda t: t / 30,
            sig.PROMPT_TOKENS_PER_S: 5000,
            sig.CACHED_TOKENS_PER_S: 2000,
            sig.TOKEN_WEIGHTED: 0.6,
        },
    )
    a = assess(pts, 120.0, "sidecar", S)
    x = by_name(a)
    # demand: mean over (90, 120] = 0.9 + 105.5/600
    assert x["kv_demand"].value == pytest.approx(round(0.9 + 105.5 / 600, 4))
    assert x["kv_demand"].pressure == pytest.approx(round((0.9 + 105.5 / 600 - 1.0) / 0.25, 4))
    assert x["demand_trend"].value == pytest.approx(0.1)
    assert x["demand_trend"].pressure == pytest.approx(0.5)
    assert x["demand_trend"].contribution == pytest.approx(0.125)
    assert x["session_flow"].value == pytest.approx(2.0)
    assert x["session_flow"].contribution == pytest.approx(0.125)
    assert x["missed_prefill"].value == pytest.approx(0.3)
    assert x["missed_prefill"].pressure == pytest.approx(0.25)
    assert x["rt_trend"].value == 0.0 and x["rt_trend"].contribution == 0.0
    # no projected_demand_fraction signal: demand extrapolated over the 60-s horizon, 1.0758 + 0.1
    assert x["demand_projection"].value == pytest.approx(round(0.9 + 105.5 / 600 + 0.1, 4))
    assert x["demand_projection"].contribution == pytest.approx(0.1758)
    expected = round(0.1758 + x["kv_demand"].contribution + 0.125 + 0.125 + 0.125, 4)
    assert a.score == pytest.approx(expected) == pytest.approx(0.7025)
    assert x["kv_demand"].contribution == pytest.approx(0.1517)
    # largest first, ties by name
    assert [i.name for i in a.leading()] == [
        "demand_projection",
        "kv_demand",
        "demand_trend",
        "missed_prefill",
        "session_flow",
    ]
    sigs = a.signals()
    assert sigs[sig.COLLAPSE_RISK] == a.score and sigs["risk_kv_demand"] == x["kv_demand"].contribution
    assert "risk_kv_usage" not in sigs  # engine inputs are not judged in sidecar mode


def test_demand_projection_reads_the_sidecars_projection_when_reported():
    # the sidecar projects 1.2 of the pool for the last 30 s (1.0 before): mean over (90, 120] = 1.2
    pts = points(
        120,
        **{
            sig.DEMAND_FRACTION: 0.8,
            sig.PROJECTED_DEMAND_FRACTION: lambda t: 1.2 if t > 90 else 1.0,
        },
    )
    x = by_name(assess(pts, 120.0, "sidecar", S))
    assert x["demand_projection"].value == pytest.approx(1.2)
    assert x["demand_projection"].pressure == pytest.approx(0.4)
    assert x["demand_projection"].contribution == pytest.approx(0.2)
    assert x["kv_demand"].contribution == 0.0


def test_demand_trend_and_flow_only_count_near_the_pool():
    pts = points(
        120, **{sig.DEMAND_FRACTION: lambda t: 0.5 + t / 600, sig.SESSIONS_IN_SYSTEM: lambda t: t / 30}
    )
    x = by_name(assess(pts, 120.0, "sidecar", S))
    assert x["demand_trend"].value == 0.0 and x["session_flow"].value == 0.0


def test_the_fallback_extrapolates_demand_only_near_the_pool():
    # no projection reported; demand rising 0.3/min from far below the pool (a sidecar's start): the
    # projection is today's level, not level + slope x horizon (0.55 + 0.3 = 0.85 would be the extrapolation)
    pts = points(120, **{sig.DEMAND_FRACTION: lambda t: t / 200})
    x = by_name(assess(pts, 120.0, "sidecar", S))
    assert x["demand_projection"].value == pytest.approx(round(105.5 / 200, 4))  # the 30-s mean
    # the same slope near the pool (30-s mean 0.9275): extrapolated over the 60-s horizon
    pts = points(120, **{sig.DEMAND_FRACTION: lambda t: 1.0 + (t - 120) / 200})
    x = by_name(assess(pts, 120.0, "sidecar", S))
    assert x["demand_projection"].value == pytest.approx(round(1.0 - 14.5 / 200 + 0.3, 4))


def test_an_overflow_the_projection_sees_ending_is_not_counted():
    # demand 1.2 of the pool now, growing +0.2/min, sessions +2/min, but the sidecar projects 0.85 in a
    # minute (sessions at their last turns): kv_demand is the lasting part (0.85), below the pool; the
    # trend, the flow and the symptoms count only near the pool, so nothing counts
    pts = points(
        120,
        **{
            sig.DEMAND_FRACTION: lambda t: 1.2 + (t - 105.5) / 300,
            sig.PROJECTED_DEMAND_FRACTION: 0.85,
            sig.SESSIONS_IN_SYSTEM: lambda t: t / 30,
            sig.PROMPT_TOKENS_PER_S: 9000,
            sig.CACHED_TOKENS_PER_S: 1000,
            sig.TOKEN_WEIGHTED: 0.6,
        },
    )
    a = assess(pts, 120.0, "sidecar", S)
    x = by_name(a)
    assert x["kv_demand"].value == 0.85 and x["kv_demand"].contribution == 0.0
    assert x["demand_trend"].value == 0.0 and x["session_flow"].value == 0.0
    assert x["missed_prefill"].value == 0.0 and x["rt_trend"].value == 0.0
    assert a.score == 0.0
    # projected above today's demand (a burst of young sessions): kv_demand is today's, 1.2 (pressure 0.8)
    # and the others count: +2/min (0.125), 8000 missed tokens/s of 10000 (0.5); the growth, +0.2/min,
    # is in the projection already, so demand_trend is not counted again
    pts = [(t, {**v, sig.PROJECTED_DEMAND_FRACTION: 1.3}) for t, v in pts]
    x = by_name(assess(pts, 120.0, "sidecar", S))
    assert x["kv_demand"].value == pytest.approx(1.2) and x["kv_demand"].contribution == pytest.approx(0.4)
    assert x["demand_trend"].value == 0.0 and x["session_flow"].contribution == 0.125
    assert x["missed_prefill"].value == pytest.approx(0.8) and x["missed_prefill"].contribution == 0.5


def test_demand_trend_is_not_counted_twice_when_a_reported_projection_contains_it():
    # demand 1.0 of the pool (30-s mean 1.0), growing +0.1/min; the sidecar projects 1.2 in a minute:
    # the projection already holds the growth, so the trend is not counted (value 0)
    grow = {sig.DEMAND_FRACTION: lambda t: 1.0 + (t - 105.5) / 600}
    a = assess(points(120, **grow, **{sig.PROJECTED_DEMAND_FRACTION: 1.2}), 120.0, "sidecar", S)
    x = by_name(a)
    assert x["demand_trend"].value == 0.0 and x["demand_trend"].contribution == 0.0
    assert x["demand_projection"].contribution == pytest.approx(0.2) and a.score == pytest.approx(0.2)
    # the sidecar projects 0.95 (sessions leaving): the lasting demand is 0.95 (near the pool) and the
    # growth contradicts the projection, so it counts: +0.1/min of 0 .. 0.2, pressure 0.5 (0.125)
    a = assess(points(120, **grow, **{sig.PROJECTED_DEMAND_FRACTION: 0.95}), 120.0, "sidecar", S)
    x = by_name(a)
    assert x["demand_trend"].value == pytest.approx(0.1) and x["demand_trend"].contribution == 0.125
    assert a.score == 0.125
    # a projection equal to today's demand foresees no growth: the trend counts
    x = by_name(assess(points(120, **grow, **{sig.PROJECTED_DEMAND_FRACTION: 1.0}), 120.0, "sidecar", S))
    assert x["demand_trend"].contribution == 0.125
    # no projection reported (an older sidecar): the fallback extrapolates the trend, which counts too
    x = by_name(assess(points(120, **grow), 120.0, "sidecar", S))
    assert x["demand_projection"].value == pytest.approx(1.1) and x["demand_trend"].contribution == 0.125


def test_no_single_input_may_warn_alone():
    # every weight must be under warn_enter: one input at full pressure cannot raise the warning
    d = RiskSettings()
    assert all(d.weight(n) < d.warn_enter for n in risk.ALL_INPUTS)
    assert d.w_demand_projection == 0.55
    with pytest.raises(ValueError, match=r"\['w_demand_projection'\] must be below warn_enter \(0.6\)"):
        RiskSettings(w_demand_projection=0.6)
    with pytest.raises(ValueError, match=r"\['w_kv_demand', 'w_kv_usage'\] must be below warn_enter \(0.5\)"):
        RiskSettings(warn_enter=0.5, w_demand_projection=0.45)
    # the projection alone at full pressure (1.3 of the pool, today's demand 0.8): 0.55, no warning
    x = assess(
        points(120, **{sig.DEMAND_FRACTION: 0.8, sig.PROJECTED_DEMAND_FRACTION: 1.3}), 120.0, "sidecar"
    )
    assert x.score == 0.55 and x.score < d.warn_enter


def test_sidecar_symptoms_count_only_near_the_pool():
    # a prefix-cache flush under the pool: every turn misses for a while and R_t falls 0.3, with the
    # admitted demand at 0.7 of the pool; the misses heal on the next turn, so they do not count
    flush = {
        sig.PROMPT_TOKENS_PER_S: lambda t: 9000 if t > 270 else 5000,
        sig.CACHED_TOKENS_PER_S: lambda t: 1000 if t > 270 else 4500,
        sig.TOKEN_WEIGHTED: lambda t: 0.6 if t > 270 else 0.9,
    }
    x = by_name(assess(points(300, **{sig.DEMAND_FRACTION: 0.7, **flush}), 300.0, "sidecar", S))
    assert x["missed_prefill"].value == 0.0 and x["rt_trend"].value == 0.0
    # the same at 0.92 of the pool (above demand_trend_floor, 0.9): they count
    x = by_name(assess(points(300, **{sig.DEMAND_FRACTION: 0.92, **flush}), 300.0, "sidecar", S))
    assert x["missed_prefill"].value == pytest.approx(0.8) and x["missed_prefill"].contribution == 0.5
    assert x["rt_trend"].value == pytest.approx(0.3) and x["rt_trend"].contribution == pytest.approx(0.125)


def test_engine_symptoms_count_only_while_the_pool_is_under_pressure():
    # the engine's view of a flush: the hit ratio falls 0.4, 8000 missed tokens/s, generation falls
    # 30%, with running requests holding 0.6 of the blocks (under kv_lo, 0.8 here): nothing counts
    flush = {
        sig.PREFIX_CACHE_QUERIES_PER_S: 10_000,
        sig.PREFIX_CACHE_HITS_PER_S: lambda t: 9000 if t <= 270 else 5000,
        sig.PROMPT_TOKENS_PER_S: 10_000,
        sig.CACHED_TOKENS_PER_S: lambda t: 9000 if t <= 270 else 2000,
        sig.GENERATION_TOKENS_PER_S: lambda t: 1000 if t <= 270 else 700,
    }
    a = assess(points(300, **{sig.KV_USAGE: 0.6, **flush}), 300.0, "engine", S)
    x = by_name(a)
    assert x["hit_trend"].value == 0.0 and x["missed_prefill"].value == 0.0 and x["throughput"].value == 0.0
    assert a.score == 0.0
    # at kv_lo they count
    x = by_name(assess(points(300, **{sig.KV_USAGE: 0.8, **flush}), 300.0, "engine", S))
    assert x["hit_trend"].value == pytest.approx(0.4) and x["hit_trend"].contribution == pytest.approx(0.375)
    assert x["missed_prefill"].value == pytest.approx(0.8) and x["throughput"].value == pytest.approx(0.3)
    # so they do with room in the pool but requests waiting for it (queue mean at queue_lo or above)
    q3 = dataclasses.replace(S, queue_lo=3.0)
    x = by_name(
        assess(points(300, **{sig.KV_USAGE: 0.6, sig.REQUESTS_WAITING: 3, **flush}), 300.0, "engine", q3)
    )
    assert x["missed_prefill"].value == pytest.approx(0.8) and x["missed_prefill"].contribution == 0.5
    x = by_name(
        assess(points(300, **{sig.KV_USAGE: 0.6, sig.REQUESTS_WAITING: 2, **flush}), 300.0, "engine", q3)
    )
    assert x["missed_prefill"].value == 0.0
    # a queue left by preemptions with room in the pool (a flush preempts every running request): not
    # requests waiting for blocks, so it does not open the gate while such a preemption is within trend_s
    flushed = {
        sig.KV_USAGE: lambda t: 0.6 if t <= 250 else 0.3,
        sig.REQUESTS_WAITING: 8,
        sig.PREEMPTIONS_PER_S: lambda t: 5.0 if t == 251 else 0.0,
    }
    x = by_name(assess(points(300, **{**flush, **flushed}), 300.0, "engine", q3))
    assert x["missed_prefill"].value == 0.0 and x["hit_trend"].value == 0.0
    assert x["preemptions"].value == 0.0 and x["queue"].value == 8.0  # the causes themselves still count
    x = by_name(assess(points(311, **{**flush, **flushed}), 311.0, "engine", q3))  # 60 s later: it opens
    assert x["missed_prefill"].value == pytest.approx(0.8)
    # a preemption while the pool is full (kv_usage 0.9 at that point, over kv_lo) is one for lack of
    # blocks: the queue opens the gate
    full = {**flushed, sig.KV_USAGE: lambda t: 0.9 if t == 251 else 0.6}
    x = by_name(assess(points(300, **{**flush, **full}), 300.0, "engine", q3))
    assert x["missed_prefill"].value == pytest.approx(0.8)
    # no kv_usage, no queue reported: the cause is unknown, the symptoms do not count
    x = by_name(assess(points(300, **flush), 300.0, "engine", S))
    assert x["kv_usage"].value is None and x["missed_prefill"].value == 0.0


def test_sidecar_estimates_missed_tokens_without_engine_counters():
    # 2 turns/s x (400000 demand / 20 admitted = 20000 tokens a turn) x (1 - 0.75) = 10000 tokens/s
    pts = points(
        60,
        **{
            sig.DEMAND_FRACTION: 0.95,  # near the pool: the symptom counts
            sig.TURNS_PER_S: 2.0,
            sig.DEMAND_TOKENS: 400_000,
            sig.ADMITTED: 20,
            sig.TOKEN_WEIGHTED: 0.75,
        },
    )
    x = by_name(assess(pts, 60.0, "sidecar", S))
    assert x["missed_prefill"].value == pytest.approx(1.0)
    assert x["missed_prefill"].pressure == 1.0 and x["missed_prefill"].contribution == 0.5


def test_rt_trend_is_the_fall_from_the_best_recent_level():
    pts = points(300, **{sig.DEMAND_FRACTION: 0.95, sig.TOKEN_WEIGHTED: lambda t: 0.9 if t <= 270 else 0.6})
    x = by_name(assess(pts, 300.0, "sidecar", S))
    assert x["rt_trend"].value == pytest.approx(0.3)
    assert x["rt_trend"].pressure == pytest.approx(0.5)


def test_engine_inputs_exact():
    pts = points(
        300,
        **{
            sig.KV_USAGE: 0.9,
            sig.REQUESTS_WAITING: lambda t: max(0.0, (t - 240) / 6),  # +10/min over the last minute
            sig.PREEMPTIONS_PER_S: lambda t: 0.5 if t > 270 else 0.0,
            sig.PREFIX_CACHE_QUERIES_PER_S: 10_000,
            sig.PREFIX_CACHE_HITS_PER_S: lambda t: 9000 if t <= 270 else 6000,
            sig.PROMPT_TOKENS_PER_S: 10_000,
            sig.CACHED_TOKENS_PER_S: lambda t: 9000 if t <= 270 else 6000,
            sig.GENERATION_TOKENS_PER_S: lambda t: 1000 if t <= 270 else 700,
        },
    )
    a = assess(pts, 300.0, "engine", S)
    x = by_name(a)
    assert x["kv_usage"].value == 0.9 and x["kv_usage"].pressure == 0.5 and x["kv_usage"].contribution == 0.25
    assert x["queue"].value == pytest.approx(round(sum((t - 240) / 6 for t in range(271, 301)) / 30, 4))
    assert x["queue_growth"].value == pytest.approx(10.0) and x["queue_growth"].contribution == 0.25
    assert x["preemptions"].value == 0.5 and x["preemptions"].contribution == 0.125
    assert x["hit_trend"].value == pytest.approx(0.3) and x["hit_trend"].pressure == pytest.approx(0.5)
    assert x["missed_prefill"].value == pytest.approx(0.4) and x["missed_prefill"].pressure == pytest.approx(
        0.5
    )
    assert x["throughput"].value == pytest.approx(0.3)  # 1000 -> 700 tokens/s while the prompt load held
    assert a.score == 1.0  # capped
    assert a.leading(2)[0].name in {"hit_trend", "missed_prefill"}
    assert "collapse risk 1.00 (engine inputs); leading:" in a.summary()


def test_throughput_fall_with_less_work_offered_is_not_a_symptom():
    pts = points(
        300,
        **{
            sig.KV_USAGE: 0.9,  # the pool under pressure: a symptom would count
            sig.GENERATION_TOKENS_PER_S: lambda t: 1000 if t <= 270 else 500,
            sig.PROMPT_TOKENS_PER_S: lambda t: 10_000 if t <= 270 else 4000,
            sig.CACHED_TOKENS_PER_S: lambda t: 9000 if t <= 270 else 3600,
        },
    )
    x = by_name(assess(pts, 300.0, "engine", S))
    assert x["throughput"].value == 0.0


def test_engine_hit_trend_falls_back_to_the_ratio_signal():
    pts = points(300, **{sig.KV_USAGE: 0.9, sig.ENGINE_HIT_RATIO: lambda t: 0.8 if t <= 270 else 0.4})
    x = by_name(assess(pts, 300.0, "engine", S))
    assert x["hit_trend"].value == pytest.approx(0.4) and x["hit_trend"].pressure == 0.75


def test_a_healthy_engine_scores_zero_with_no_leading_input():
    pts = points(
        300,
        **{
            sig.KV_USAGE: 0.5,
            sig.REQUESTS_WAITING: 0,
            sig.PREEMPTIONS_PER_S: 0,
            sig.PROMPT_TOKENS_PER_S: 3000,
            sig.CACHED_TOKENS_PER_S: 2700,
            sig.GENERATION_TOKENS_PER_S: 800,
            sig.ENGINE_HIT_RATIO: 0.9,
        },
    )
    a = assess(pts, 300.0, "engine", S)
    assert a.score == 0.0 and a.leading() == []
    assert a.summary() == "collapse risk 0.00: no input under pressure"


def test_mode_for_and_the_signal_vocabulary():
    assert risk.mode_for([sig.DEMAND_FRACTION, sig.TOKEN_WEIGHTED]) == "sidecar"
    assert risk.mode_for([sig.KV_USAGE]) == "engine"
    assert set(risk.SIGNAL_OF_INPUT.values()) == set(sig.RISK_INPUT_SIGNALS)
    assert sig.COLLAPSE_RISK in sig.ALL_SIGNALS and all(s in sig.ALL_SIGNALS for s in sig.RISK_INPUT_SIGNALS)


def test_the_docs_tables_match_the_defaults():
    """docs/collapse-risk.md restates each input's ramp and weight: it must not drift from RiskSettings."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "collapse-risk.md").read_text()
    d = RiskSettings()
    ramps = {
        "demand_projection": (d.projection_lo, d.projection_hi),
        "kv_demand": (d.demand_lo, d.demand_hi),
        "demand_trend": (d.demand_growth_lo, d.demand_growth_hi),
        "session_flow": (d.flow_lo, d.flow_hi),
        "missed_prefill": (d.missed_lo, d.missed_hi),
        "rt_trend": (d.drop_lo, d.drop_hi),
        "kv_usage": (d.kv_lo, d.kv_hi),
        "queue": (d.queue_lo, d.queue_hi),
        "queue_growth": (d.queue_growth_lo, d.queue_growth_hi),
        "preemptions": (d.preempt_lo, d.preempt_hi),
        "hit_trend": (d.drop_lo, d.drop_hi),
        "throughput": (d.drop_lo, d.drop_hi),
    }
    for name, (lo, hi) in ramps.items():
        rows = re.findall(rf"^\| `{name}` \|.*$", text, flags=re.M)
        assert rows, f"docs/collapse-risk.md has no row for {name}"
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert cells[-1] == f"{d.weight(name):g}", (name, cells[-1])
            numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cells[-2].replace(" ", ""))]
            assert numbers[:2] == [lo, hi], (name, cells[-2])
    assert f"score is ≥ {d.warn_enter:g} and fires after {d.warn_for_s:g} s" in text
    assert f"score < {d.warn_exit:g} (hysteresis) held for {d.warn_clear_s:g} s" in text
