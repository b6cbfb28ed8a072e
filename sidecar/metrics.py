"""Prometheus exposition of the sidecar's state, computed at scrape time from the ControlPlane."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from core.budgeter import CONTROLS, SESSION_STATES

if TYPE_CHECKING:
    from .control import ControlPlane

P = "prefixops_sidecar_"


def _gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
    g = GaugeMetricFamily(P + name, doc)
    if value is not None:
        g.add_metric([], float(value))
    return g


class SidecarCollector(Collector):
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily]:
        cp = self.cp
        now = cp.clock()
        stats = cp.window.stats(now)
        regime = cp.regime.regime  # as the last tick judged it: a scrape does not advance it
        window = f"{cp.window.window_s:g}s"
        for name, doc, value in (
            ("reuse_token_weighted", "R_t: cached / prompt tokens over the window", stats.token_weighted),
            ("reuse_request_weighted", "R_r: turns with cached tokens > 0 / turns over the window",
             stats.request_weighted),
            ("reuse_divergence", "D = R_r - R_t over the window", stats.divergence),
            ("reuse_low_cached_fraction", "fraction of turns with under half their prompt cached",
             stats.low_cached_fraction),
        ):
            g = GaugeMetricFamily(P + name, doc, labels=["window"])
            if value is not None:
                g.add_metric([window], value)
            yield g
        g = GaugeMetricFamily(P + "reuse_turns", "turns in the window", labels=["window", "cached_reported"])
        g.add_metric([window, "yes"], stats.known_turns)
        g.add_metric([window, "no"], stats.unknown_turns)
        yield g
        yield _gauge("regime_thin_reuse", "1 while the thin-reuse regime holds", 1.0 if regime == "thin-reuse" else 0.0)
        b = cp.budgeter
        yield _gauge("demand_tokens", "KV demand of admitted sessions and unsessioned requests in flight",
                     b.demand_tokens())
        yield _gauge("pool_tokens", "KV pool size in tokens (absent when unknown)", b.pool_tokens)
        yield _gauge("band_low", "low band (fraction of the pool)", b.config.low)
        yield _gauge("band_high", "high band (fraction of the pool)", b.config.high)
        mode = GaugeMetricFamily(P + "mode", "1 for the active control mode", labels=["mode"])
        for name in CONTROLS:
            mode.add_metric([name], 1.0 if b.config.mode == name else 0.0)
        yield mode
        counts = b.counts()
        sessions = GaugeMetricFamily(P + "sessions", "sessions by state", labels=["state"])
        for state in SESSION_STATES:
            sessions.add_metric([state], counts[state])
        yield sessions
        yield _gauge("held_requests", "requests held at the sidecar right now", cp.held_requests)
        yield _gauge("in_flight_requests", "requests forwarded to the engine and not finished", cp.in_flight)
        c = cp.counters
        for name, doc, value in (
            ("turns", "completed turns with usage", c.turns),
            ("unknown_turns", "completed turns without cached_tokens reported", c.unknown_turns),
            ("prompt_tokens", "prompt tokens of completed turns", c.prompt_tokens),
            ("cached_tokens", "cached prompt tokens of completed turns", c.cached_tokens),
            ("completion_tokens", "completion tokens of completed turns", c.completion_tokens),
            ("unsessioned_requests", "requests without X-Session-Id", c.unsessioned_requests),
            ("held", "requests ever held", c.held_total),
            ("hold_timeouts", "held requests answered 503 after --max-hold", c.hold_timeouts),
            ("hold_disconnects", "held requests whose client went away", c.hold_disconnects),
            ("engine_errors", "engine connection failures and timeouts", c.engine_errors),
        ):
            yield CounterMetricFamily(P + name, doc, value=value)
        requests = CounterMetricFamily(P + "requests", "proxied requests by endpoint and outcome",
                                       labels=["endpoint", "outcome"])
        for (endpoint, outcome), n in sorted(c.requests.items()):
            requests.add_metric([endpoint, outcome], n)
        yield requests
        ended = CounterMetricFamily(P + "sessions_ended", "sessions ended by reason", labels=["reason"])
        for reason, n in sorted(c.sessions_ended.items()):
            ended.add_metric([reason], n)
        yield ended
        decisions = CounterMetricFamily(P + "compaction_decisions", "compaction decisions per subtree",
                                        labels=["decision", "urgency"])
        for (decision, urgency), n in sorted(cp.decision_counts.items()):
            decisions.add_metric([decision, urgency], n)
        yield decisions
        deferral = cp.compaction_state()["deferred_until"]
        yield _gauge("compaction_deferred_until", "end of the operator compaction deferral (Unix s), 0 if none",
                     deferral or 0.0)
