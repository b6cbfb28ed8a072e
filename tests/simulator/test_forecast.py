"""The forecast's inputs (simulator.forecast): exact values from rows; and the run's behaviour on them."""

from __future__ import annotations

import dataclasses

import pytest

from core.attribution import DEFAULT_BLOCK_SIZE
from core.budgeter import Budgeter, BudgeterConfig
from simulator.config import CostModel, EngineConfig
from simulator.forecast import (
    ForecastError,
    ForecastInputs,
    Shapes,
    StartSession,
    engine_running,
    forecast_inputs,
    shapes_from_turns,
    start_sessions,
    turn_overhead,
    turn_overhead_basis,
)
from simulator.forecast_cost import STEP_TERMS, cost_from_fit, cost_from_latencies, cost_with_fit, decode_step
from simulator.forecast_run import run_forecast, start_budgeter

NOW = 10_000.0


def turn(
    id_: int,
    ts: float,
    session: str,
    prompt: int,
    cached: int,
    completion: int,
    latency: float = 1.0,
    held: float = 0.0,
    outcome: str = "ok",
) -> dict:
    return {
        "id": id_,
        "ts": ts,
        "session": session,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": completion,
        "held_s": held,
        "latency_s": latency,
        "outcome": outcome,
    }


def test_start_sessions_keeps_the_budgeter_states_with_context_turns_and_time_parked() -> None:
    rows = [
        {
            "session_id": "b",
            "state": "parked",
            "context_tokens": 5000,
            "turns": 3,
            "manual": True,
            "pinned": False,
            "data": {"parked_since": NOW - 40.0},
        },
        {
            "session_id": "a",
            "state": "admitted",
            "context_tokens": 7000.0,
            "turns": 5,
            "manual": None,
            "pinned": True,
            "data": None,
        },
        {"session_id": "c", "state": "waiting", "context_tokens": None, "turns": 0, "data": {}},
        {"session_id": "d", "state": "ended", "context_tokens": 1, "turns": 1, "data": {}},
    ]
    assert start_sessions(rows, NOW) == (
        StartSession("a", "admitted", 7000, 5, 0.0, False, True),
        StartSession("b", "parked", 5000, 3, 40.0, True, False),
        StartSession("c", "waiting", 0, 0, 0.0, False, False),
    )


def test_shapes_from_turns_exact() -> None:
    start = NOW - 1800.0
    rows = [
        # "old": seen before the window, so not an arrival; its in-window turn still gives shapes
        turn(1, start - 100.0, "old", 3000, 0, 100),
        turn(2, start + 10.0, "old", 3400, 3000, 120, latency=2.0, held=1.0),  # began start+7: gap 107
        # "new": arrives in the window, has left (not present): 2 turns in total
        turn(3, start + 500.0, "new", 2500, 2000, 50, latency=1.5),
        turn(4, start + 505.0, "new", 2900, 2500, 60, latency=1.0),  # began 504: gap 4.0; extra 2900-2500-50
        # "live": arrives, still present: no total
        turn(5, start + 900.0, "live", 4000, 1000, 80),
        # failed and unsessioned turns are left out
        turn(6, start + 950.0, "live", 9999, 0, 0, outcome="error"),
        {**turn(7, start + 960.0, "x", 100, 0, 10), "session": None},
        turn(8, NOW + 5.0, "live", 1, 0, 1),  # after now
    ]
    shapes = shapes_from_turns(rows, NOW, present=["live"])
    assert shapes == Shapes(
        arrival_rate=2 / 1800.0,
        first_prompts=(4000, 2500),
        extras=(350, 300),
        outputs=(80, 50, 60, 120),
        gaps=(4.0, 107.0),
        session_turns=(2,),
        shared_prefix=1500,
        turns_seen=4,
    )


def test_the_arrival_rate_is_over_the_span_the_trace_covers() -> None:
    # a trace younger than the window (the sidecar started 120 s ago): 3 arrivals in 120 s, not in 1800 s
    rows = [
        turn(1, NOW - 119.0, "a", 3000, 0, 100, latency=0.5, held=0.5),  # arrived NOW - 120
        turn(2, NOW - 60.0, "b", 3000, 2000, 100),
        turn(3, NOW - 50.0, "a", 3500, 3000, 100),
        turn(4, NOW - 10.0, "c", 3000, 2000, 100),
    ]
    assert shapes_from_turns(rows, NOW).arrival_rate == 3 / 120.0
    # one turn recorded before the window: the trace covers the whole window
    older = [turn(0, NOW - 1900.0, "old", 3000, 0, 100), *rows]
    assert shapes_from_turns(older, NOW).arrival_rate == 3 / 1800.0
    # failed and session-less turns say nothing of arrivals; no ok turn at all: rate 0
    assert shapes_from_turns([turn(1, NOW - 5.0, "a", 1, 0, 1, outcome="error")], NOW).arrival_rate == 0.0


def test_cost_from_fit_reads_the_cost_keys_and_names_a_bad_value() -> None:
    fit = {
        "step_overhead_s": "0.01",
        "prefill_per_token_s": "2e-05",
        "decode_per_ctx_token_s": "1e-08",
        "pool_tokens": "20480",
        "block_size": "16",
    }
    assert cost_from_fit(fit) == CostModel(
        step_overhead_s=0.01,
        prefill_per_token_s=2e-05,
        prefill_attention_s=0.0,
        decode_per_ctx_token_s=1e-08,
        offload_load_per_token_s=0.0,
    )
    with pytest.raises(ForecastError, match=r"fit: prefill_per_token_s='x' is not a number"):
        cost_from_fit({"prefill_per_token_s": "x"})
    with pytest.raises(ForecastError, match="no cost-model setting"):
        cost_from_fit({"pool_tokens": "1"})


T0, GAMMA, ALPHA, POOL = 0.0006, 3.7e-9, 7.5e-6, 400_000


def step(k: float, p: float) -> float:
    """The step time of the identity y = T0 + gamma*K + alpha*(P*y), solved for y."""
    return (T0 + GAMMA * k) / (1.0 - ALPHA * p)


