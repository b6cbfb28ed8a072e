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

import heapq
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.compaction import CompactionPolicy, SubtreeTracker, WarmthConfig, decide_compaction
from core.reuse import RegimeConfig, RegimeDetector, TimeWindow, Turn
from simulator.config import SimConfig
from simulator.content import SegmentContent
from simulator.engine import Engine, Request


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


def _stats(done: list[_Done], t0: float, t1: float, kinds: tuple[str, ...] | None = None,
           price: float = 0.1) -> dict[str, Any]:
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


def run_rag(cfg: SimConfig, seed: int, minutes: float) -> dict[str, Any]:
    r = cfg.rag
    engine = Engine(cfg.engine, cfg.cost)
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

    events: list[tuple[float, int, int, Any]] = []
    seq = 0

    def push(when: float, kind: int, data: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (when, seq, kind, data))

    ARRIVE, TICK = 0, 1
    for i, (when, kind) in enumerate(arrivals):
        push(when, ARRIVE, (i, kind))
    for s in range(1, n_sec + 1):
        push(float(s), TICK, s)

    versions = [0] * r.doc_sets
    subtree_ids = [f"rag-docs-{d}" for d in range(r.doc_sets)]
    tracker = SubtreeTracker(WarmthConfig(window_s=r.warmth_window_s, floor=r.warmth_floor))
    window = TimeWindow(window_s=r.reuse_window_s)
    detector = RegimeDetector(RegimeConfig(enter=r.divergence_enter, exit=r.divergence_exit,
                                           min_turns=r.regime_min_turns))
    policy = CompactionPolicy(top_k_pinned=r.top_k_pinned)
    due: set[int] = set()
    since = 0
    compactions: list[tuple[float, int]] = []
    done: list[_Done] = []
    series: dict[str, list[Any]] = {k: [] for k in ("t", "token_weighted", "request_weighted", "divergence",
                                                      "regime", "compactions", "running", "waiting", "kv_usage")}
    head = ("rag-head", r.rag_head_tokens)
    subtree_tokens = r.rag_system_tokens - r.rag_head_tokens + r.doc_tokens

    def compact(d: int, now: float) -> None:
        versions[d] += 1
        compactions.append((now, d))

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
            n = r.rag_system_tokens + r.doc_tokens + r.suffix_tokens if kind == "doc" else \
                r.rag_head_tokens + r.storm_query_tokens
            content = SegmentContent([(("cold", i), 1 << 40)])
            out = r.rag_output_tokens if kind == "doc" else r.storm_output_tokens
            kind = "cold"
        elif kind == "doc":
            d = rng.choices(range(r.doc_sets), weights)[0]
            subtree = subtree_ids[d]
            # the subtree (system prompt + document set) sits below the tenant preamble; compaction
            # rewrites all of it, so a rewritten subtree keeps only the preamble's blocks
            content = SegmentContent([head, (("subtree", d, versions[d]), subtree_tokens),
                                      (("q", i), 1 << 40)])
            n = r.rag_system_tokens + r.doc_tokens + r.suffix_tokens
            out = r.rag_output_tokens
        else:
            content = SegmentContent([head, (("storm", i), 1 << 40)])
            n = r.rag_head_tokens + r.storm_query_tokens
            out = r.storm_output_tokens
        engine.add_request(Request(id=f"rag-{i}", content=content, prompt_tokens=n, max_tokens=out,
                                   arrival=now, tag=(kind, subtree)))
        on_request_counted(now)

    def finish(req: Request) -> None:
        kind, subtree = req.tag  # type: ignore[misc]
        now = req.finish_time or engine.now
        cached = min(req.cached_tokens or 0, req.prompt_tokens)
        done.append(_Done(req.arrival, now, kind, subtree, req.prompt_tokens, cached))
        window.add(Turn(t=now, prompt_tokens=req.prompt_tokens, cached_tokens=cached))
        if subtree is not None:
            tracker.record(subtree, now, req.prompt_tokens, cached)

    wall0 = time.perf_counter()
    next_check = r.compaction_check_s
    while events:
        when = events[0][0]
        finished = engine.run_until(when)
        if finished:
            for req in finished:
                finish(req)
            continue
        when, _, kind, data = heapq.heappop(events)
        if kind == ARRIVE:
            arrive(data[0], data[1], when)
            continue
        stats = window.stats(when)
        regime = detector.update(stats)
        if r.compaction_trigger == "gate" and when >= next_check:
            next_check += r.compaction_check_s
            if due:
                targets = [subtree_ids[d] for d in sorted(due)]
                decisions = decide_compaction(targets, tracker.stats(when), regime=regime, urgency="normal",
                                              now=when, deferred_until=None, policy=policy)
                for dec in decisions:
                    if dec.decision == "granted":
                        d = int(dec.subtree_id.rsplit("-", 1)[1])
                        compact(d, when)
                        due.discard(d)
        series["t"].append(int(data))
        series["token_weighted"].append(None if stats.token_weighted is None else round(stats.token_weighted, 4))
        series["request_weighted"].append(None if stats.request_weighted is None
                                          else round(stats.request_weighted, 4))
        series["divergence"].append(None if stats.divergence is None else round(stats.divergence, 4))
        series["regime"].append(regime)
        series["compactions"].append(len(compactions))
        series["running"].append(len(engine.running))
        series["waiting"].append(len(engine.waiting))
        series["kv_usage"].append(round(engine.kv_usage, 4))
    wall_s = time.perf_counter() - wall0

    price = r.cached_price
    storm_end = min(s1, horizon)
    # the damage of each compaction job fired mid-storm: subtree traffic arriving in the window after it
    jobs = sorted({c[0] for c in compactions if s0 <= c[0] < min(s1, horizon)})
    after = []
    j = 0
    for dd in sorted((d for d in done if d.subtree is not None), key=lambda d: d.t_arrival):
        while j < len(jobs) and jobs[j] + r.after_compaction_s <= dd.t_arrival:
            j += 1
        if j < len(jobs) and jobs[j] <= dd.t_arrival:
            after.append(dd)
    after_prompt = sum(d.prompt for d in after)
    after_rt = sum(d.cached for d in after) / after_prompt if after_prompt else None
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
    }
    st = summary["storm"]
    summary.update({"token_weighted": st["token_weighted"], "request_weighted": st["request_weighted"],
                    "divergence": st["divergence"], "relative_input_cost": summary["subtree_storm"][
                        "relative_input_cost"]})
    return {"series": series, "summary": summary, "compaction_events": [[round(t, 2), d] for t, d in compactions]}


