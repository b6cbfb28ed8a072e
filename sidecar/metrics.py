"""Prometheus exposition of the sidecar's state, computed at scrape time from the ControlPlane.

Every metric is declared once in `METRICS` (name, type, labels, meaning, how to read it);
the collector yields from that list and docs/sidecar-metrics.md is generated from it
(``python -m sidecar.metrics > docs/sidecar-metrics.md``; a test fails when it drifts).
A scrape never advances the regime: it reports what the clock-driven tick last judged.

For PromQL: ``R_t = rate(known_cached_tokens_total) / rate(known_prompt_tokens_total)`` and
``R_r = rate(hit_turns_total) / rate(known_turns_total)`` over any window; turns whose engine
did not report cached tokens are in neither (they are unknown, not misses).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _float_to_go_string

from core.budgeter import CONTROLS, SESSION_STATES

if TYPE_CHECKING:
    from .control import ControlPlane

P = "prefixops_sidecar_"

Kind = Literal["counter", "gauge", "histogram"]
Samples = list[tuple[tuple[str, ...], Any]]


@dataclass(frozen=True)
class MetricDef:
    name: str  # without the prefix and without _total
    kind: Kind
    doc: str
    labels: tuple[str, ...]
    read: Callable[[ControlPlane, dict[str, Any]], Samples]

    @property
    def exposed(self) -> str:
        return P + self.name + ("_total" if self.kind == "counter" else "")


def one(value: Any) -> Samples:
    return [] if value is None else [((), value)]


def _c(name: str, doc: str, read: Callable[[ControlPlane, dict[str, Any]], Any]) -> MetricDef:
    return MetricDef(name, "counter", doc, (), lambda cp, ctx: one(read(cp, ctx)))


def _g(name: str, doc: str, read: Callable[[ControlPlane, dict[str, Any]], Any]) -> MetricDef:
    return MetricDef(name, "gauge", doc, (), lambda cp, ctx: one(read(cp, ctx)))


def _reuse(attr: str) -> Callable[[ControlPlane, dict[str, Any]], Samples]:
    return lambda cp, ctx: (
        [] if getattr(ctx["stats"], attr) is None else [((ctx["window"],), getattr(ctx["stats"], attr))]
    )


METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        "reuse_token_weighted",
        "gauge",
        "R_t: cached / prompt tokens over the window",
        ("window",),
        _reuse("token_weighted"),
    ),
    MetricDef(
        "reuse_request_weighted",
        "gauge",
        "R_r: turns with cached tokens > 0 / turns over the window",
        ("window",),
        _reuse("request_weighted"),
    ),
    MetricDef(
        "reuse_divergence", "gauge", "D = R_r - R_t over the window", ("window",), _reuse("divergence")
    ),
    MetricDef(
        "reuse_low_cached_fraction",
        "gauge",
        "fraction of turns with under half their prompt cached",
        ("window",),
        _reuse("low_cached_fraction"),
    ),
    MetricDef(
        "reuse_turns",
        "gauge",
        "turns in the window",
        ("window", "cached_reported"),
        lambda cp, ctx: [
            ((ctx["window"], "yes"), ctx["stats"].known_turns),
            ((ctx["window"], "no"), ctx["stats"].unknown_turns),
        ],
    ),
    _g(
        "regime_thin_reuse",
        "1 while the thin-reuse regime holds (as the last tick judged it)",
        lambda cp, ctx: 1.0 if cp.regime.regime == "thin-reuse" else 0.0,
    ),
    _g(
        "demand_tokens",
        "KV demand of admitted sessions and unsessioned requests in flight",
        lambda cp, ctx: cp.budgeter.demand_tokens(),
    ),
    _g(
        "pool_tokens", "KV pool size in tokens (absent when unknown)", lambda cp, ctx: cp.budgeter.pool_tokens
    ),
    _g("band_low", "low band (fraction of the pool)", lambda cp, ctx: cp.budgeter.config.low),
    _g("band_high", "high band (fraction of the pool)", lambda cp, ctx: cp.budgeter.config.high),
    MetricDef(
        "mode",
        "gauge",
        "1 for the active control mode",
        ("mode",),
        lambda cp, ctx: [((m,), 1.0 if cp.budgeter.config.mode == m else 0.0) for m in CONTROLS],
    ),
    MetricDef(
        "sessions",
        "gauge",
        "sessions by state (admitted, parked, waiting)",
        ("state",),
        lambda cp, ctx: [((s,), ctx["counts"][s]) for s in SESSION_STATES],
    ),
    _g("held_requests", "requests held at the sidecar right now", lambda cp, ctx: cp.held_requests),
    _g(
        "in_flight_requests",
        "requests forwarded to the engine and not finished",
        lambda cp, ctx: cp.in_flight,
    ),
    _g(
        "oldest_waiting_seconds",
        "how long the oldest waiting session has waited for admission (0 when none)",
        lambda cp, ctx: ctx["oldest"][0] or 0.0,
    ),
    _g(
        "oldest_parked_seconds",
        "how long the oldest parked session has been parked (0 when none)",
        lambda cp, ctx: ctx["oldest"][1] or 0.0,
    ),
    _c("turns", "completed turns with usage", lambda cp, ctx: cp.counters.turns),
    _c(
        "unknown_turns",
        "completed turns without cached_tokens reported",
        lambda cp, ctx: cp.counters.unknown_turns,
    ),
    _c("prompt_tokens", "prompt tokens of completed turns", lambda cp, ctx: cp.counters.prompt_tokens),
    _c("cached_tokens", "cached prompt tokens of completed turns", lambda cp, ctx: cp.counters.cached_tokens),
    _c(
        "completion_tokens",
        "completion tokens of completed turns",
        lambda cp, ctx: cp.counters.completion_tokens,
    ),
    _c(
        "known_prompt_tokens",
        "prompt tokens of turns whose engine reported cached tokens (R_t denominator)",
        lambda cp, ctx: cp.counters.known_prompt_tokens,
    ),
    _c(
        "known_cached_tokens",
        "cached tokens of turns whose engine reported them (R_t numerator)",
        lambda cp, ctx: cp.counters.known_cached_tokens,
    ),
    _c(
        "known_turns",
        "turns whose engine reported cached tokens (R_r denominator)",
        lambda cp, ctx: cp.counters.known_turns,
    ),
    _c(
        "hit_turns",
        "known turns with cached tokens > 0 (R_r numerator)",
        lambda cp, ctx: cp.counters.hit_turns,
    ),
    _c(
        "unsessioned_requests",
        "requests without X-Session-Id",
        lambda cp, ctx: cp.counters.unsessioned_requests,
    ),
    _c("held", "requests ever held", lambda cp, ctx: cp.counters.held_total),
    _c(
        "hold_timeouts",
        "held requests answered 503 after --max-hold",
        lambda cp, ctx: cp.counters.hold_timeouts,
    ),
    _c(
        "hold_disconnects",
        "held requests whose client went away",
        lambda cp, ctx: cp.counters.hold_disconnects,
    ),
    _c("engine_errors", "engine connection failures and timeouts", lambda cp, ctx: cp.counters.engine_errors),
    _c(
        "parks",
        "sessions parked (automatically at a turn boundary, or by an operator)",
        lambda cp, ctx: cp.counters.parks,
    ),
    _c(
        "unparks",
        "parked sessions re-admitted (by the budgeter or an operator unpark)",
        lambda cp, ctx: cp.counters.unparks,
    ),
    _c(
        "compaction_deferrals",
        "compaction decisions that deferred a subtree",
        lambda cp, ctx: sum(n for (d, _), n in cp.decision_counts.items() if d == "deferred"),
    ),
    MetricDef(
        "requests",
        "counter",
        "proxied requests by endpoint and outcome",
        ("endpoint", "outcome"),
        lambda cp, ctx: sorted(cp.counters.requests.items()),
    ),
    MetricDef(
        "sessions_ended",
        "counter",
        "sessions ended by reason",
        ("reason",),
        lambda cp, ctx: [((r,), n) for r, n in sorted(cp.counters.sessions_ended.items())],
    ),
    MetricDef(
        "compaction_decisions",
        "counter",
        "compaction decisions per subtree",
        ("decision", "urgency"),
        lambda cp, ctx: sorted(cp.decision_counts.items()),
    ),
    _g(
        "compaction_deferred_until",
        "end of the operator compaction deferral (Unix s), 0 if none",
        lambda cp, ctx: cp.compaction_state()["deferred_until"] or 0.0,
    ),
    MetricDef(
        "admission_wait_seconds",
        "histogram",
        "how long held turns waited from arrival to being forwarded",
        (),
        lambda cp, ctx: [((), cp.admission_waits)],
    ),
    MetricDef(
        "park_duration_seconds",
        "histogram",
        "how long parks lasted, from park to re-admission, unpark or the session's end",
        (),
        lambda cp, ctx: [((), cp.park_durations)],
    ),
)


def float_to_go(value: float) -> str:
    """Prometheus' own spelling of a bucket bound (``30.0``, ``+Inf``)."""
    text: str = _float_to_go_string(value)  # type: ignore[no-untyped-call]
    return text