def interval(usage: float, p: float, **extra: float) -> dict[str, float]:
    """An interval's signals as the collectors store them, from the model above (wall seconds)."""
    y = step(usage * POOL, p)
    return {
        "decode_time_p50": y * 149,
        "output_len_p50": 150,
        "kv_usage": usage,
        "prefix_cache_queries_per_s": 200_000.0 + p,
        "prefix_cache_hits_per_s": 200_000.0,
        **extra,
    }


# healthy ramp (little prefill per step), then a collapse: a full pool, 90K tokens/s of recomputed prefill
HEALTHY_THEN_COLLAPSED = [(0.05, 4000.0), (0.2, 9000.0), (0.5, 12000.0), (0.91, 90000.0), (0.95, 110000.0)]


def test_cost_from_latencies_recovers_an_exact_step_model() -> None:
    cost = cost_from_latencies([interval(u, p) for u, p in HEALTHY_THEN_COLLAPSED], POOL)
    assert cost.step_overhead_s == pytest.approx(T0, rel=1e-9)
    assert cost.decode_per_ctx_token_s == pytest.approx(GAMMA, rel=1e-9)
    assert cost.prefill_per_token_s == pytest.approx(ALPHA, rel=1e-9)
    assert (cost.prefill_attention_s, cost.offload_load_per_token_s) == (0.0, 0.0)


def test_cost_from_latencies_ignores_queueing_a_collapse_puts_in_ttft() -> None:
    """TTFT and queue time of a collapsed engine (minutes of waiting) change nothing: they are not read."""
    calm = [interval(u, p) for u, p in HEALTHY_THEN_COLLAPSED]
    queued = [
        interval(u, p, ttft_p50=60.0 * i, queue_time_p50=59.0 * i, e2e_p50=90.0 * i)
        for i, (u, p) in enumerate(HEALTHY_THEN_COLLAPSED)
    ]
    assert cost_from_latencies(queued, POOL) == cost_from_latencies(calm, POOL)


def test_cost_from_latencies_reads_each_signal_from_its_fallbacks() -> None:
    samples = []
    for running, plen, p in ((2, 4000, 1000.0), (4, 8000, 3000.0), (8, 6000, 40000.0), (3, 1000, 500.0)):
        y = step(running * plen, p)
        samples.append(
            {  # no kv_usage: K = running x prompt length; no prefix-cache rates: P = prompt - cached
                "requests_running": running,
                "prompt_len_p50": plen,
                "prompt_tokens_per_s": 5000.0 + p,
                "cached_tokens_per_s": 5000.0,
                # no decode_time: (e2e - ttft) / (output - 1); an ITL histogram wins over both
                **({"itl_p50": y} if running == 8 else {"e2e_p50": 0.25 + y * 100, "ttft_p50": 0.25}),
                "output_len_p50": 101,
            }
        )
    cost = cost_from_latencies(samples, pool_tokens=None)
    assert cost.step_overhead_s == pytest.approx(T0, rel=1e-9)
    assert cost.decode_per_ctx_token_s == pytest.approx(GAMMA, rel=1e-9)
    assert cost.prefill_per_token_s == pytest.approx(ALPHA, rel=1e-9)


def test_the_exact_mean_decode_step_wins_over_interpolated_medians() -> None:
    """``itl_mean``, else ``decode_time_mean / (output_len_mean - 1)``, before any median (module doc)."""
    exact = []
    for u, p in HEALTHY_THEN_COLLAPSED:
        y = step(u * POOL, p)
        medians = {
            "decode_time_p50": y * 180,
            "output_len_p50": 150,
            "itl_p50": y * 1.3,
        }  # off, as buckets are
        means = {"itl_mean": y} if u > 0.9 else {"decode_time_mean": y * 150, "output_len_mean": 151}
        exact.append(interval(u, p, **medians, **means))
    cost = cost_from_latencies(exact, POOL)
    assert (cost.step_overhead_s, cost.decode_per_ctx_token_s, cost.prefill_per_token_s) == pytest.approx(
        (T0, GAMMA, ALPHA), rel=1e-9
    )
    assert (
        decode_step({"decode_time_mean": 0.3, "output_len_mean": 1}) is None
    )  # no step after the first token
    assert decode_step({"decode_time_p50": 0.3, "output_len_p50": 151}) is None  # medians are step_sample's


def test_cost_from_latencies_at_one_load_level_puts_the_step_on_context() -> None:
    samples = [
        {
            "itl_p50": 0.02,
            "requests_running": 4,
            "prompt_len_p50": 5000,
            "prompt_tokens_per_s": 9.0,
            "cached_tokens_per_s": 9.0,
        }
    ] * 3
    cost = cost_from_latencies(samples)
    assert (cost.step_overhead_s, cost.decode_per_ctx_token_s, cost.prefill_per_token_s) == (
        0.0,
        0.02 / 20000,
        0.0,
    )


def test_cost_from_latencies_without_prefill_variation_fits_the_decode_line_only() -> None:
    samples = [interval(u, 0.0) for u in (0.1, 0.4, 0.8)]
    cost = cost_from_latencies(samples, POOL)
    assert cost.step_overhead_s == pytest.approx(T0, rel=1e-9)
    assert cost.decode_per_ctx_token_s == pytest.approx(GAMMA, rel=1e-9)
    assert cost.prefill_per_token_s == 0.0


