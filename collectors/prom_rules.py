"""Prometheus recording and alerting rules equivalent to `core.alerts`, generated from its definitions.

Every rule in `core.alerts.RULES` has an entry in `EXPORTS`: a builder returning the alerting rule(s)
that express it in PromQL over the engine (vLLM current names) and sidecar (``prefixops_sidecar_*``)
metrics, or `NotExpressible` with the reason (exported as a rule that never fires, its annotation
saying why). A test fails when a core rule has no entry.

Thresholds, windows, hold times (``for``) and clear times (``keep_firing_for``, Prometheus >= 2.42) come
from `core.alerts.AlertSettings` (the fleet TOML's ``[alerts]`` table when given). Hysteresis (enter at
one threshold, leave at another) uses the alert's own ``ALERTS{alertstate="firing"}`` series: while
firing, the rule holds until the exit condition is met. What PromQL cannot express exactly is listed in
each alert's ``approximations`` and written into its ``description`` annotation.

Labels of every alert: ``rule`` (the core rule name, also the runbook anchor), ``severity``,
``service="prefixops"``, plus the series' ``job``/``instance`` (and ``engine`` for engine rules).
Alert names are the rule names in CamelCase (``PrefixOpsThinReuse``): Prometheus 2 requires alert names
to be valid metric names, so the hyphenated rule name travels in the ``rule`` label.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.alerts import RULES, SPECS, AlertSettings, runbook_anchor
from core.reuse import DEFAULT_WINDOW_S

SIDECAR_BY = "job, instance"
ENGINE_BY = "job, instance, engine"
# Recent presence of these marks a target as one PrefixOps watches (engine or sidecar).
PRESENCE = "vllm:num_requests_running|prefixops_sidecar_band_high"


def dur(seconds: float) -> str:
    """A PromQL duration: 60 -> 1m, 300 -> 5m, 90 -> 90s, 0.5 -> 500ms."""
    if seconds <= 0:
        return "0s"
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


def num(value: float) -> str:
    return repr(float(value)).removesuffix(".0") if float(value).is_integer() else repr(float(value))


def alert_name(rule: str) -> str:
    return "PrefixOps" + "".join(part.capitalize() for part in rule.split("-"))


@dataclass(frozen=True)
class Names:
    """Recording-rule names for the windows in use."""

    reuse_w: str
    collapse_w: str

    @property
    def rt(self) -> str:
        return f"prefixops:sidecar_token_weighted:ratio_rate{self.reuse_w}"

    @property
    def rr(self) -> str:
        return f"prefixops:sidecar_request_weighted:ratio_rate{self.reuse_w}"

    @property
    def d(self) -> str:
        return f"prefixops:sidecar_divergence:rate{self.reuse_w}"

    @property
    def known(self) -> str:
        return f"prefixops:sidecar_known_turns:increase{self.reuse_w}"

    demand = "prefixops:sidecar_demand_fraction:ratio"
    band_high = "prefixops:sidecar_band_high:max"
    backlog = "prefixops:sidecar_sessions_in_system:sum"
    engine_backlog = "prefixops:engine_requests_in_system:sum"

    @property
    def rt_collapse(self) -> str:
        return f"prefixops:sidecar_token_weighted:ratio_rate{self.collapse_w}"

    @property
    def turns(self) -> str:
        return f"prefixops:sidecar_known_turns:rate{self.collapse_w}"

    @property
    def engine_hit(self) -> str:
        return f"prefixops:engine_hit_ratio:ratio_rate{self.collapse_w}"

    @property
    def engine_gen(self) -> str:
        return f"prefixops:engine_generation_tokens:rate{self.collapse_w}"


@dataclass(frozen=True)
class ExportContext:
    settings: AlertSettings
    reuse_window_s: float = DEFAULT_WINDOW_S
    runbook_base: str = ""
    dashboard_url: str | None = None

    @property
    def names(self) -> Names:
        return Names(dur(self.reuse_window_s), dur(self.settings.collapse_window_s))


@dataclass(frozen=True)
class ExportedAlert:
    rule: str
    expr: str
    for_s: float
    keep_firing_for_s: float
    summary: str
    approximations: tuple[str, ...] = ()
    extra_labels: dict[str, str] = field(default_factory=dict)
    value_is: str = ""  # what {{ $value }} is, for the description


@dataclass(frozen=True)
class NotExpressible:
    rule: str
    reason: str


def recording_rules(ctx: ExportContext) -> list[dict[str, str]]:
    n = ctx.names
    rw, cw = dur(ctx.reuse_window_s), dur(ctx.settings.collapse_window_s)

    def ratio(num_metric: str, den_metric: str, window: str, by: str = SIDECAR_BY) -> str:
        return (
            f"sum by ({by}) (rate({num_metric}[{window}]))\n/\nsum by ({by}) (rate({den_metric}[{window}]))"
        )

    sc = "prefixops_sidecar_"
    return [
        {
            "record": n.rt,
            "expr": ratio(sc + "known_cached_tokens_total", sc + "known_prompt_tokens_total", rw),
        },
        {"record": n.rr, "expr": ratio(sc + "hit_turns_total", sc + "known_turns_total", rw)},
        {"record": n.d, "expr": f"{n.rr} - {n.rt}"},
        {"record": n.known, "expr": f"sum by ({SIDECAR_BY}) (increase({sc}known_turns_total[{rw}]))"},
        {
            "record": n.demand,
            "expr": f"max by ({SIDECAR_BY}) ({sc}demand_tokens)\n/\n"
            f"max by ({SIDECAR_BY}) ({sc}pool_tokens > 0)",
        },
        {"record": n.band_high, "expr": f"max by ({SIDECAR_BY}) ({sc}band_high)"},
        {"record": n.backlog, "expr": f"sum by ({SIDECAR_BY}) ({sc}sessions)"},
        {
            "record": n.rt_collapse,
            "expr": ratio(sc + "known_cached_tokens_total", sc + "known_prompt_tokens_total", cw),
        },
        {"record": n.turns, "expr": f"sum by ({SIDECAR_BY}) (rate({sc}known_turns_total[{cw}]))"},
        {
            "record": n.engine_hit,
            "expr": ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", cw, ENGINE_BY),
        },
        {"record": n.engine_gen, "expr": f"sum by ({ENGINE_BY}) (rate(vllm:generation_tokens_total[{cw}]))"},
        {
            "record": n.engine_backlog,
            "expr": f"sum by ({ENGINE_BY}) (vllm:num_requests_running)\n+\n"
            f"sum by ({ENGINE_BY}) (vllm:num_requests_waiting)",
        },
    ]


def _firing(rule: str, by: str, extra: str = "") -> str:
    matchers = f'alertname="{alert_name(rule)}", alertstate="firing"{extra}'
    return f"max by ({by}) (ALERTS{{{matchers}}})"


def _hysteresis(rule: str, enter: str, value: str, leave: str, by: str = SIDECAR_BY, extra: str = "") -> str:
    """Fires on `enter`; once firing, holds (value `value`) until `leave` holds."""
    return (
        f"(\n  {enter}\n)\nor on ({by}) (\n  {value}\n  and on ({by}) {_firing(rule, by, extra)}\n"
        f"  unless on ({by}) ({leave})\n)"
    )


def _relevant(expr: str) -> str:
    return (
        f"{expr}\nand on (job, instance)\n"
        f'group by (job, instance) (present_over_time({{__name__=~"{PRESENCE}"}}[1h]))'
    )


def _target_down(ctx: ExportContext) -> list[ExportedAlert]:
    s = ctx.settings
    return [
        ExportedAlert(
            "target-down",
            _relevant("up == 0"),
            s.down_for_s,
            s.up_for_s,
            "{{ $labels.instance }} ({{ $labels.job }}) is down: Prometheus cannot scrape it",
            (
                f"'{s.down_after_failures} consecutive failed scrapes' is approximated by up == 0 held for "
                f"{dur(s.down_for_s)} (Prometheus does not count consecutive failures)",
                "watches targets that served vllm:num_requests_running or prefixops_sidecar_band_high in the last hour",
            ),
        )
    ]


def _stale(ctx: ExportContext) -> list[ExportedAlert]:
    s = ctx.settings
    return [
        ExportedAlert(
            "stale-data",
            _relevant(f"(time() - timestamp(up)) > {num(s.stale_after_s)}\nand on (job, instance) up == 1"),
            0.0,
            0.0,
            "no fresh scrape of {{ $labels.instance }} for {{ $value | humanizeDuration }}",
            (f"judges Prometheus' own scrapes: needs a scrape interval under {dur(s.stale_after_s)}",),
            value_is="seconds since the last scrape",
        )
    ]


def _thin(ctx: ExportContext) -> list[ExportedAlert]:
    s, n = ctx.settings, ctx.names
    judged = f"{n.known} >= {num(s.thin_reuse_min_turns)}"
    enter = f"{n.d} >= {num(s.thin_reuse_enter)}\n  and on ({SIDECAR_BY}) {judged}"
    leave = f"{n.d} < {num(s.thin_reuse_exit)} and on ({SIDECAR_BY}) {judged}"
    return [
        ExportedAlert(
            "thin-reuse",
            _hysteresis("thin-reuse", enter, n.d, leave),
            s.thin_reuse_for_s,
            s.thin_reuse_clear_s,
            'thin reuse on {{ $labels.instance }}: D = R_r - R_t = {{ $value | printf "%.2f" }}; defer compaction',
            (
                f"the window is the last {dur(ctx.reuse_window_s)} of turns counted from the sidecar's counters, "
                "not the sidecar's own window object; known turns are counted with increase(), which extrapolates",
                "with no traffic D is undefined and the alert resolves (the collectors hold it instead)",
            ),
            value_is="D",
        )
    ]


def _demand(ctx: ExportContext) -> list[ExportedAlert]:
    s, n = ctx.settings, ctx.names
    enter = f"{n.demand} > on ({SIDECAR_BY}) {n.band_high}"
    leave = f"{n.demand} <= on ({SIDECAR_BY}) ({n.band_high} - {num(s.demand_exit_margin)})"
    return [
        ExportedAlert(
            "demand-over-band",
            _hysteresis("demand-over-band", enter, n.demand, leave),
            s.demand_for_s,
            s.demand_clear_s,
            "KV demand on {{ $labels.instance }} is {{ $value | humanizePercentage }} of the pool, above the high band",
            value_is="demand / pool",
        )
    ]


def _compaction(ctx: ExportContext) -> list[ExportedAlert]:
    s, n = ctx.settings, ctx.names
    seen = max(2 * ctx.reuse_window_s, 60.0)
    expr = (
        f"sum by ({SIDECAR_BY}) (increase(prefixops_sidecar_compaction_decisions_total"
        f'{{decision="granted"}}[{dur(seen)}])) > 0\n'
        f"and on ({SIDECAR_BY}) {n.d} >= {num(s.thin_reuse_enter)}"
    )
    return [
        ExportedAlert(
            "compaction-in-thin-reuse",
            expr,
            0.0,
            s.compaction_hold_s,
            "a compaction was granted on {{ $labels.instance }} during thin reuse",
            (
                f"D is the current D when a grant is seen in the last {dur(seen)}, not the grant's own D",
                f"held {dur(s.compaction_hold_s)} after the grant leaves the {dur(seen)} window (keep_firing_for)",
            ),
            value_is="grants in the window",
        )
    ]


def _admission(ctx: ExportContext) -> list[ExportedAlert]:
    s = ctx.settings
    metric = f"max by ({SIDECAR_BY}) (prefixops_sidecar_oldest_waiting_seconds)"
    enter = f"{metric} > {num(s.admission_wait_s)}"
    leave = f"{metric} <= {num(s.admission_wait_exit_s)}"
    return [
        ExportedAlert(
            "admission-wait",
            _hysteresis("admission-wait", enter, metric, leave),
            s.admission_wait_for_s,
            s.admission_wait_clear_s,
            "sessions on {{ $labels.instance }} wait for admission: the oldest has waited "
            "{{ $value | humanizeDuration }}",
            value_is="the oldest wait in seconds",
        )
    ]


def _collapse(ctx: ExportContext) -> list[ExportedAlert]:
    s, n = ctx.settings, ctx.names
    cw, base = dur(s.collapse_window_s), dur(s.collapse_baseline_s)
    frac = num(s.collapse_throughput_fraction)
    common = (
        f"the reference throughput is the highest {cw} mean of the last {base} including collapsed "
        "windows (the collectors skip those while firing)",
        f"windows are rates over {cw}, not means of per-second samples",
    )

    def build(scope: str, hit: str, thr: str, backlog: str, by: str, what: str) -> ExportedAlert:
        growth = f"({backlog} - {backlog} offset {cw})"
        enter = (
            f"{hit} <= {num(s.collapse_hit_below)}\n"
            f"  and on ({by}) {thr} < {frac} * max_over_time({thr}[{base}])\n"
            f"  and on ({by}) {growth} >= {num(s.collapse_backlog_growth)}"
        )
        leave = f"{hit} >= {num(s.collapse_recover_hit)} and on ({by}) {growth} <= 0"
        return ExportedAlert(
            "collapse",
            _hysteresis("collapse", enter, hit, leave, by, f', scope="{scope}"'),
            s.collapse_for_s,
            s.collapse_clear_s,
            f"collapse on {what}: hit ratio {{{{ $value | humanizePercentage }}}} over {cw}, throughput down, "
            "backlog growing; park sessions (budgeter-park)",
            common,
            {"scope": scope},
            value_is="the hit ratio",
        )

    return [
        build("sidecar", n.rt_collapse, n.turns, n.backlog, SIDECAR_BY, "{{ $labels.instance }}"),
        build(
            "engine",
            n.engine_hit,
            n.engine_gen,
            n.engine_backlog,
            ENGINE_BY,
            "{{ $labels.instance }} engine {{ $labels.engine }}",
        ),
    ]


def _collapse_risk(ctx: ExportContext) -> NotExpressible:
    return NotExpressible(
        "collapse-risk",
        (
            "the score is core.risk's model: the sidecar's inputs are the demand its budgeter projects from each "
            "*admitted* session, the lasting KV demand (the smaller of today's and the projected) and its "
            "least-squares trend, the session backlog's growth and the missed prompt tokens per second, the engine's "
            "are 30-s means, slopes and falls below the best 30-s mean of the last 5 minutes (max_over_time over an "
            "avg_over_time subquery), each mapped through a clamped ramp and weighted; the symptoms count only while "
            "the pool is under pressure (a condition on other inputs per series); the throughput input is "
            "suppressed when the prompt load fell as much (a comparison between two subquery results per series); and "
            "the inputs present decide whether the score exists at all. Each piece has a PromQL approximation, but "
            "together they would be a second, hand-kept copy of a tuned model whose lead times were measured on the "
            "collectors' implementation only (docs/collapse-risk.md); the collectors store the score as the "
            "collapse_risk signal and send this alert to Alertmanager themselves."
        ),
    )


Builder = Callable[[ExportContext], "list[ExportedAlert] | NotExpressible"]

EXPORTS: dict[str, Builder] = {
    "target-down": _target_down,
    "stale-data": _stale,
    "thin-reuse": _thin,
    "demand-over-band": _demand,
    "compaction-in-thin-reuse": _compaction,
    "admission-wait": _admission,
    "collapse": _collapse,
    "collapse-risk": _collapse_risk,
}


def missing_exports() -> list[str]:
    """Core rules with no export entry (a test keeps this empty)."""
    return [rule for rule in RULES if rule not in EXPORTS]


def _annotations(ctx: ExportContext, alert: ExportedAlert) -> dict[str, str]:
    spec = SPECS[alert.rule]
    description = spec.meaning
    if alert.value_is:
        description += f" Value: {alert.value_is} ({{{{ $value }}}})."
    pages = ", ".join(spec.fix_pages)
    description += f" Fix it on the dashboard's {pages} page."
    if alert.approximations:
        description += " PromQL approximations: " + "; ".join(alert.approximations) + "."
    out = {
        "summary": alert.summary,
        "description": description,
        "runbook_url": ctx.runbook_base + runbook_anchor(alert.rule),
    }
    if ctx.dashboard_url:
        out["dashboard_url"] = f"{ctx.dashboard_url.rstrip('/')}/{spec.fix_pages[0]}"
    return out


def alerting_rules(ctx: ExportContext) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for rule in RULES:
        if rule not in EXPORTS:
            raise KeyError(f"core rule {rule!r} has no Prometheus export in collectors.prom_rules.EXPORTS")
        built = EXPORTS[rule](ctx)
        spec = SPECS[rule]
        labels = {"rule": rule, "severity": spec.severity, "service": "prefixops"}
        if isinstance(built, NotExpressible):
            out.append(
                {
                    "alert": alert_name(rule),
                    "expr": "vector(1) < 0",
                    "labels": labels,
                    "annotations": {
                        "summary": f"{rule}: evaluated by the PrefixOps collectors only",
                        "description": f"{spec.meaning} Not expressible in PromQL: {built.reason}",
                        "not_expressible_in_promql": built.reason,
                        "runbook_url": ctx.runbook_base + runbook_anchor(rule),
                    },
                }
            )
            if ctx.dashboard_url:
                annotations = out[-1]["annotations"]
                assert isinstance(annotations, dict)
                annotations["dashboard_url"] = f"{ctx.dashboard_url.rstrip('/')}/{spec.fix_pages[0]}"
            continue
        for alert in built:
            entry: dict[str, object] = {"alert": alert_name(rule), "expr": alert.expr}
            if alert.for_s > 0:
                entry["for"] = dur(alert.for_s)
            if alert.keep_firing_for_s > 0:
                entry["keep_firing_for"] = dur(alert.keep_firing_for_s)
            entry["labels"] = {**labels, **alert.extra_labels}
            entry["annotations"] = _annotations(ctx, alert)
            out.append(entry)
    return out


def rule_groups(ctx: ExportContext) -> dict[str, object]:
    """The rule file's content (``groups:``), recording rules first."""
    return {
        "groups": [
            {"name": "prefixops-recording", "rules": recording_rules(ctx)},
            {"name": "prefixops-alerts", "rules": alerting_rules(ctx)},
        ]
    }