def _family(m: MetricDef, samples: Samples) -> Metric:
    name = P + m.name
    if m.kind == "histogram":
        h = HistogramMetricFamily(name, m.doc, labels=list(m.labels))
        for labels, stats in samples:
            buckets = [(float_to_go(bound), float(n)) for bound, n in stats.cumulative()]
            h.add_metric(list(labels), buckets=buckets, sum_value=stats.sum)
        return h
    family: Metric = (CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily)(
        name, m.doc, labels=list(m.labels)
    )
    for labels, value in samples:
        family.add_metric(list(labels), float(value))  # type: ignore[attr-defined]
    return family


class SidecarCollector(Collector):
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def collect(self) -> Iterator[Metric]:
        cp = self.cp
        ctx = {
            "stats": cp.window.stats(cp.clock()),
            "window": f"{cp.window.window_s:g}s",
            "counts": cp.budgeter.counts(),
            "oldest": cp.oldest_waits(),
        }
        for m in METRICS:
            yield _family(m, m.read(cp, ctx))


def metrics_table() -> str:
    """docs/sidecar-metrics.md, generated from `METRICS`."""
    rows = [
        "# Sidecar metrics",
        "",
        "Generated from `sidecar.metrics.METRICS` by `python -m sidecar.metrics > docs/sidecar-metrics.md`;",
        "a test fails when this file drifts. Served at the sidecar's `GET /metrics` (no token needed).",
        "",
        "| name | type | labels | meaning |",
        "|---|---|---|---|",
    ]
    for m in METRICS:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        rows.append(f"| `{m.exposed}` | {m.kind} | {labels} | {m.doc} |")
    rows += [
        "",
        "R_t over a window in PromQL: `rate(prefixops_sidecar_known_cached_tokens_total[5m]) / "
        "rate(prefixops_sidecar_known_prompt_tokens_total[5m])`; R_r: "
        "`rate(prefixops_sidecar_hit_turns_total[5m]) / rate(prefixops_sidecar_known_turns_total[5m])`.",
    ]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(metrics_table(), end="")