def test_with_a_fit_the_cost_model_is_the_fits_and_a_step_term_it_left_at_0_the_recorded_latencies() -> None:
    samples = [interval(u, p) for u, p in HEALTHY_THEN_COLLAPSED] * 12  # 60 intervals: enough to stand in
    fit = {
        "step_overhead_s": "0.0005",
        "prefill_per_token_s": "4.4e-06",
        "prefill_attention_s": "4.8e-10",
        "decode_per_ctx_token_s": "3e-08",
    }
    # a fit that resolved every term is taken whole, however many intervals are recorded
    assert cost_with_fit(fit, samples, POOL) == (cost_from_fit(fit), "fit", ())
    # a fit of an engine whose decode steps were below its probes' timing: decode term 0
    unresolved = dict(fit, decode_per_ctx_token_s="0")
    cost, source, terms = cost_with_fit(unresolved, samples, POOL)
    assert (source, terms) == ("fit+latencies", ("decode_per_ctx_token_s",))
    assert cost.decode_per_ctx_token_s == pytest.approx(GAMMA, rel=1e-9)  # the latencies' estimate
    assert (cost.step_overhead_s, cost.prefill_per_token_s, cost.prefill_attention_s) == (
        0.0005,
        4.4e-06,
        4.8e-10,
    )
    # too few recorded intervals (59): a young record does not stand in; the fit is whole
    assert cost_with_fit(unresolved, samples[:59], POOL) == (cost_from_fit(unresolved), "fit", ())
    # through forecast_inputs: the inputs say which terms came from the latencies
    inputs = forecast_inputs(
        pool_tokens=POOL,
        session_rows=[],
        turn_rows=[turn(1, NOW - 60, "a", 3000, 0, 100), turn(2, NOW - 30, "a", 3200, 3000, 100)],
        latency_samples=samples,
        fit=dict(unresolved, step_overhead_s="0"),
        current=BudgeterConfig(),
        now=NOW,
    )
    assert (inputs.cost_source, inputs.cost_estimated) == ("fit+latencies", STEP_TERMS)


def test_cost_from_latencies_names_what_is_missing() -> None:
    samples = [interval(u, p) for u, p in HEALTHY_THEN_COLLAPSED]
    with pytest.raises(
        ForecastError, match=r"too few recorded intervals to estimate one \(2 with a decode step"
    ):
        cost_from_latencies(samples[:2], POOL)
    no_prefill = [{k: v for k, v in s.items() if not k.startswith("prefix_cache")} for s in samples]
    with pytest.raises(
        ForecastError, match=r"\(0 with .*prefix_cache_queries_per_s and prefix_cache_hits_per_s"
    ):
        cost_from_latencies(no_prefill, POOL)


def _recorded() -> tuple[list[dict], list[dict]]:
    rows, k = [], 0
    for s in range(20):
        ts, prompt = NOW - 1700.0 + s * 80.0, 6000
        for _ in range(10):
            k += 1
            rows.append(turn(k, ts, f"s{s}", prompt, prompt - 600, 150, latency=0.8))
            prompt += 750
            ts += 3.0
    sessions = [
        {
            "session_id": f"s{s}",
            "state": "admitted" if s < 19 else "parked",
            "context_tokens": 12000,
            "turns": 9,
            "data": {"parked_since": NOW - 10},
        }
        for s in (18, 19)
    ]
    return rows, sessions


def test_forecast_inputs_take_only_the_collectors_data() -> None:
    rows, sessions = _recorded()
    inputs = forecast_inputs(
        pool_tokens=100_000,
        session_rows=sessions,
        turn_rows=rows,
        latency_samples=[],
        fit={"step_overhead_s": "0.006", "prefill_per_token_s": "3e-5", "block_size": "32"},
        current=BudgeterConfig(mode="off"),
        now=NOW,
    )
    assert (inputs.engine.pool_tokens, inputs.engine.block_size, inputs.cost_source) == (100_000, 32, "fit")
    assert inputs.output_budget == BudgeterConfig().default_output_budget
    # the trace began 1700.8 s ago (the first turn's arrival), inside the 30-minute window
    assert inputs.shapes.arrival_rate == 20 / (NOW - (NOW - 1700.0 - 0.8)) and set(inputs.shapes.extras) == {
        600
    }
    assert inputs.shapes.session_turns == (10,) * 18 and [s.id for s in inputs.sessions] == ["s18", "s19"]
    with pytest.raises(ForecastError, match=r"KV pool size is unknown or too small \(None tokens\)"):
        forecast_inputs(
            pool_tokens=None,
            session_rows=sessions,
            turn_rows=rows,
            latency_samples=[],
            fit=None,
            current=BudgeterConfig(),
            now=NOW,
        )
    with pytest.raises(ForecastError, match="no cost model: no fit file"):
        forecast_inputs(
            pool_tokens=100_000,
            session_rows=sessions,
            turn_rows=rows,
            latency_samples=[],
            fit=None,
            current=BudgeterConfig(),
            now=NOW,
        )


def test_the_block_size_is_the_recorded_one_else_the_fit_files_else_vllms_default() -> None:
    rows, sessions = _recorded()
    fit = {"step_overhead_s": "0.006", "prefill_per_token_s": "3e-5"}

    def block(recorded: object, fit_block: object | None) -> int:
        f = fit if fit_block is None else {**fit, "block_size": fit_block}
        return forecast_inputs(
            pool_tokens=100_000,
            session_rows=sessions,
            turn_rows=rows,
            latency_samples=[],
            fit=f,
            current=BudgeterConfig(),
            now=NOW,
            block_size=recorded,
        ).engine.block_size

    assert block(64, "32") == 64  # what the engine reports wins over a fit file
    assert block(None, "32") == 32
    assert block(None, None) == DEFAULT_BLOCK_SIZE == 16
    with pytest.raises(ForecastError, match=r"fit: block_size='big' is not a positive number"):
        block(None, "big")


