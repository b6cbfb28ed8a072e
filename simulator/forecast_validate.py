"""``python -m simulator forecast-validate``: the forecast against what happened (issue 16 item 3's validation).

For each seed, on loopback ports of its own:

1. starts the collapse demo's pieces (``demo.build_services``: the simulated engine, the sidecar, the
   collectors and the load generator of the ``collapse`` scenario, seeded; the dashboard process is
   not needed, its code runs here) and sets the sidecar's mode to ``off`` as the demo does;
2. lets it run under ``off`` for ``--warm`` wall minutes (the engine collapses);
3. takes the preview of ``budgeter-park`` through the Budgeter page's own code
   (``dashboard.forecast_view.start``: the collectors' database only, no fit file unless ``--fit`` or
   ``--fit-engine``; as on the page, the median of ``simulator.forecast_draws.draws_for`` draws, their
   range reported as ``preview_range``)
   for ``--after`` minutes, from the collectors' next sample of the sidecar's state (not their latest,
   up to their interval old), and at once applies ``budgeter-park`` for real through the sidecar's
   authenticated control API (``PUT /control/budgeter``, recorded in its audit log). The preview's
   inputs are read from the database at that moment; its draws run once the live minutes are over
   (``Job.start``): the same answer, computed from the same inputs and seed, but not on the two cores
   the live engine, sidecar, collectors and load share during them (on the page the dashboard's
   process computes it, on a host of its own in a deployment);
4. after ``--after`` wall minutes compares the preview with what happened: R_t of the turns that
   finished in those minutes (the sidecar's turn trace, ``GET /turns``) against the preview's
   ``r_t``, and the sidecar's parked sessions at the end (``GET /state``) against the preview's
   ``parked_end``. Within tolerance: R_t within ``R_T_TOLERANCE``, parked within
   ``PARKED_TOLERANCE`` of what happened or ``PARKED_MIN_SESSIONS``, whichever is larger.

``--fit-engine`` is the operator's path for an engine they have fitted: each seed's engine, once up
and before any load reaches it, is probed with ``simulator fit`` (about 10 s at x10) and the preview is
taken with that file as ``PREFIXOPS_FIT`` (the fit's cost model: ``simulator.forecast_cost.cost_with_fit``);
the preview without the fit is taken at the same moment and
reported beside it (``preview_without_fit``, ``within_without_fit``).

The simulated engine's lag behind wall-clock time (``/sim/state``) is reported: a machine too busy
to keep the engine at its time scale runs a slower engine than the one the collectors recorded. So are
the preview's inputs that matter most here: the recorded arrival rate and the turn overhead
(``simulator.forecast.turn_overhead``); and ``latency_outside_s``, by how much the turns' mean latency
at the sidecar exceeded the engine's own mean e2e in the ``OUTSIDE_WINDOW_S`` before the switch and in
the minutes after it (exact means, from the engine's histogram sum and count): what the forecast's
``turn_overhead`` estimates from the history, and whether the switch itself changed it. ``--truth``
also runs the preview's inputs with the simulated engine's own cost model (``simulator.config.CostModel``
at ``--speed``, in wall seconds): the same sessions and draws on the real engine's costs, so
``truth_speed_ratio`` (the preview's turns/s over that run's) says how much too fast or slow the
estimated cost model is, apart from everything else. ``parked_lead_s`` (`parked_lead_s`) says by how many
seconds the preview's parked count ran ahead of the live one over the second half of the minutes after
the switch: where the backlog drains ~1 session a second, it turns a count off by a few sessions into the
timing error behind it.
Prints one JSON object per seed and a summary line; exits 1 when a seed misses the tolerance, 2 when
the system could not be run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("simulator.forecast_validate")

R_T_TOLERANCE = 0.1
PARKED_TOLERANCE = 0.30
PARKED_MIN_SESSIONS = 3
MODE = "budgeter-park"
OUTSIDE_WINDOW_S = 60.0  # the span before the switch over which ``latency_outside`` is measured
FRESH_STATE_WAIT_S = 3.0  # at most this long for the collectors' next sample of the sidecar (1 s apart)
# Alembic's migration context is process-global: seeds run at once migrate their databases one at a time
_MIGRATING = threading.Lock()


def within(preview: dict[str, Any], actual: dict[str, Any]) -> dict[str, bool]:
    """The issue's tolerance: R_t within 0.1; parked within 30% or 3 sessions, whichever is larger."""
    r_ok = (
        preview.get("r_t") is not None
        and actual.get("r_t") is not None
        and abs(preview["r_t"] - actual["r_t"]) <= R_T_TOLERANCE
    )
    allowed = max(PARKED_MIN_SESSIONS, PARKED_TOLERANCE * actual["parked_end"])
    return {"r_t": bool(r_ok), "parked": abs(preview["parked_end"] - actual["parked_end"]) <= allowed}