def plot_rag(result: dict[str, Any], path: Path) -> None:
    from simulator.experiments import _plt

    plt = _plt()
    s = result["series"]
    x = [t / 60 for t in s["t"]]
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax = axes[0]
    for key, label in (("token_weighted", "R_t"), ("request_weighted", "R_r"), ("divergence", "D")):
        ax.plot(x, [v if v is not None else float("nan") for v in s[key]], label=label)
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=0.8)
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=8)
    ax.set_ylabel("60 s window")
    ax = axes[1]
    ax.plot(x, s["compactions"], label="subtree compactions (cumulative)")
    ax.set_ylabel("count")
    ax.set_xlabel("simulated minutes")
    ax.legend(fontsize=8)
    cfg = result["config"]["rag"]
    for ax in axes:
        ax.axvspan(cfg["storm_start_min"], cfg["storm_start_min"] + cfg["storm_minutes"], color="orange", alpha=0.15)
    fig.suptitle(f"rag-storm / trigger {cfg['compaction_trigger']} / seed {result['seed']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------ the experiment
def _job(job: tuple[str, int, float, dict[str, str], bool]) -> dict[str, Any]:
    from simulator.offline import run_scenario

    trigger, seed, minutes, overrides, exact = job
    res = run_scenario("rag-storm", "off", seed, minutes, {**overrides, "compaction_trigger": trigger}, exact)
    return {"trigger": trigger, "seed": seed, "summary": res["summary"], "series": res["series"],
            "config": res["config"]}


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(sum(vals) / len(vals), 4) if vals else None


def compaction_experiment(runs: int, seed_base: int, minutes: float, overrides: dict[str, str], exact: bool,
                          out: Path, jobs: int) -> int:
    import json
    from multiprocessing import Pool

    from tqdm import tqdm

    triggers = ("none", "naive", "gate")
    work = [(t, s, minutes, overrides, exact) for s in range(seed_base, seed_base + runs) for t in triggers]
    results: list[dict[str, Any]] = []
    with Pool(jobs) as pool:
        for res in tqdm(pool.imap_unordered(_job, work), total=len(work), desc="compaction runs", unit="run"):
            results.append(res)
    table: dict[str, Any] = {"runs": runs, "seed_base": seed_base, "minutes": minutes}
    for trig in triggers:
        rs = [r for r in results if r["trigger"] == trig]
        sm = [r["summary"] for r in rs]
        table[trig] = {
            "compactions": [s["compactions"] for s in sm],
            "compactions_in_storm": [s["compactions_in_storm"] for s in sm],
            "steady_R_t": _mean([s["steady"]["token_weighted"] for s in sm]),
            "steady_R_r": _mean([s["steady"]["request_weighted"] for s in sm]),
            "steady_cost": _mean([s["steady"]["relative_input_cost"] for s in sm]),
            "storm_R_t": _mean([s["storm"]["token_weighted"] for s in sm]),
            "storm_R_r": _mean([s["storm"]["request_weighted"] for s in sm]),
            "storm_D": _mean([s["storm"]["divergence"] for s in sm]),
            "subtree_storm_R_t": _mean([s["subtree_storm"]["token_weighted"] for s in sm]),
            "subtree_storm_cost": _mean([s["subtree_storm"]["relative_input_cost"] for s in sm]),
            "subtree_after_storm_R_t": _mean([s["subtree_after_storm"]["token_weighted"] for s in sm]),
            "R_t_after_compaction": _mean([s["token_weighted_after_compaction"] for s in sm]),
            "wall_s": _mean([s["wall_s"] for s in sm]),
        }
    (out / "compaction.json").write_text(json.dumps(table, indent=1) + "\n")
    md = compaction_markdown(table)
    (out / "compaction.md").write_text(md)
    plot_compaction(results, out / "compaction.png")
    print(md)
    return 0


def compaction_markdown(t: dict[str, Any]) -> str:
    def f(v: Any) -> str:
        return "—" if v is None else f"{v:.2f}"

    lines = [f"`rag-storm`, {t['runs']} seeds from {t['seed_base']}, {t['minutes']:g} simulated minutes "
             "(means over seeds). Steady = before the storm; storm columns cover the storm window; "
             "subtree = document-set traffic, the traffic compaction rewrites.", "",
             "| trigger | compactions (storm) | steady R_t / R_r | storm R_t / R_r / D | subtree R_t in storm | "
             "subtree R_t after each compaction | subtree relative input cost in storm |",
             "|---|---|---|---|---|---|---|"]
    for trig in ("none", "naive", "gate"):
        d = t[trig]
        comp = sum(d["compactions"]) / max(1, len(d["compactions"]))
        comp_storm = sum(d["compactions_in_storm"]) / max(1, len(d["compactions_in_storm"]))
        lines.append(f"| {trig} | {comp:.1f} ({comp_storm:.1f}) | {f(d['steady_R_t'])} / {f(d['steady_R_r'])} | "
                     f"{f(d['storm_R_t'])} / {f(d['storm_R_r'])} / {f(d['storm_D'])} | {f(d['subtree_storm_R_t'])} | "
                     f"{f(d['R_t_after_compaction'])} | {f(d['subtree_storm_cost'])} |")
    return "\n".join(lines) + "\n"


def plot_compaction(results: list[dict[str, Any]], path: Path) -> None:
    from simulator.experiments import _plt

    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for ax, trig in zip(axes, ("none", "naive", "gate"), strict=True):
        for r in results:
            if r["trigger"] != trig:
                continue
            s = r["series"]
            ax.plot([t / 60 for t in s["t"]], [v if v is not None else float("nan") for v in s["token_weighted"]],
                    linewidth=0.8)
        cfg = results[0]["config"]["rag"]
        ax.axvspan(cfg["storm_start_min"], cfg["storm_start_min"] + cfg["storm_minutes"], color="orange", alpha=0.15)
        ax.set_ylim(0, 1)
        ax.set_ylabel("R_t (60 s)")
        ax.set_title(f"trigger: {trig}", fontsize=9)
    axes[-1].set_xlabel("simulated minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