def test_run_forecast_is_deterministic_and_parking_holds_demand_under_the_band() -> None:
    rows, _ = _recorded()
    crowd = [
        {"session_id": f"c{i}", "state": "admitted", "context_tokens": 12000, "turns": 2, "data": {}}
        for i in range(20)
    ]
    inputs = forecast_inputs(
        pool_tokens=150_000,
        session_rows=crowd,
        turn_rows=rows,
        latency_samples=[],
        fit={"step_overhead_s": "0.006", "prefill_per_token_s": "3e-5", "decode_per_ctx_token_s": "4e-8"},
        current=BudgeterConfig(mode="off"),
        now=NOW,
    )
    off = run_forecast(inputs, BudgeterConfig(mode="off"), 5, seed=3)
    again = run_forecast(inputs, BudgeterConfig(mode="off"), 5, seed=3)
    park = run_forecast(inputs, BudgeterConfig(mode="budgeter-park"), 5, seed=3)
    drop = {"wall_s"}
    assert {k: v for k, v in off["summary"].items() if k not in drop} == {
        k: v for k, v in again["summary"].items() if k not in drop
    }
    assert off["summary"]["sessions_at_start"] == 20
    assert (
        park["summary"]["sessions_arrived"] == off["summary"]["sessions_arrived"] > 0
    )  # same offered sessions
    # 20 x (12000 + 1024) tokens of demand on a 150K pool: off parks nobody, budgeter-park parks some
    assert (off["summary"]["parked_max"], off["summary"]["parked_session_minutes"]) == (0, 0.0)
    assert park["summary"]["parked_max"] > 0 and park["summary"]["parked_session_minutes"] > 0
    assert len(off["series"]["turns"]) == 300 and sum(off["series"]["turns"]) > 0
    assert 0.0 <= off["summary"]["r_t"] <= 1.0


def test_the_forecast_never_reads_the_simulators_own_configuration() -> None:
    """Only the cost model and engine classes are taken from simulator.config: no SimConfig, no scenario."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for name in ("simulator/forecast.py", "simulator/forecast_run.py", "dashboard/forecast_view.py"):
        text = (root / name).read_text()
        for forbidden in (
            "SimConfig(",
            "AgentWorkload",
            "ControlConfig",
            "scenario_config",
            "run_scenario",
            "apply_overrides",
            "simulator.offline",
            "simulator.server",
        ):
            assert forbidden not in text, f"{name} uses {forbidden}"


def test_turns_in_flight_at_the_start_are_in_the_engine_whatever_the_proposed_mode() -> None:
    """A turn already forwarded cannot be held: the collapsed engine's backlog drains first."""
    rows, _ = _recorded()

    def run(in_flight: int) -> dict:
        crowd = [
            {
                "session_id": f"c{i}",
                "state": "admitted",
                "context_tokens": 12000,
                "turns": 2,
                "data": {"in_flight": in_flight},
            }
            for i in range(20)
        ]
        inputs = forecast_inputs(
            pool_tokens=150_000,
            session_rows=crowd,
            turn_rows=rows,
            latency_samples=[],
            fit={"step_overhead_s": "0.006", "prefill_per_token_s": "3e-5", "decode_per_ctx_token_s": "4e-8"},
            current=BudgeterConfig(mode="off"),
            now=NOW,
        )
        assert {s.in_flight for s in inputs.sessions} == {bool(in_flight)}
        return run_forecast(inputs, BudgeterConfig(mode="budgeter-park"), 5, seed=3)

    idle, busy = run(0), run(1)
    # the recorded tool gaps are 4 s or more: sessions between turns finish nothing before then
    assert sum(idle["series"]["turns"][:4]) == 0
    assert sum(busy["series"]["turns"][:4]) > 0


def test_turn_overhead_is_the_sidecars_latency_beyond_the_engines_own() -> None:
    samples = [
        {"ts": 100.0, "e2e_p50": 0.5},
        {"ts": 110.0, "e2e_p50": 1.0, "kv_usage": 0.5},
        {"ts": 110.0, "kv_usage": 0.5},  # another engine label at the same time, without e2e
        {"ts": 120.0, "e2e_p50": 2.0},
        {"ts": 130.0},  # no e2e: its turns are not compared
        {"ts": 140.0, "e2e_p50": 1.0},  # after now
    ]
    rows = [
        turn(1, 95.0, "a", 1, 0, 1, latency=9.0),  # before the first interval
        turn(2, 105.0, "a", 1, 0, 1, latency=0.7),  # (100, 110]: median 0.8 - 1.0
        turn(3, 110.0, "b", 1, 0, 1, latency=0.9),
        turn(4, 115.0, "a", 1, 0, 1, latency=3.0),  # (110, 120]: 3.0 - 2.0
        turn(5, 116.0, "b", 1, 0, 1, latency=50.0, outcome="error"),  # failed: left out
        turn(6, 125.0, "a", 1, 0, 1, latency=5.0),  # (120, 130]: no e2e
    ]
    assert turn_overhead(rows, samples, now=130.0) == ((0.7 + 0.9) / 2 - 1.0 + (3.0 - 2.0)) / 2
    assert turn_overhead(rows, samples, now=130.0, window_s=15.0) == 3.0 - 2.0  # intervals ending from 115
    assert turn_overhead(rows[:3], samples, now=130.0) == 0.0  # faster than the engine's own clock: 0
    assert turn_overhead(rows, [], now=130.0) == 0.0  # nothing to compare
    assert turn_overhead(rows, [{k: v for k, v in s.items() if k != "ts"} for s in samples], 130.0) == 0.0


