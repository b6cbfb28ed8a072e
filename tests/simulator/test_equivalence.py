"""The fast mode (run-length pool + decode fast-forward) gives the same hits, evictions and timings as the
exact mode (per-block pool, one scheduler step at a time) on the same seeded workloads."""

from __future__ import annotations

import random

import pytest

from simulator.config import EngineConfig
from simulator.content import SegmentContent
from simulator.engine import Engine, Request
from simulator.offline import run_scenario
from simulator.truth import Watch

SMALL_AGENT = {
    "pool_tokens": "60000",
    "system_prompt_tokens": "500",
    "initial_context": "1200",
    "context_growth": "300",
    "output_tokens": "60",
    "turns": "12",
    "arrival_rate": "0.08",
    "burst_start_min": "2",
    "burst_minutes": "3",
    "control_start_min": "6",
    "tool_latency_mean": "2",
}


def _strip(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in ("wall_s", "sim_minutes_per_wall_s")}


@pytest.mark.parametrize(
    ("scenario", "control", "seed", "extra"),
    [
        ("agent-burst", "off", 1, {"burst_rate": "0.25"}),
        ("agent-burst", "budgeter-park", 2, {"burst_rate": "0.25"}),
        ("agent-flush", "session-cap-park", 3, {"flush_at_min": "4"}),
    ],
)
def test_agent_runs_are_identical_in_fast_and_exact_mode(
    scenario: str, control: str, seed: int, extra: dict[str, str]
) -> None:
    overrides = {**SMALL_AGENT, **extra}
    fast = run_scenario(scenario, control, seed, 12, overrides)
    exact = run_scenario(scenario, control, seed, 12, overrides, exact=True)
    assert fast["mode"] == "fast" and exact["mode"] == "exact"
    assert (
        fast["summary"]["preemptions"] > 0 or fast["summary"]["evicted_blocks"] > 0
    )  # the pool was under pressure
    assert fast["series"] == exact["series"]
    assert _strip(fast["summary"]) == _strip(exact["summary"])


def test_rag_runs_are_identical_in_fast_and_exact_mode() -> None:
    overrides = {
        "pool_tokens": "80000",
        "rag_rate": "1.0",
        "storm_start_min": "1",
        "storm_minutes": "2",
        "storm_rate": "6",
        "compaction_trigger": "naive",
        "compaction_every": "40",
    }
    fast = run_scenario("rag-storm", "off", 5, 4, overrides)
    exact = run_scenario("rag-storm", "off", 5, 4, overrides, exact=True)
    assert fast["series"] == exact["series"]
    assert _strip(fast["summary"]) == _strip(exact["summary"])


def test_engine_request_outcomes_are_identical_per_request() -> None:
    """Random arrivals on a small pool: every request's cached tokens, preemptions and finish time agree."""
    outcomes = {}
    for mode in ("fast", "exact"):
        rng = random.Random(7)
        engine = Engine(EngineConfig(pool_tokens=16 * 150, mode=mode))
        arrivals = sorted((rng.uniform(0, 1), i) for i in range(60))
        done = []
        for t, i in arrivals:
            done += engine.run_until(t)
            while engine.now < t and not engine.idle():
                done += engine.run_until(t)
            # every third request repeats an earlier one's prefix (hits); the rest are new
            c = SegmentContent([("sys", 100), (("r", i - i % 3), 1 << 30)])
            engine.add_request(
                Request(
                    id=f"r{i}",
                    content=c,
                    prompt_tokens=200 + 40 * (i % 10),
                    max_tokens=rng.randint(20, 300),
                    arrival=t,
                )
            )
        while not engine.idle():
            done += engine.run_until(1e9)
        outcomes[mode] = sorted((r.id, r.cached_tokens, r.preemptions, r.finish_time) for r in done)
        outcomes[mode + "-stats"] = (
            engine.stats.prefix_queries,
            engine.stats.prefix_hits,
            engine.stats.preemptions,
            engine.pool.evictions(),
            engine.stats.steps,
        )
    assert outcomes["fast-stats"] == outcomes["exact-stats"]
    assert outcomes["fast-stats"][2] > 0  # preemptions happened
    for (fid, fc, fp, ft), (eid, ec, ep, et) in zip(outcomes["fast"], outcomes["exact"], strict=True):
        assert (fid, fc, fp) == (eid, ec, ep)
        assert ft == pytest.approx(et, rel=1e-9)


@pytest.mark.parametrize(
    ("scenario", "control", "seed", "minutes", "overrides"),
    [
        ("agent-burst", "budgeter-park", 2, 16, {"control_start_min": "8"}),
        (
            "rag-storm",
            "off",
            5,
            4,
            {
                "pool_tokens": "80000",
                "rag_rate": "1.0",
                "storm_start_min": "1",
                "storm_minutes": "2",
                "storm_rate": "6",
                "compaction_trigger": "naive",
                "compaction_every": "40",
            },
        ),
        ("agent-flush", "session-cap-park", 3, 12, {**SMALL_AGENT, "flush_at_min": "4"}),
    ],
)
def test_ground_truth_is_identical_in_fast_and_exact_mode(
    scenario: str, control: str, seed: int, minutes: float, overrides: dict[str, str]
) -> None:
    """The watch (simulator.truth) sees the same keyings and evictions from both pools: the same
    per-turn ground truth, the same per-block state of every label, the same eviction counts."""
    watches = {}
    for exact in (False, True):
        watch = Watch()
        run_scenario(scenario, control, seed, minutes, overrides, exact=exact, watch=watch)
        watches[exact] = watch
    fast, exact_ = watches[False], watches[True]
    assert any(row["truth"] for row in fast.trace)
    assert sum(fast.evicted.values()) > 0
    timing = ("ts", "held_s", "parked_s", "latency_s")  # the closed-form decode sums floats in another order
    for a, b in zip(fast.trace, exact_.trace, strict=True):
        assert {k: v for k, v in a.items() if k not in timing} == {
            k: v for k, v in b.items() if k not in timing
        }
        assert [a[k] for k in timing] == pytest.approx([b[k] for k in timing], abs=1e-6)
    assert fast.evicted == exact_.evicted
    assert fast.codes == exact_.codes
    assert fast.extent == exact_.extent
