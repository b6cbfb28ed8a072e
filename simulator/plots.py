"""Plots of offline runs and experiments (matplotlib, Agg backend); no model code here.

Each function takes the plain data a run or an experiment returns and writes a PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.runs import DEGRADED_THRESHOLD


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _minutes_axis(series: dict[str, list[Any]]) -> list[float]:
    return [t / 60.0 for t in series["t"]]


def plot_run(result: dict[str, Any], path: Path) -> None:
    plt = _plt()
    s = result["series"]
    x = _minutes_axis(s)
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    ax = axes[0]
    ax.plot(
        x, [v if v is not None else float("nan") for v in s["token_weighted"]], label="token-weighted (R_t)"
    )
    ax.plot(
        x,
        [v if v is not None else float("nan") for v in s["request_weighted"]],
        label="request-weighted (R_r)",
        alpha=0.7,
    )
    ax.plot(
        x,
        [v if v is not None else float("nan") for v in s["engine_hit_ratio"]],
        label="engine hit ratio",
        alpha=0.7,
        linestyle=":",
    )
    ax.axhline(DEGRADED_THRESHOLD, color="grey", linewidth=0.8, linestyle="--")
    ax.set_ylabel("hit rate (60 s)")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower left", fontsize=8)
    ax = axes[1]
    ax.plot(x, s["turns_per_s"], label="turns/s (60 s)")
    ax.set_ylabel("turns/s")
    ax = axes[2]
    ax.plot(x, s["sessions_in_system"], label="sessions in system")
    ax.plot(x, s["parked"], label="parked")
    ax.plot(x, s.get("waiting_sessions", [0] * len(x)), label="waiting for admission")
    ax.plot(x, s["running"], label="running requests", alpha=0.6)
    ax.set_ylabel("count")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[3]
    ax.plot(x, s["kv_usage"], label="kv_cache_usage_perc (vLLM)")
    ax.plot(x, s["kv_resident"], label="KV resident incl. cached-free (sim)")
    pool = result["config"]["engine"]["pool_tokens"]
    ax.plot(x, [d / pool for d in s["demand_tokens"]], label="budgeter demand / pool")
    ax.set_ylabel("fraction of pool")
    ax.set_xlabel("simulated minutes")
    ax.legend(loc="upper left", fontsize=8)
    ctl = result["config"]["control"]["control_start_min"]
    for ax in axes:
        ax.axvline(ctl, color="red", linewidth=0.8, alpha=0.6)
    sm = result["summary"]
    fig.suptitle(
        f"{result['scenario']} / {result['control']} / seed {result['seed']}: "
        f"collapsed={sm.get('collapsed')} recovered={sm.get('recovered')} "
        f"end hit ratio={sm.get('end_hit_ratio')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_table3(results: list[dict[str, Any]], rows: list[str], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(len(rows), 1, figsize=(10, 2.1 * len(rows)), sharex=True)
    for ax, row in zip(axes, rows, strict=True):
        for r in results:
            if r["row"] != row or not r["summary"]["collapsed"]:
                continue
            s = r["series"]
            ax.plot(
                [t / 60 for t in s["t"]],
                [v if v is not None else float("nan") for v in s["token_weighted"]],
                linewidth=0.8,
                alpha=0.7,
            )
            ax.axvline(r["control_start_min"], color="red", linewidth=0.8)
        ax.axhline(DEGRADED_THRESHOLD, color="grey", linestyle="--", linewidth=0.8)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("R_t")
        ax.set_title(f"{row}: collapsed runs, token-weighted hit rate (60 s)", fontsize=9)
    axes[-1].set_xlabel("simulated minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_rag(result: dict[str, Any], path: Path) -> None:
    plt = _plt()
    s = result["series"]
    x = [t / 60 for t in s["t"]]
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax = axes[0]
    for key, label in (("token_weighted", "R_t"), ("request_weighted", "R_r"), ("divergence", "D")):
        ax.plot(x, [v if v is not None else float("nan") for v in s[key]], label=label)
    ax.axhline(result["config"]["rag"]["divergence_enter"], color="grey", linestyle="--", linewidth=0.8)
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
        ax.axvspan(
            cfg["storm_start_min"], cfg["storm_start_min"] + cfg["storm_minutes"], color="orange", alpha=0.15
        )
    fig.suptitle(f"rag-storm / trigger {cfg['compaction_trigger']} / seed {result['seed']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_compaction(results: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for ax, trig in zip(axes, ("none", "naive", "gate"), strict=True):
        for r in results:
            if r["trigger"] != trig:
                continue
            s = r["series"]
            ax.plot(
                [t / 60 for t in s["t"]],
                [v if v is not None else float("nan") for v in s["token_weighted"]],
                linewidth=0.8,
            )
        cfg = results[0]["config"]["rag"]
        ax.axvspan(
            cfg["storm_start_min"], cfg["storm_start_min"] + cfg["storm_minutes"], color="orange", alpha=0.15
        )
        ax.set_ylim(0, 1)
        ax.set_ylabel("R_t (60 s)")
        ax.set_title(f"trigger: {trig}", fontsize=9)
    axes[-1].set_xlabel("simulated minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
