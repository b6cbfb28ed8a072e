"""The retrieval (RAG) workload and the compaction experiment (``rag-storm``).

Open-loop requests over a prefix tree (see ``RagWorkload``): document-set
traffic hits its ~6K-token shared prefix; a storm of short heterogeneous
queries shares only a short preamble, which drives the request-weighted hit
rate up and the token-weighted one down (thin reuse, ``D`` high).

The compaction job rewrites document sets (a new version of their tokens).
Its *need* comes from a request count (every ``compaction_every`` requests all
document sets become due). The naive job compacts whatever is due at once.
The gated job asks the project's compaction gate (``core.compaction
.decide_compaction``) every ``compaction_check_s`` seconds, with the regime from
``core.reuse`` (D over a sliding window, with hysteresis) and warmth from
``core.compaction.SubtreeTracker`` fed by every completed request's
``cached_tokens``, exactly as the sidecar runs them; only granted subtrees are
rewritten and deferred ones stay due (several due cycles fold into one
compaction).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from core.compaction import CompactionPolicy, SubtreeTracker, WarmthConfig, decide_compaction
from core.reuse import RegimeConfig, RegimeDetector, TimeWindow, Turn
from simulator.config import SimConfig
from simulator.content import SegmentContent
from simulator.engine import Engine, Request
from simulator.loop import EventLoop
from simulator.truth import Watch


@dataclass
class _Done:
    t_arrival: float
    t_done: float
    kind: str  # "doc" | "storm" | "cold"
    subtree: str | None
    prompt: int
    cached: int


def _zipf_weights(n: int, s: float) -> list[float]:
    w = [1.0 / (k + 1) ** s for k in range(n)]
    total = sum(w)
    return [x / total for x in w]


def _stats(
    done: list[_Done], t0: float, t1: float, kinds: tuple[str, ...] | None = None, price: float = 0.1
) -> dict[str, Any]:
    sel = [d for d in done if t0 <= d.t_arrival < t1 and (kinds is None or d.kind in kinds)]
    prompt = sum(d.prompt for d in sel)
    cached = sum(d.cached for d in sel)
    hits = sum(1 for d in sel if d.cached > 0)
    rt = cached / prompt if prompt else None
    rr = hits / len(sel) if sel else None
    return {
        "requests": len(sel),
        "token_weighted": None if rt is None else round(rt, 4),
        "request_weighted": None if rr is None else round(rr, 4),
        "divergence": None if rt is None or rr is None else round(rr - rt, 4),
        "relative_input_cost": None if rt is None else round(1 - (1 - price) * rt, 4),
    }


def _after_jobs(docs: list[_Done], jobs: list[float], span: float) -> list[_Done]:
    """Requests of ``docs`` (by arrival) arriving within ``span`` seconds after any of ``jobs`` (sorted)."""
    out = []
    j = 0
    for dd in docs:
        while j < len(jobs) and jobs[j] + span <= dd.t_arrival:
            j += 1
        if j < len(jobs) and jobs[j] <= dd.t_arrival:
            out.append(dd)
    return out


def _rt(sel: list[_Done]) -> float | None:
    prompt = sum(d.prompt for d in sel)
    return round(sum(d.cached for d in sel) / prompt, 4) if prompt else None


def run_rag(cfg: SimConfig, seed: int, minutes: float, watch: Watch | None = None) -> dict[str, Any]:
    """``watch``: record the turn trace and why each missing block was missing (``simulator.truth``).

    The RAG requests have no session: their KV demand is their prompts while in flight (as the
    sidecar's budgeter counts unsessioned requests); an eviction with that above the pool is pressure.
    """
    r = cfg.rag
    engine = Engine(cfg.engine, cfg.cost)
    pool_tokens = cfg.engine.kv_cache_size_tokens
    inflight = [0]
    if watch is not None:
        engine.set_watch(watch)
        watch.classify = lambda label: "pressure" if inflight[0] > pool_tokens else "other"
        watch.group = lambda req: req.tag[1]
    horizon = minutes * 60.0
    n_sec = max(1, int(math.ceil(horizon)))
    rng = random.Random(f"{seed}-rag")
    weights = _zipf_weights(r.doc_sets, r.doc_zipf)
    s0 = r.storm_start_min * 60.0
    s1 = s0 + r.storm_minutes * 60.0

    # arrivals: (t, kind) for the document traffic and the storm
    arrivals: list[tuple[float, str]] = []
    t = 0.0
    while r.rag_rate > 0:
        t += rng.expovariate(r.rag_rate)
        if t >= horizon:
            break
        arrivals.append((t, "doc"))
    t = s0
    storm_rng = random.Random(f"{seed}-storm")
    while r.storm_rate > 0:
        t += storm_rng.expovariate(r.storm_rate)
        if t >= min(s1, horizon):
            break
        arrivals.append((t, "storm"))
    arrivals.sort()

    versions = [0] * r.doc_sets
    subtree_ids = [f"rag-docs-{d}" for d in range(r.doc_sets)]
    tracker = SubtreeTracker(WarmthConfig(window_s=r.warmth_window_s, floor=r.warmth_floor))
    window = TimeWindow(window_s=r.reuse_window_s)
    detector = RegimeDetector(
        RegimeConfig(enter=r.divergence_enter, exit=r.divergence_exit, min_turns=r.regime_min_turns)
    )
    policy = CompactionPolicy(top_k_pinned=r.top_k_pinned)
    due: set[int] = set()
    since = 0
    compactions: list[tuple[float, int]] = []
    done: list[_Done] = []
    series: dict[str, list[Any]] = {
        k: []
        for k in (
            "t",
            "token_weighted",
            "request_weighted",
            "divergence",
            "regime",
            "compactions",
            "running",
            "waiting",
            "kv_usage",
        )
    }
    head = ("rag-head", r.rag_head_tokens)
    subtree_tokens = r.rag_system_tokens - r.rag_head_tokens + r.doc_tokens

    def compact(d: int, now: float) -> None:
        versions[d] += 1
        compactions.append((now, d))
        if watch is not None:
            watch.rewrite(("subtree", d, versions[d] - 1), ("subtree", d, versions[d]))
            watch.prefix_changes.setdefault(subtree_ids[d], []).append(now)

    def on_request_counted(now: float) -> None:
        nonlocal since
        since += 1
        if since < r.compaction_every or r.compaction_trigger == "none":
            return
        since = 0
        if r.compaction_trigger == "naive":
            for d in range(r.doc_sets):
                compact(d, now)
        else:
            due.update(range(r.doc_sets))

    def arrive(i: int, kind: str, now: float) -> None:
        u = rng.random()
        subtree: str | None = None
        if kind == "doc" and u < r.cold_fraction or kind == "storm" and u < r.storm_cold_fraction:
            n = (
                r.rag_system_tokens + r.doc_tokens + r.suffix_tokens
                if kind == "doc"
                else r.rag_head_tokens + r.storm_query_tokens
            )
            content = SegmentContent([(("cold", i), 1 << 40)])
            out = r.rag_output_tokens if kind == "doc" else r.storm_output_tokens
            kind = "cold"
        elif kind == "doc":
            d = rng.choices(range(r.doc_sets), weights)[0]
            subtree = subtree_ids[d]
            # the subtree (system prompt + document set) sits below the tenant preamble; compaction
            # rewrites all of it, so a rewritten subtree keeps only the preamble's blocks
            content = SegmentContent(
                [head, (("subtree", d, versions[d]), subtree_tokens), (("q", i), 1 << 40)]
            )
            n = r.rag_system_tokens + r.doc_tokens + r.suffix_tokens
            out = r.rag_output_tokens
        else:
            content = SegmentContent([head, (("storm", i), 1 << 40)])
            n = r.rag_head_tokens + r.storm_query_tokens
            out = r.storm_output_tokens
        engine.add_request(
            Request(
                id=f"rag-{i}",
                content=content,
                prompt_tokens=n,
                max_tokens=out,
                arrival=now,
                tag=(kind, subtree),
            )
        )
        inflight[0] += n
        if subtree is not None:
            tracker.begin(subtree, now)  # in flight until it finishes, as the sidecar reports it
        on_request_counted(now)

    def finish(req: Request) -> None:
        kind, subtree = req.tag  # type: ignore[misc]
        now = req.finish_time or engine.now
        cached = min(req.cached_tokens or 0, req.prompt_tokens)
        done.append(_Done(req.arrival, now, kind, subtree, req.prompt_tokens, cached))
        inflight[0] -= req.prompt_tokens
        if watch is not None:
            watch.turn(req, now, None, subtree, 0.0, 0.0, now - req.arrival)
        window.add(Turn(t=now, prompt_tokens=req.prompt_tokens, cached_tokens=cached))
        if subtree is not None:
            tracker.end(subtree)
            tracker.record(subtree, now, req.prompt_tokens, cached)

    def arrival(now: float, data: tuple[int, str]) -> None:
        arrive(data[0], data[1], now)

    next_check = r.compaction_check_s

    def tick(now: float, second: int) -> None:
        nonlocal next_check
        stats = window.stats(now)
        regime = detector.update(stats)
        if r.compaction_trigger == "gate" and now >= next_check:
            next_check += r.compaction_check_s
            if due:
                targets = [subtree_ids[d] for d in sorted(due)]
                subtrees = tracker.stats(now)
                if r.gate_asks == "per-subtree":
                    decisions = [
                        dec
                        for t in targets
                        for dec in decide_compaction(
                            [t],
                            subtrees,
                            regime=regime,
                            urgency="normal",
                            now=now,
                            deferred_until=None,
                            policy=policy,
                        )
                    ]
                else:
                    decisions = decide_compaction(
                        targets,
                        subtrees,
                        regime=regime,
                        urgency="normal",
                        now=now,
                        deferred_until=None,
                        policy=policy,
                    )
                for dec in decisions:
                    if dec.decision == "granted":
                        d = int(dec.subtree_id.rsplit("-", 1)[1])
                        compact(d, now)
                        due.discard(d)
        series["t"].append(second)
        series["token_weighted"].append(
            None if stats.token_weighted is None else round(stats.token_weighted, 4)
        )
        series["request_weighted"].append(
            None if stats.request_weighted is None else round(stats.request_weighted, 4)
        )
        series["divergence"].append(None if stats.divergence is None else round(stats.divergence, 4))
        series["regime"].append(regime)
        series["compactions"].append(len(compactions))
        series["running"].append(len(engine.running))
        series["waiting"].append(len(engine.waiting))
        series["kv_usage"].append(round(engine.kv_usage, 4))
        if watch is not None:
            watch.sample(now, inflight[0] / pool_tokens)

    loop = EventLoop(engine, finish)
    for i, (when, kind) in enumerate(arrivals):
        loop.push(when, arrival, (i, kind))
    loop.every_second(n_sec, tick)
    wall_s = loop.run()

    price = r.cached_price
    storm_end = min(s1, horizon)
    docs = sorted((d for d in done if d.subtree is not None), key=lambda d: d.t_arrival)
    # the damage of each compaction job fired mid-storm: subtree traffic arriving in the window after it
    jobs = sorted({c[0] for c in compactions if s0 <= c[0] < storm_end})
    after = _after_jobs(docs, jobs, r.after_compaction_s)
    after_prompt = sum(d.prompt for d in after)
    after_rt = sum(d.cached for d in after) / after_prompt if after_prompt else None
    # ... and over two of the job's cycles (the median gap between its mid-storm jobs)
    gaps = [b - a for a, b in zip(jobs, jobs[1:], strict=False)]
    cycle = sorted(gaps)[len(gaps) // 2] if gaps else None
    two_cycles = _after_jobs(docs, jobs, 2 * cycle) if cycle else []
    per_job = (
        [_stats(docs, j, j + 2 * cycle, ("doc",), r.cached_price)["token_weighted"] for j in jobs]
        if cycle
        else []
    )
    w = r.reuse_window_s
    storm_windows = [
        _stats(docs, s0 + k * w, s0 + (k + 1) * w, ("doc",), r.cached_price)
        for k in range(int((storm_end - s0) // w))
    ]
    in_storm = [c for c in compactions if s0 <= c[0] < storm_end]
    summary: dict[str, Any] = {
        "trigger": r.compaction_trigger,
        "compactions": len(compactions),
        "compactions_in_storm": len(in_storm),
        "compaction_jobs": len({c[0] for c in compactions}),
        "wall_s": round(wall_s, 4),
        "all": _stats(done, 0, horizon, None, price),
        "steady": _stats(done, 0, s0, None, price),
        "storm": _stats(done, s0, storm_end, None, price),
        "after_storm": _stats(done, storm_end, horizon, None, price),
        "subtree_steady": _stats(done, 0, s0, ("doc",), price),
        "subtree_storm": _stats(done, s0, storm_end, ("doc",), price),
        "subtree_after_storm": _stats(done, storm_end, horizon, ("doc",), price),
        "token_weighted_after_compaction": None if after_rt is None else round(after_rt, 4),
        "requests_after_compaction": len(after),
        "compaction_cycle_s": None if cycle is None else round(cycle, 1),
        "token_weighted_two_cycles_after_compaction": _rt(two_cycles),
        "token_weighted_two_cycles_after_each_compaction": per_job,
        # "<= 0.05 for about two cycles after each mid-storm compaction" is bound by the mildest job: the max
        "token_weighted_two_cycles_after_compaction_max": max(
            (v for v in per_job if v is not None), default=None
        ),
        "subtree_storm_window_R_t_min": min(
            (s["token_weighted"] for s in storm_windows if s["token_weighted"] is not None), default=None
        ),
        # subtree traffic in the first and the second reuse window after the storm ends
        "subtree_cost_window_1_after_storm": _stats(docs, storm_end, storm_end + w, ("doc",), price)[
            "relative_input_cost"
        ],
        "subtree_cost_window_2_after_storm": _stats(docs, storm_end + w, storm_end + 2 * w, ("doc",), price)[
            "relative_input_cost"
        ],
    }
    st = summary["storm"]
    summary.update(
        {
            "token_weighted": st["token_weighted"],
            "request_weighted": st["request_weighted"],
            "divergence": st["divergence"],
            "relative_input_cost": summary["subtree_storm"]["relative_input_cost"],
        }
    )
    return {
        "series": series,
        "summary": summary,
        "compaction_events": [[round(t, 2), d] for t, d in compactions],
    }