def test_turn_overhead_from_exact_means_weighs_the_engines_side_by_the_turns_of_each_interval() -> None:
    samples = [
        {"ts": 100.0, "kv_usage": 0.1},
        {"ts": 110.0, "e2e_mean": 20.0, "e2e_p50": 25.0},  # p50 inside a wide bucket: not used
        {"ts": 120.0, "kv_usage": 0.2},  # no request finished: its turns are not compared
        {"ts": 130.0, "e2e_mean": 2.0, "e2e_p50": 9.0},
        {"ts": 140.0, "e2e_p50": 1.0},  # a p50 without a mean: the means decide where there are any
    ]
    rows = [
        turn(1, 105.0, "a", 1, 0, 1, latency=20.5),  # (100, 110]: 20.5 + 20.3 - 2 * 20.0
        turn(2, 108.0, "b", 1, 0, 1, latency=20.3),
        turn(3, 115.0, "a", 1, 0, 1, latency=99.0),  # (110, 120]: no engine mean
        turn(4, 125.0, "b", 1, 0, 1, latency=2.1),  # (120, 130]: 2.1 + 2.3 + 2.5 - 3 * 2.0
        turn(5, 126.0, "a", 1, 0, 1, latency=2.3),
        turn(6, 129.0, "c", 1, 0, 1, latency=2.5),
        turn(7, 135.0, "c", 1, 0, 1, latency=50.0),  # (130, 140]: p50 only, not mixed in
    ]
    assert turn_overhead(rows, samples, now=140.0) == pytest.approx((0.8 + 0.9) / 5)
    assert turn_overhead_basis(rows, samples, now=140.0)[1] == "e2e_mean"
    # the interpolated p50s alone (the old estimate) read these intervals as faster than the engine
    p50_only = [{k: v for k, v in s.items() if k != "e2e_mean"} for s in samples]
    assert turn_overhead_basis(rows[:-1], p50_only, now=140.0) == (0.0, "e2e_p50")
    assert turn_overhead_basis(rows, [], now=140.0) == (0.0, "none")
    # a turn the scrape boundary moved into the next interval changes nothing in the sum
    moved = [dict(r, ts=111.0) if r["id"] == 2 else r for r in rows if r["id"] != 3]
    shifted = [dict(s, e2e_mean=20.0) if s["ts"] == 120.0 else s for s in samples]
    assert turn_overhead(moved, shifted, now=140.0) == pytest.approx((0.8 + 0.9) / 5)
    assert turn_overhead(rows[3:6], samples, now=140.0) == pytest.approx(0.9 / 3)
    # two ranks of one engine at the same times, 1.5 and 2.5 s: averaged (the last alone, 2.5 s, gave 0)
    ranks = [dict(s, e2e_mean=s["e2e_mean"] + d) for s in samples if "e2e_mean" in s for d in (-0.5, 0.5)]
    assert turn_overhead(rows[3:6], samples[:1] + ranks, now=140.0) == pytest.approx(0.9 / 3)
    assert turn_overhead(rows[3:6], samples[:1] + ranks[1::2], now=140.0) == 0.0
    assert turn_overhead([dict(r, latency_s=1.0) for r in rows[3:6]], samples, now=140.0) == 0.0  # at least 0


def test_turn_overhead_is_taken_over_the_newest_intervals_holding_enough_turns(monkeypatch) -> None:
    """The overhead grows with the load: the newest intervals, back until they hold OVERHEAD_TURNS turns."""
    import simulator.forecast as forecast

    samples = [{"ts": t, "e2e_mean": 2.0} for t in (100.0, 110.0, 120.0, 130.0)]
    rows = [
        turn(1, 105.0, "a", 1, 0, 1, latency=2.0),  # (100, 110]: none
        turn(2, 106.0, "b", 1, 0, 1, latency=2.0),
        turn(3, 115.0, "a", 1, 0, 1, latency=2.1),  # (110, 120]: 0.1 each
        turn(4, 116.0, "b", 1, 0, 1, latency=2.1),
        turn(5, 125.0, "a", 1, 0, 1, latency=2.4),  # (120, 130]: 0.4 each, the newest
        turn(6, 126.0, "b", 1, 0, 1, latency=2.4),
    ]
    monkeypatch.setattr(forecast, "OVERHEAD_TURNS", 2)
    assert turn_overhead(rows, samples, now=130.0) == pytest.approx(0.4)  # the newest interval holds 2
    monkeypatch.setattr(forecast, "OVERHEAD_TURNS", 3)
    assert turn_overhead(rows, samples, now=130.0) == pytest.approx(0.25)  # and the one before it
    monkeypatch.setattr(forecast, "OVERHEAD_TURNS", 500)
    assert turn_overhead(rows, samples, now=130.0) == pytest.approx(0.5 / 3)  # all three
    assert turn_overhead(rows, samples, now=130.0, window_s=5.0) == pytest.approx(
        0.4
    )  # intervals ending in it


def test_a_turn_overhead_delays_each_answer_and_the_sessions_next_turn() -> None:
    def run(overhead: float) -> dict:
        inputs = ForecastInputs(
            engine=EngineConfig(pool_tokens=100_000),
            cost=CostModel(0.01, 1e-5, 0.0, 1e-8, 0.0),
            cost_source="fit",
            sessions=(StartSession("s", "admitted", 5000, 1),),
            shapes=Shapes(0.0, (), (100,), (10,), (1.0,), (10_000,), 0, 10),
            output_budget=10,
            turn_overhead_s=overhead,
        )
        return run_forecast(inputs, BudgeterConfig(mode="off"), 1, seed=1)["summary"]

    plain, slow = run(0.0), run(2.0)
    # one session alone: a turn takes 0.102 s of engine time (100 prefill tokens, 10 steps of 0.01 s and
    # their context), then the answer arrives `overhead` later and the next turn follows a 1 s tool gap
    assert (plain["p95_turn_latency_s"], slow["p95_turn_latency_s"]) == (0.102, 2.102)
    assert round(plain["turns_per_s"] * 60) == 54 == int(60 / 1.102)  # turns in the minute
    assert round(slow["turns_per_s"] * 60) == 19 == int(60 / 3.102)


def test_a_parked_session_is_admitted_when_a_turn_frees_room_not_at_the_next_tick() -> None:
    """As the sidecar does: the budgeter releases after every finished turn (and on its tick)."""
    inputs = ForecastInputs(
        engine=EngineConfig(pool_tokens=6000),
        cost=CostModel(0.01, 1e-5, 0.0, 1e-8, 0.0),
        cost_source="fit",
        sessions=(
            StartSession("a", "admitted", 5000, 1, in_flight=True),  # its last turn, in the engine at 0
            StartSession("b", "parked", 5000, 1, parked_for_s=30.0),
        ),
        shapes=Shapes(0.0, (), (100,), (10,), (0.05,), (2,), 0, 10),
        output_budget=10,
    )
    result = run_forecast(inputs, BudgeterConfig(mode="budgeter-park"), 1, seed=1)
    summary = result["summary"]
    # a's turn: 100 new tokens and 10 decode steps, 0.102 s. b asks at 0.05 s and is held: a's 5110 tokens
    # of demand are above the low band (0.75 x 6000). a leaves at 0.102 s and b goes at once (not at the
    # tick of 1 s): its 5100 uncached tokens and 10 steps take 0.152 s, so it waited 0.052 s
    assert sum(result["series"]["turns"]) == 2
    assert summary["p95_turn_latency_s"] == pytest.approx(0.052 + 0.152, abs=0.0015)  # at the tick: 1.1 s
    assert (summary["parked_max"], summary["parked_end"]) == (0, 0)


