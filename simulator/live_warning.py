"""``python -m simulator live-warning``: the collapse-risk warning replayed on real-engine runs (issue 15 item 5).

Reads the ``run.json`` files of ``simulator live-run`` (directories are searched for them) and replays
each run's per-second series through the very code ``simulator warning-eval`` uses for offline runs
(`simulator.warning_eval.signal_points` and ``firings``: the collectors' signal extraction and alert
evaluator), once with the sidecar's inputs and once with the engine's alone.

What differs from the offline evaluation, and why:

* **The onset** is `simulator.warning_eval.onset_s` before the run's first degraded minute as the run
  itself was judged (``summary.degraded_at``: `core.runs` with the run's ``judge_window_min``, 1 minute
  for the runs of a few wall minutes), not the 5-minute windows of the 45-minute offline runs.
* **The prefill capacity** of the risk model's ``missed_prefill`` input (``core.risk``
  ``prefill_capacity_tokens_per_s``, the collectors' ``risk_prefill_capacity_tokens_per_s``) is this
  engine's, from a ``fit.json`` of ``simulator fit`` (``--fit``): the tokens per second of a miss of
  the run's mean prompt, ``n / (T0 + alpha*n + beta*n^2/2)``. Without ``--fit`` the model's default
  (sized for the simulator's engine) is used and the file says so.
* A run lasts minutes, so a warning in a run with no onset counts as a false alarm (there is no
  follow-up to judge it on).

Writes ``DIR/live-warning.json`` (per run: onset, first firings, leads; and the figures of
`simulator.warning_eval.evaluate` over the runs) and ``DIR/live-warning.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from core.alerts import AlertSettings
from simulator import warning_eval as we


def prefill_capacity(fit: dict[str, Any], mean_prompt: float) -> float:
    """Tokens/s of a miss of ``mean_prompt`` tokens on the fitted engine (module doc)."""
    s = fit["set"]
    t0 = float(s.get("step_overhead_s", 0))
    alpha = float(s.get("prefill_per_token_s", 0))
    beta = float(s.get("prefill_attention_s", 0))
    n = max(1.0, mean_prompt)
    seconds = t0 + alpha * n + beta * n * n / 2
    if seconds <= 0:
        raise ValueError(
            f"fit.json 'set' gives a prefill of {seconds} s for {n:.0f} tokens: not a usable fit"
        )
    return n / seconds


def run_files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(p.glob("**/run.json")))
        else:
            out.append(p)
    return out


def judge_live(result: dict[str, Any], fit: dict[str, Any] | None) -> dict[str, Any]:
    """One live run: onset, firing times per input set and rule, and the capacity the replay used."""
    s = result["series"]
    sm = result["summary"]
    turns = sum(s["turns"])
    mean_prompt = sum(s["prompt_tokens"]) / turns if turns else 0.0
    settings = AlertSettings()
    capacity = settings.risk_prefill_capacity_tokens_per_s
    if fit is not None:
        capacity = prefill_capacity(fit, mean_prompt)
        settings = AlertSettings(risk_prefill_capacity_tokens_per_s=capacity)
    degraded = list(sm.get("degraded_at") or [])
    onset = we.onset_s(s["prompt_tokens"], s["cached_tokens"], degraded[0]) if degraded else None
    points = we.signal_points(result)
    agent = result["config"].get("agent", {})
    burst_s = float(agent["burst_start_min"]) * 60.0 if float(agent.get("burst_rate") or 0) > 0 else None
    out: dict[str, Any] = {
        "seed": result["seed"],
        "scenario": result["scenario"],
        "control": result["control"],
        "collapsed": sm.get("collapsed"),
        "first_degraded_min": degraded[0] if degraded else None,
        "onset_s": onset,
        "onset_in_follow_up_s": None,
        "burst_start_s": burst_s,
        "mean_prompt_tokens": round(mean_prompt, 1),
        "prefill_capacity_tokens_per_s": round(capacity, 1),
        "capacity_from_fit": fit is not None,
    }
    for mode in we.MODES:
        fired = we.firings(points[mode], mode, settings)
        out[mode] = fired
        out[f"{mode}_lead_s"] = {
            rule: (None if onset is None or not times else round(onset - times[0], 1))
            for rule, times in fired.items()
        }
    return out


def markdown(rows: list[dict[str, Any]], figures: dict[str, Any]) -> str:
    lines = [
        "| seed | scenario | control | collapsed | burst starts (s) | onset (s) | risk: first warning sidecar / engine (s) "
        "| lead sidecar / engine (s) | collapse alert: first / lead (sidecar, s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def first(times: list[float]) -> str:
        return f"{times[0]:g}" if times else "none"

    for r in rows:
        sc, en = r["sidecar"], r["engine"]
        lead = r["sidecar_lead_s"], r["engine_lead_s"]
        lines.append(
            f"| {r['seed']} | {r['scenario']} | {r['control']} | {r['collapsed']} | {r['burst_start_s']} | {r['onset_s']} | "
            f"{first(sc['collapse-risk'])} / {first(en['collapse-risk'])} | "
            f"{lead[0]['collapse-risk']} / {lead[1]['collapse-risk']} | "
            f"{first(sc['collapse'])} / {lead[0]['collapse']} |"
        )
    lines += [
        "",
        "| inputs | runs | with onset | warned ≥ lead before onset | lead min / median (s) | false-alarm runs |",
    ]
    lines.append("|---|---|---|---|---|---|")
    for mode in we.MODES:
        f = figures[mode]
        lines.append(
            f"| {mode} | {f['runs']} | {f['degraded_runs']} | {f['warned_before_degraded']} "
            f"(≥ {f['required_lead_s']:g} s) | {f['lead_s_min']} / {f['lead_s_median']} | {f['false_alarm_runs']} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "runs", nargs="+", type=Path, help="run.json files of `simulator live-run`, or directories of them"
    )
    p.add_argument(
        "--fit", type=Path, default=None, help="fit.json of `simulator fit` (the engine's prefill capacity)"
    )
    p.add_argument("--scenario", default=None, help="only runs of this scenario (e.g. agent-burst)")
    p.add_argument(
        "--out", type=Path, default=None, help="directory for live-warning.json and live-warning.md"
    )


def command(args: argparse.Namespace) -> int:
    files = run_files(args.runs)
    if not files:
        print(f"error: no run.json under {', '.join(map(str, args.runs))}", file=sys.stderr)
        return 2
    fit = None
    if args.fit is not None:
        try:
            fit = json.loads(args.fit.read_text())
            prefill_capacity(fit, 1000.0)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(
                f"error: --fit {args.fit}: not a usable fit.json of `simulator fit` ({exc})", file=sys.stderr
            )
            return 2
    rows = []
    for f in files:
        try:
            result = json.loads(f.read_text())
            if args.scenario and result.get("scenario") != args.scenario:
                continue
            rows.append(judge_live(result, fit))
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            print(
                f"error: {f}: not a run.json of `simulator live-run` with engine series ({exc!r})",
                file=sys.stderr,
            )
            return 2
    rows.sort(key=lambda r: (r["scenario"], r["control"], r["seed"]))
    figures = we.evaluate(rows)
    md = markdown(rows, figures)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        data = {"fit": str(args.fit) if args.fit else None, **figures, "run_results": rows}
        (args.out / "live-warning.json").write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
        (args.out / "live-warning.md").write_text(md)
    print(md)
    return 0