def parked_lead_s(
    live: Sequence[tuple[float, int]],
    preview: Sequence[int],
    *,
    from_s: float,
    step_s: float = 0.25,
    max_s: float = 20.0,
) -> float | None:
    """Seconds the preview's parked count runs ahead of what happened (negative: behind).

    ``live``: (seconds after the switch, parked sessions); ``preview``: the preview's count once a second,
    the i-th at i + 1 s. The lead is the ``d`` (a multiple of ``step_s``, up to ``max_s`` either way, the
    smallest first on a tie) for which the preview at ``t - d`` matches the live count at ``t`` best, in
    least squares over the live samples at ``from_s`` or later (where the preview has a value). At +5
    minutes the backlog drains ~1 session a second, so a few seconds of lead decide the parked tolerance
    of ``within``; this says how many. None without a sample to compare.
    """
    n = len(preview)

    def at(t: float) -> float | None:  # the preview at t seconds, linear between its seconds
        if not 1.0 <= t <= n:
            return None
        i = int(t) - 1  # preview[i] is at i + 1 s
        return float(preview[i]) if i == n - 1 else preview[i] + (preview[i + 1] - preview[i]) * (t - i - 1)

    best: tuple[float, float] | None = None
    steps = round(max_s / step_s)
    for k in sorted(range(-steps, steps + 1), key=abs):
        d = k * step_s
        errors = [
            (v - live_count) ** 2 for t, live_count in live if t >= from_s and (v := at(t - d)) is not None
        ]
        if errors and (best is None or sum(errors) / len(errors) < best[1]):
            best = (d, sum(errors) / len(errors))
    return None if best is None else best[0]


def turns_between(sidecar: str, token: str, start: float, end: float) -> list[dict[str, Any]]:
    out, after = [], 0
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
        while True:
            page = client.get(f"{sidecar}/turns", params={"after_id": after, "limit": 10000}).json()
            out += [t for t in page["turns"] if start < t["ts"] <= end]
            if not page["turns"]:
                return out
            after = page["next_after_id"]


def actual_r_t(turns: list[dict[str, Any]]) -> float | None:
    ok = [t for t in turns if t.get("outcome") == "ok"]
    prompt = sum(t["prompt_tokens"] or 0 for t in ok)
    return (
        round(sum(min(t["cached_tokens"] or 0, t["prompt_tokens"] or 0) for t in ok) / prompt, 4)
        if prompt
        else None
    )