def test_each_session_declares_its_own_output_budget_and_new_ones_draw_from_the_declared() -> None:
    rows, _ = _recorded()
    sessions = [
        {
            "session_id": "x",
            "state": "admitted",
            "context_tokens": 9000,
            "turns": 3,
            "data": {"output_budget": 150},
        },
        {
            "session_id": "y",
            "state": "parked",
            "context_tokens": 9000,
            "turns": 3,
            "data": {"output_budget": 300},
        },
        {
            "session_id": "z",
            "state": "ended",
            "context_tokens": 1,
            "turns": 9,
            "data": {"output_budget": 150},
        },
        {
            "session_id": "w",
            "state": "waiting",
            "context_tokens": 0,
            "turns": 0,
            "data": {"output_budget": "x"},
        },
    ]
    inputs = forecast_inputs(
        pool_tokens=100_000,
        session_rows=sessions,
        turn_rows=rows,
        latency_samples=[],
        fit={"step_overhead_s": "0.006", "prefill_per_token_s": "3e-5"},
        current=BudgeterConfig(mode="off"),
        now=NOW,
    )
    assert [(s.id, s.output_budget) for s in inputs.sessions] == [("w", 0), ("x", 150), ("y", 300)]
    assert inputs.output_budgets == (150, 150, 300)  # ended sessions' too: what clients declare
    assert inputs.output_budget == 1024  # for a client that declares none

    # the budgeter counts each session's own budget: 150 where the default would be 1024
    def parked_mean(budget: int) -> float:
        crowd = tuple(StartSession(f"c{i}", "admitted", 12000, 2, output_budget=budget) for i in range(12))
        run_in = ForecastInputs(
            engine=EngineConfig(pool_tokens=200_000),
            cost=CostModel(0.006, 3e-5, 0.0, 4e-8, 0.0),
            cost_source="fit",
            sessions=crowd,
            shapes=Shapes(0.05, (12000,), (600,), (150,), (2.0,), (40,), 0, 10),
            output_budget=1024,
            output_budgets=(budget,) if budget else (),
        )
        return run_forecast(run_in, BudgeterConfig(mode="budgeter-park"), 3, seed=2)["summary"]["parked_mean"]

    assert parked_mean(150) < parked_mean(0)


def test_the_last_activity_and_the_engines_running_batch_come_from_the_collectors_rows() -> None:
    rows = [
        {
            "session_id": "a",
            "state": "admitted",
            "context_tokens": 1,
            "turns": 1,
            "data": {"in_flight": 1, "last_activity": NOW - 12.5},
        },
        {"session_id": "b", "state": "admitted", "context_tokens": 1, "turns": 1, "data": {}},
        {
            "session_id": "c",
            "state": "admitted",
            "context_tokens": 1,
            "turns": 1,
            "data": {"last_activity": NOW + 3},
        },  # a clock ahead of ours: not negative
    ]
    assert [s.since_activity_s for s in start_sessions(rows, NOW)] == [12.5, 0.0, 0.0]
    samples = [
        {"ts": NOW - 20, "requests_running": 40.0},
        {"ts": NOW - 5, "requests_running": 7.0},  # two ranks of one engine at its newest sample: added
        {"ts": NOW - 5, "requests_running": 5.0},
        {"ts": NOW - 5, "kv_usage": 0.9},
        {"ts": NOW + 1, "requests_running": 99.0},  # after now
        {"requests_running": 98.0},  # no time
    ]
    assert engine_running(samples, NOW) == 12
    assert engine_running(samples[:1], NOW) == 40 and engine_running([], NOW) == 0


def test_the_forecasts_budgeter_parks_the_most_recently_admitted_and_admits_the_first_arrived() -> None:
    """The sidecar's order, from its ``admitted_at`` and ``arrived_at``: without them every session was
    admitted "now" and the park set followed the session ids (on the validation's recovery the parked
    backlog then drained in the wrong order, its draws spread over 8-10 sessions at +5 minutes)."""
    rows = [
        {
            "session_id": sid,
            "state": state,
            "context_tokens": 5000 if state == "admitted" else 0,
            "turns": 1,
            "data": {"admitted_at": admitted, "arrived_at": arrived},
        }
        for sid, state, admitted, arrived in (
            ("a", "admitted", NOW - 10.0, NOW - 10.0),  # the newest admitted: first in the park set
            ("z", "admitted", NOW - 100.0, NOW - 120.0),
            ("m", "waiting", None, NOW - 5.0),
            ("n", "waiting", None, NOW - 50.0),  # arrived first: first to be admitted
        )
    ]
    sessions = start_sessions(rows, NOW)
    assert [(s.id, s.admitted_for_s, s.arrived_for_s) for s in sessions] == [
        ("a", 10.0, 10.0),
        ("m", None, 5.0),
        ("n", None, 50.0),
        ("z", 100.0, 120.0),
    ]
    inputs = ForecastInputs(
        engine=EngineConfig(pool_tokens=9000),
        cost=CostModel(0.01, 1e-5, 0.0, 1e-8, 0.0),
        cost_source="fit",
        sessions=sessions,
        shapes=Shapes(0.0, (), (100,), (10,), (1.0,), (9,), 0, 10),
        output_budget=10,
    )
    budgeter = start_budgeter(inputs, BudgeterConfig(mode="budgeter-park"), 500.0)
    assert budgeter.config.mode == "off"  # the turns in flight were forwarded under the current config
    budgeter.set_config(BudgeterConfig(mode="budgeter-park"))
    # 2 x 5010 tokens of demand above the high band (0.9 x 9000): one is parked, the one admitted last
    assert budgeter.park_set() == ["a"]
    assert budgeter.session("z").admitted_at == 400.0 and budgeter.session("n").arrived_at == 450.0
    assert budgeter.request_turn("a", 500.0, 5100, 10) == "hold"
    # the queue: the parked first, then the waiting by arrival, n before m
    assert [s.id for s in budgeter._queue()] == ["a", "n", "m"]
    budgeter.end_session("z", 501.0)
    assert budgeter.release(501.0) == ["a"]  # its held turn goes to the engine
    # an admitted session of unknown age counts as admitted now; a waiting one is not admitted
    bare = start_sessions([{"session_id": "b", "state": "admitted", "context_tokens": 1, "turns": 1}], NOW)
    assert (bare[0].admitted_for_s, bare[0].arrived_for_s) == (None, 0.0)
    assert (
        start_budgeter(dataclasses.replace(inputs, sessions=bare), BudgeterConfig(), 7.0)
        .session("b")
        .admitted_at
        == 7.0
    )


def _in_flight(ages: dict[str, float], pool: int, running: int = 0, idle: dict[str, float] | None = None):
    """Sessions of 5000 tokens with their last turn in flight (``ages``: seconds since it was forwarded)
    and, ``idle``, between turns (seconds since their last turn); a turn: 100 new tokens, 10 answered."""
    sessions = tuple(
        StartSession(sid, "admitted", 5000, 1, in_flight=True, since_activity_s=age)
        for sid, age in ages.items()
    ) + tuple(
        StartSession(sid, "admitted", 5000, 1, since_activity_s=age) for sid, age in (idle or {}).items()
    )
    return ForecastInputs(
        engine=EngineConfig(pool_tokens=pool),
        cost=CostModel(0.01, 1e-5, 0.0, 1e-8, 0.0),
        cost_source="fit",
        sessions=sessions,
        shapes=Shapes(0.0, (), (100,), (10,), (100.0,), (2,), 0, 10),
        output_budget=10,
        engine_running=running,
    )


def test_turns_in_flight_reach_the_engine_in_the_order_they_were_forwarded(monkeypatch) -> None:
    """The engine's queue is first come, first served: in a pool that runs one at a time, the turn forwarded
    9 s ago finishes first, then the 5 s one, then the 1 s one; each latency counts from its forwarding."""
    finished = []
    real = Budgeter.turn_finished
    monkeypatch.setattr(
        Budgeter,
        "turn_finished",
        lambda self, sid, *a, **k: (finished.append(sid), real(self, sid, *a, **k))[1],
    )
    result = run_forecast(
        _in_flight({"a": 1.0, "b": 9.0, "c": 5.0}, pool=6000), BudgeterConfig(mode="off"), 1
    )
    assert finished == ["b", "c", "a"]
    # b: 9 s before t = 0, then its 5100 uncached tokens and 10 steps, 0.152 s
    assert result["summary"]["p95_turn_latency_s"] == pytest.approx(9.152, abs=0.002)


def test_the_engines_running_batch_is_cached_at_the_start_and_reports_the_hits_it_found() -> None:
    """The engine holds the KV of the turns it is running (the oldest in flight), not only of the contexts
    used last: a pool of two contexts (313 blocks each), one turn in flight 9 s, two sessions between
    turns. Warmed least recently active first alone, the turn in flight finds its context evicted and is
    prefilled again; with the engine's running batch (one request) warmed last, it only decodes the half
    of its answer still to come. Either way it reports the prefix hits the engine found when it took the
    turn, before t = 0 (here none), not the whole prompt its warm-up left cached: a collapsed engine's
    batch reported ~13% and the preview had counted it whole (docs/dashboard.md, "Session 16")."""

    def run(running: int) -> dict:
        inputs = _in_flight({"old": 9.0}, pool=626 * 16, running=running, idle={"x": 0.5, "y": 1.0})
        return run_forecast(inputs, BudgeterConfig(mode="off"), 1)

    cold, warm = run(0), run(1)
    step = 0.01 + 1e-8 * 5100
    # 9 s before t = 0, then 5100 tokens prefilled and 10 steps; or 5 steps, nothing prefilled
    assert cold["summary"]["p95_turn_latency_s"] == pytest.approx(9 + 5100 * 1e-5 + 10 * step, abs=0.001)
    assert warm["summary"]["p95_turn_latency_s"] == pytest.approx(9 + 5 * step, abs=0.001)
    assert sum(cold["series"]["cached_tokens"]) == sum(warm["series"]["cached_tokens"]) == 0


def test_a_running_turn_reports_the_shared_prefix_it_found_not_its_whole_prompt() -> None:
    """Two running turns of sessions behind one 1,600-token shared prefix: the first one warmed found
    nothing, the second the prefix's 100 blocks. Their engine had prefilled both prompts, so neither is
    prefilled again, and the turns report those counts (0 + 1,600) of their 10,200 prompt tokens."""
    inputs = _in_flight({"a": 1.0, "b": 9.0}, pool=20_000, running=2)
    inputs = dataclasses.replace(inputs, shapes=dataclasses.replace(inputs.shapes, shared_prefix=1600))
    result = run_forecast(inputs, BudgeterConfig(mode="off"), 1)
    assert sum(result["series"]["prompt_tokens"]) == 2 * 5100
    assert sum(result["series"]["cached_tokens"]) == 1600