def e2e_totals(engine: str) -> tuple[float, float] | None:
    """The engine's end-to-end latency histogram: its sum and count over every label (``/metrics``, read by
    `core.engine_metrics`, which keeps the ``_sum`` of that histogram); ``(0, 0)`` before any request."""
    from core.engine_metrics import parse_engine_metrics

    try:
        text = httpx.get(f"{engine}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    snap = parse_engine_metrics(text).total()
    buckets = dict(snap.histograms).get("e2e") or ((0.0, 0.0),)
    return dict(snap.histogram_sums).get("e2e", 0.0), buckets[-1][1]


def latency_outside(
    turns: list[dict[str, Any]], first: tuple[float, float] | None, last: tuple[float, float] | None
) -> float | None:
    """Mean sidecar latency of the ``ok`` turns minus the engine's mean e2e between two ``e2e_totals``.

    Exact where the forecast's ``turn_overhead`` is an estimate (interval medians against the
    histogram's interpolated ``e2e_p50``): what the validation's engine and its clients add to a turn
    beyond the engine's own clock, before and after the switch.
    """
    ok = [t["latency_s"] for t in turns if t.get("outcome") == "ok" and t.get("latency_s") is not None]
    if not ok or first is None or last is None or last[1] <= first[1]:
        return None
    return round(sum(ok) / len(ok) - (last[0] - first[0]) / (last[1] - first[1]), 3)


def fit_engine(engine: str, out: Path) -> str:
    """``simulator fit`` of the (idle) engine into ``out``; its path, for the preview's ``PREFIXOPS_FIT``."""
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "fit", "--engine", engine, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"simulator fit of {engine} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return str(out)


def _lag(engine: str) -> float | None:
    try:
        s = httpx.get(f"{engine}/sim/state", timeout=5).json()
        return round(max(0.0, s["sim_time_s"] - s["engine_time_s"]), 2)
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def _parked(sidecar: str) -> int:
    return int(httpx.get(f"{sidecar}/state", timeout=10).json()["backlog"]["parked"])


def _next_sample(url: str, sidecar_id: int, timeout: float = FRESH_STATE_WAIT_S) -> dict[str, Any]:
    """The sidecar's state as the collectors record it next (polled every 50 ms, at most ``timeout``
    seconds; then the latest): a preview taken from it starts from a state a few ms old, not up to
    the collectors' interval."""
    from dashboard import data

    data.clear_caches()
    side = data.sidecar_states(url)[sidecar_id]
    deadline, seen = time.monotonic() + timeout, side["ts"]
    while side["ts"] <= seen and time.monotonic() < deadline:
        time.sleep(0.05)
        data.clear_caches()
        side = data.sidecar_states(url)[sidecar_id]
    return side


def preview(url: str, minutes: float, fit: str | None, *, fresh: bool = False) -> tuple[Any, dict[str, Any]]:
    """The Budgeter page's forecast job for ``budgeter-park`` from the collectors' database, its inputs read
    now and its draws not yet run (``Job.start``, once the live minutes are over: module doc). ``fresh``:
    from the collectors' next sample of the sidecar's state (``_next_sample``), not their latest."""
    from dashboard import data, forecast_view
    from dashboard import preview as pv
    from dashboard.settings import Settings

    data.clear_caches()
    ref = next(r for r in data.engines(url) if r.sidecar_target_id is not None)
    sid = ref.sidecar_target_id
    side = _next_sample(url, sid) if fresh else data.sidecar_states(url)[sid]
    state = side["state"].get("budgeter") or {}
    sessions = data.sessions(url, (ref.sidecar_target_id,))
    current = pv.current_config(state)
    proposed = current.replace(mode=MODE)
    job, note = forecast_view.start(
        Settings(database_url=url, fit_path=fit),
        ref,
        state,
        sessions,
        current,
        proposed,
        minutes,
        time.time(),
        begin=False,
    )
    if job is None:
        raise RuntimeError(f"no forecast: {note}")
    return job, {"state_age_s": round(time.time() - side["ts"], 1), "state_ts": side["ts"], "note": note}


def _keep(data_dir: Path, job: Any, parked_seen: list[int], parked_at: list[float]) -> None:
    """The preview's inputs (``forecast-inputs.pickle``, to run it again offline with
    ``simulator.forecast_run.run_forecast``) and the parked series, live every 2 s (``live_at_s``: when,
    in seconds after the switch) and previewed every second (``parked.json``), in the seed's data
    directory."""
    import pickle

    (data_dir / "forecast-inputs.pickle").write_bytes(
        pickle.dumps((job.inputs, job.configs, job.minutes, job.seed))
    )
    series = {
        "live_every_2s": parked_seen,
        "live_at_s": parked_at,
        "preview_every_1s": job.results[1]["series"]["parked"],
    }
    (data_dir / "parked.json").write_text(json.dumps(series))


def _cost_fields(cost: Any) -> dict[str, float]:
    keys = ("step_overhead_s", "prefill_per_token_s", "prefill_attention_s", "decode_per_ctx_token_s")
    return {k: float(f"{getattr(cost, k):.4g}") for k in keys}


def true_cost_preview(job: Any, speed: float) -> dict[str, Any]:
    """The preview of ``MODE`` again on the same inputs and seed with the simulated engine's own cost model."""
    import dataclasses

    from simulator.config import CostModel
    from simulator.forecast_draws import run_draws

    true = CostModel(**{f.name: getattr(CostModel(), f.name) / speed for f in dataclasses.fields(CostModel)})
    inputs = dataclasses.replace(job.inputs, cost=true)
    s = run_draws(inputs, job.configs[1], job.minutes, job.seed, job.draws)["summary"]
    est = job.results[1]["summary"]["turns_per_s"]
    return {
        "preview_truth": {k: s[k] for k in ("r_t", "turns_per_s", "parked_end", "p95_turn_latency_s")},
        "truth_speed_ratio": round(est / s["turns_per_s"], 3) if s["turns_per_s"] else None,
    }


def validate_seed(seed: int, args: argparse.Namespace, ports: tuple[int, int]) -> dict[str, Any]:
    """One seed of the protocol (module doc); the system it starts is stopped before it returns."""
    from demo.services import wait_ready
    from demo.stack import build_services, ensure_admin_account, set_control_mode

    data_dir = (args.data_dir / f"seed-{seed}").resolve()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    token = secrets.token_urlsafe(24)
    ns = argparse.Namespace(
        host="127.0.0.1",
        engine_port=ports[0],
        sidecar_port=ports[1],
        dashboard_port=0,
        scenario="collapse",
        speed=args.speed,
        data_dir=data_dir,
        database_url=None,
        seed=seed,
        engine="simulator",
        engine_url=None,
    )
    services = [s for s in build_services(ns, token) if s.name != "dashboard"]
    url = services[2].env["DATABASE_URL"]
    engine, sidecar = f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"
    with _MIGRATING:
        ensure_admin_account(url, secrets.token_urlsafe(12))
    lags: list[float] = []
    fit = args.fit
    try:
        for s in services:
            s.start()
            if s.ready_url:
                wait_ready(s, timeout=90)
            if s.name == "simulator" and args.fit_engine:
                fit = fit_engine(engine, data_dir / "fit.json")
            if s.name == "sidecar":
                set_control_mode(sidecar, token, "off")
        started = time.time()
        before: tuple[float, tuple[float, float] | None] | None = None
        while time.time() - started < args.warm * 60:
            time.sleep(5)
            if before is None and time.time() - started >= args.warm * 60 - OUTSIDE_WINDOW_S:
                before = (time.time(), e2e_totals(engine))
            if (lag := _lag(engine)) is not None:
                lags.append(lag)
            for s in services:
                if s.proc is not None and s.proc.poll() is not None:
                    raise RuntimeError(f"{s.name} exited ({s.proc.returncode}):\n{s.tail()}")
        # each latency_outside pairs the turns and the engine's totals of one span: the previews take
        # seconds, and a collapsed turn finishing between two readings moves a mean by hundreds of ms
        previewed = (time.time(), e2e_totals(engine))
        # with a fit, the preview without one too (the same database, a moment earlier): what the fit changes
        plain = preview(url, args.after, None)[0] if fit else None
        # the compared preview last, from a state sampled just now, and the switch at once: each second
        # between the two is a second of collapse the live run drains and the preview does not (~0.4
        # sessions), where the count at the end drains ~0.8 a second (docs/dashboard.md, "Session 16")
        job, info = preview(url, args.after, fit, fresh=True)
        at_switch = e2e_totals(engine)
        switched = time.time()
        set_control_mode(sidecar, token, MODE)
        parked_seen, parked_at = [], []
        while time.time() - switched < args.after * 60:
            time.sleep(2)
            parked_seen.append(_parked(sidecar))
            parked_at.append(round(time.time() - switched, 2))
            if (lag := _lag(engine)) is not None:
                lags.append(lag)
        end = switched + args.after * 60
        parked_end = _parked(sidecar)
        parked_end_at = round(time.time() - switched, 2)
        at_end = e2e_totals(engine)
        ended = time.time()
        turns = turns_between(sidecar, token, switched, end)
        outside = {
            "before": latency_outside(
                turns_between(sidecar, token, before[0], previewed[0]) if before else [],
                before[1] if before else None,
                previewed[1],
            ),
            "after": latency_outside(turns_between(sidecar, token, switched, ended), at_switch, at_end),
        }
        for j in (job, plain):  # one at a time: each one's forecast_wall_s is its own
            if j is None:
                continue
            j.start()
            while j.finished is None:
                time.sleep(0.5)
            if j.error:
                raise RuntimeError(f"the forecast failed: {j.error}")
        cur, prop = (r["summary"] for r in job.results)
        _keep(data_dir, job, parked_seen, parked_at)
        actual = {
            "r_t": actual_r_t(turns),
            "turns_per_s": round(len(turns) / (args.after * 60), 3),
            "parked_end": parked_end,
            "parked_mean": round(sum(parked_seen) / len(parked_seen), 2) if parked_seen else None,
        }
        predicted = {
            k: prop[k] for k in ("r_t", "turns_per_s", "parked_end", "parked_mean", "p95_turn_latency_s")
        }
        spread = job.results[1].get("spread", {})
        cost = job.inputs.cost
        truth = true_cost_preview(job, args.speed) if args.truth else {}
        if plain is not None:
            p = plain.results[1]["summary"]
            without = {k: p[k] for k in ("r_t", "turns_per_s", "parked_end", "parked_mean")}
            truth |= {
                "preview_without_fit": without,
                "within_without_fit": within(without, actual),
                "cost_without_fit": _cost_fields(plain.inputs.cost),
            }
        return {
            "seed": seed,
            "speed": args.speed,
            "warm_min": args.warm,
            "after_min": args.after,
            "preview": predicted,
            "preview_draws": job.draws,
            "preview_range": {k: spread[k] for k in ("r_t", "turns_per_s", "parked_end") if k in spread},
            "preview_off": {k: cur[k] for k in ("r_t", "turns_per_s", "parked_end")},
            "parked_lead_s": parked_lead_s(
                [*zip(parked_at, parked_seen, strict=True), (parked_end_at, parked_end)],
                job.results[1]["series"]["parked"],
                from_s=args.after * 30,
            ),
            "actual": actual,
            "within": within(predicted, actual),
            "forecast_wall_s": round(job.finished - job.started, 2),
            "cost_source": job.inputs.cost_source,
            "cost_estimated": list(job.inputs.cost_estimated),
            "cost": _cost_fields(cost),
            "sessions_at_start": len(job.inputs.sessions),
            "arrivals_per_min": round(job.inputs.shapes.arrival_rate * 60, 2),
            "turn_overhead_s": round(job.inputs.turn_overhead_s, 3),
            "turn_overhead_from": job.inputs.turn_overhead_from,
            "latency_outside_s": outside,
            **truth,
            "engine_lag_max_s": max(lags, default=None),
            # the preview starts from the state the collectors recorded; the live switch comes this much later
            "switch_after_state_s": round(switched - info.pop("state_ts"), 2),
            **info,
        }
    finally:
        for s in reversed(services):
            s.stop()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--warm", type=float, default=10.0, help="wall minutes under `off` before the switch")
    p.add_argument(
        "--after", type=float, default=5.0, help="wall minutes after the switch (and of the preview)"
    )
    p.add_argument(
        "--speed", type=float, default=10.0, help="the simulated engine's time scale (the demo's x10)"
    )
    p.add_argument(
        "--fit",
        default=None,
        help="a `simulator fit` file of the engine (default: none, as on a "
        "fresh install: the cost model is estimated from recorded latencies)",
    )
    p.add_argument(
        "--fit-engine",
        action="store_true",
        help="probe each seed's engine with `simulator fit` before its load starts and preview with "
        "that fit (the path of an operator who fitted the engine)",
    )
    p.add_argument("--parallel", action="store_true", help="run the seeds at once (ports of their own)")
    p.add_argument(
        "--truth",
        action="store_true",
        help="also run the preview's inputs with the simulated engine's own cost model (how far the "
        "estimated one is from it)",
    )
    p.add_argument("--base-port", type=int, default=18400, help="seed i uses base+2i and base+2i+1")
    p.add_argument("--data-dir", type=Path, default=Path("data/forecast-validate"))
    p.add_argument("--json", type=Path, default=None, help="also write the results here")


def run(args: argparse.Namespace, ports: list[tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    """Every seed of ``args.seeds`` (``ports``: the engine's and the sidecar's of each; default from --base-port)."""
    if ports is None:
        ports = [(args.base_port + 2 * i, args.base_port + 2 * i + 1) for i in range(len(args.seeds))]
    jobs = list(zip(args.seeds, ports, strict=True))
    if args.parallel:
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            return list(pool.map(lambda j: validate_seed(j[0], args, j[1]), jobs))
    return [validate_seed(seed, args, ports) for seed, ports in jobs]


def command(args: argparse.Namespace) -> int:
    try:
        results = run(args)
    except RuntimeError as exc:
        print(f"error: {exc}")
        return 2
    for r in results:
        print(json.dumps(r))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    bad = [r["seed"] for r in results if not all(r["within"].values())]
    print(
        f"{len(results) - len(bad)}/{len(results)} seeds within tolerance"
        + (f"; missed: {bad}" if bad else "")
    )
    return 1 if bad else 0