def test_the_running_batch_is_part_way_through_its_answers_and_its_oldest_stay_cached(monkeypatch) -> None:
    """An engine's running batch is at every stage of its answers, the oldest furthest along: a batch of
    K turns starts with (j + 0.5) / K of the j-th oldest one's answer to come, and each finished turn still
    counts its whole answer. Started all from their first token, the batch finished together, seconds late
    (the validation's preview had no turn finished in its first 4 s where the live engine had 24). A pool
    too small for the batch keeps its oldest turns, which the engine took first."""
    done: list[tuple[str, float, int]] = []
    real = Budgeter.turn_finished
    monkeypatch.setattr(
        Budgeter,
        "turn_finished",
        lambda self, sid, now, prompt, completion, **k: (
            done.append((sid, now, completion)),
            real(self, sid, now, prompt, completion, **k),
        )[1],
    )

    def run(pool: int, running: int) -> dict:
        done.clear()
        inputs = _in_flight({"a": 1.0, "b": 9.0, "c": 5.0}, pool=pool, running=running)
        return run_forecast(inputs, BudgeterConfig(mode="off"), 1)

    result = run(20_000, 3)
    # b, c, a: 2, 5 and 8 of their 10 tokens to come (10 x 0.5/3, 1.5/3, 2.5/3); whole answers counted
    assert [(sid, completion) for sid, _, completion in done] == [("b", 10), ("c", 10), ("a", 10)]
    t0 = result["summary"]["warmup_s"]
    times = [now - t0 for _, now, _ in done]
    step = 0.01 + 1e-8 * 3 * 5100  # three running requests of 5100 tokens
    assert times[0] < 3 * step and times[1] < 6 * step and times[2] < 9 * step  # 10 steps each, before
    # the whole prompts cached (318 full blocks each of 5100 tokens): nothing but the tail prefilled; each
    # turn reports what the engine found when it took it (nothing: no shared prefix)
    assert sum(result["series"]["cached_tokens"]) == 0
    # a pool of 640 blocks holds two of the three prompts (319 blocks each): the oldest two, b and c, which
    # finish first; a, evicted, is prefilled again
    small = run(640 * 16, 3)
    assert [sid for sid, _, _ in done] == ["b", "c", "a"]
    a_late = done[2][1] - small["summary"]["warmup_s"] - times[2]
    assert a_late >= 5100 * 1e-5, a_late  # at least its prompt's prefill later than in the larger pool


def test_a_turn_in_flight_or_held_starts_with_the_prompt_the_sidecar_counted() -> None:
    """A new session's first turn in flight has no context yet: its prompt is the one the sidecar counted
    (``pending_prompt_tokens``), not the context plus the new text of a later turn. (Run J's preview gave
    the collapse's 16 new sessions in flight 665-token first prompts where theirs had 6,626: it admitted
    ~6,000 tokens too many for each of them and drained its parked sessions early; docs/dashboard.md,
    "Session 12".) Listings before the field: what the KV demand counts beyond the context and budget."""
    rows = [
        {  # a first turn in flight, the field present
            "session_id": "a",
            "state": "admitted",
            "context_tokens": 0,
            "turns": 0,
            "data": {
                "in_flight": 1,
                "pending_prompt_tokens": 6626,
                "demand_tokens": 6776,
                "output_budget": 150,
            },
        },
        {  # an older listing: demand 6776 = the prompt in flight 6626 + the budget 150
            "session_id": "b",
            "state": "admitted",
            "context_tokens": 0,
            "turns": 0,
            "data": {"in_flight": 1, "demand_tokens": 6776, "output_budget": 150},
        },
        {  # between turns: nothing pending, whatever the demand says
            "session_id": "c",
            "state": "admitted",
            "context_tokens": 9000,
            "turns": 4,
            "data": {"demand_tokens": 9150, "output_budget": 150},
        },
        {  # parked with its next turn held at the gate
            "session_id": "d",
            "state": "parked",
            "context_tokens": 9000,
            "turns": 4,
            "data": {"held": 1, "pending_prompt_tokens": 9665, "parked_since": NOW - 3},
        },
        {  # parked between turns
            "session_id": "e",
            "state": "parked",
            "context_tokens": 9000,
            "turns": 4,
            "data": {"held": 0, "pending_prompt_tokens": 0},
        },
    ]
    got = {s.id: (s.in_flight, s.held, s.pending_prompt) for s in start_sessions(rows, NOW)}
    assert got == {
        "a": (True, False, 6626),
        "b": (True, False, 6626),
        "c": (False, False, 0),
        "d": (False, True, 9665),
        "e": (False, False, 0),
    }


def test_pending_prompts_fall_back_to_a_drawn_first_prompt_or_the_context_plus_new_text() -> None:
    import random

    from simulator.forecast_run import pending_prompt

    sh = Shapes(0.0, (6626,), (665,), (150,), (0.2,), (40,), 0, 10)
    rng = random.Random(0)
    assert (
        pending_prompt(StartSession("a", "admitted", 0, 0, in_flight=True, pending_prompt=7000), rng, sh)
        == 7000
    )
    assert (
        pending_prompt(StartSession("a", "admitted", 0, 0, in_flight=True), rng, sh) == 6626
    )  # a first turn
    assert pending_prompt(StartSession("a", "admitted", 9000, 4, in_flight=True), rng, sh) == 9665
    # a count below the context (a sidecar's estimate from characters): the context plus new text
    assert (
        pending_prompt(StartSession("a", "parked", 9000, 4, held=True, pending_prompt=120), rng, sh) == 9665
    )


def test_a_held_turn_is_asked_for_at_the_start_with_its_prompt() -> None:
    """A waiting session whose turn is at the gate asks at t = 0 with the prompt the sidecar holds; under
    `off` the budgeter admits it at its first tick: its one turn (10,000 tokens) finishes in the minute,
    where a session between turns waits out a 100 s tool gap first, past the minute's end. Its latency
    counts from when it reached the gate (its last activity, 30 s before)."""

    def first_turns(held: bool) -> tuple[int, int, float | None]:
        inputs = ForecastInputs(
            engine=EngineConfig(pool_tokens=200_000),
            cost=CostModel(0.01, 1e-5, 0.0, 1e-8, 0.0),
            cost_source="fit",
            sessions=(
                StartSession(
                    "w",
                    "waiting",
                    0,
                    0,
                    held=held,
                    pending_prompt=10_000 if held else 0,
                    since_activity_s=30.0,
                ),
            ),
            shapes=Shapes(0.0, (500,), (100,), (10,), (100.0,), (1,), 0, 10),
            output_budget=10,
        )
        result = run_forecast(inputs, BudgeterConfig(mode="off"), 1)
        series = result["series"]
        return sum(series["turns"]), sum(series["prompt_tokens"]), result["summary"]["p95_turn_latency_s"]

    turns, prompt, latency = first_turns(held=True)
    assert (turns, prompt) == (1, 10_000) and latency is not None and 30.0 < latency < 32.0
    assert first_turns(held=False) == (0, 0, None)
