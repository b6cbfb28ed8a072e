"""A /metrics page (Prometheus text), or samples read from a Prometheus query API, to a `ParsedPage`.

Pure: text in, plain data out. The dialects, engine labels, summing rules and errors are
specified in `core.engine_metrics`; the tables below say which sample names feed which field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Literal

import core.engine_metrics.histograms as hist
from core.engine_metrics.snapshot import EngineKind, EngineSnapshot, ParsedPage
from core.engine_metrics.text import read_families


class MetricsPageError(ValueError):
    """A /metrics page that cannot give engine signals; the message says why."""


# --------------------------------------------------------------------------------------------
# Which sample names feed which field. Order matters: the first present name wins per field.

_COUNTERS: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
        "cached_tokens": ("vllm:prompt_tokens_cached_total",),
        "preemptions": ("vllm:num_preemptions_total",),
    },
    "sglang": {
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "cached_tokens": ("sglang:cached_tokens_total",),
        "generation_tokens": ("sglang:generation_tokens_total",),
        "preemptions": ("sglang:num_retracted_requests_total",),
    },
}
_GAUGES: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "requests_running": ("vllm:num_requests_running",),
        "requests_waiting": ("vllm:num_requests_waiting",),
    },
    "sglang": {
        "kv_usage": ("sglang:token_usage",),
        "requests_running": ("sglang:num_running_reqs",),
        "requests_waiting": ("sglang:num_queue_reqs",),
        "pool_tokens": ("sglang:max_total_num_tokens",),
    },
}
_ENGINE_LABEL = {"vllm": "engine", "sglang": "dp_rank"}
_CACHE_CONFIG = "vllm:cache_config_info"
_PROCESS_START = "process_start_time_seconds"

# Family names (as in HELP/TYPE lines and before the sample suffix) worth handing to the parser.
_NEEDED_BASES = frozenset(
    {
        n.removesuffix("_total")
        for table in (_COUNTERS, _GAUGES)
        for d in table.values()
        for ns in d.values()
        for n in ns
    }
    | hist.BASES
    | {_CACHE_CONFIG, _PROCESS_START}
)
# One C-level regex pass keeps HELP/TYPE and sample lines of the needed families (``*_created``
# lines never match: they are timestamps, not data). Anything else on the page is not parsed.
_LINE_RE = re.compile(
    r"^(?:# (?:HELP|TYPE) )?(?:"
    + "|".join(re.escape(n) for n in sorted(_NEEDED_BASES, key=len, reverse=True))
    + r")(?:_total|_bucket|_count|_sum)?(?=[ \t{]|$).*$",
    re.MULTILINE,
)


def filter_page(text: str) -> str:
    """Only the lines of the families this module reads (about 5x faster to parse than a whole page)."""
    return "\n".join(_LINE_RE.findall(text)) + "\n"


def detect_kind(text: str) -> EngineKind:
    """``vllm`` or ``sglang`` from the metric name prefixes on the page, else ``unknown``."""
    vllm = text.count("vllm:")
    sglang = text.count("sglang:")
    if vllm == 0 and sglang == 0:
        return "unknown"
    return "vllm" if vllm >= sglang else "sglang"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _check_page(text: str) -> None:
    head = text.lstrip()[:200]
    if not head:
        raise MetricsPageError("empty page: the target answered with no metrics at all")
    if head.startswith("<") or head[:15].lower().startswith("<!doctype"):
        snippet = " ".join(head.split())[:80]
        raise MetricsPageError(
            f"HTML page instead of Prometheus text (starts with {snippet!r}); "
            "check the URL points at the engine's /metrics"
        )
    if head.startswith("{") or head.startswith("["):
        raise MetricsPageError(
            f"JSON instead of Prometheus text (starts with {head[:60]!r}); "
            "is this a sidecar URL given as an engine?"
        )


def parse_engine_metrics(text: str, kind: str = "auto") -> ParsedPage:
    """Parse one /metrics page into per-engine-label snapshots. Raises MetricsPageError."""
    _check_page(text)
    detected = detect_kind(text) if kind in ("auto", "unknown", "") else kind
    if detected not in ("vllm", "sglang"):
        raise MetricsPageError(
            "no vLLM or SGLang metrics on this page (no 'vllm:' or 'sglang:' names); "
            "is the URL an engine's /metrics, and for SGLang is --enable-metrics set?"
        )
    filtered = filter_page(text)
    try:
        families = read_families(filtered)
    except (ValueError, IndexError, TypeError, KeyError) as exc:
        raise MetricsPageError(f"malformed Prometheus text (truncated or garbled page?): {exc}") from None
    return _collect(families, detected)  # type: ignore[arg-type]


def _collect(families: Iterable[object], kind: Literal["vllm", "sglang"]) -> ParsedPage:
    label_key = _ENGINE_LABEL[kind]
    counter_names = _COUNTERS[kind]
    gauge_names = _GAUGES[kind]
    name_to_counter = {n: f for f, ns in counter_names.items() for n in ns}
    name_to_gauge = {n: f for f, ns in gauge_names.items() for n in ns}
    # values[label][sample name] accumulates: sum for counters, max for gauges.
    counters: dict[str, dict[str, float]] = {}
    gauges: dict[str, dict[str, float]] = {}
    buckets: dict[str, dict[str, dict[float, float]]] = {}  # label -> sample name -> le -> count
    hist_names = hist.names_for(kind)
    sum_names = hist.sum_names_for(kind)
    sums: dict[str, dict[str, float]] = {}  # label -> bucket name -> its ``_sum``
    pools: dict[str, int] = {}
    block_sizes: dict[str, int] = {}
    process_start: float | None = None
    models: set[str] = set()
    warnings: list[str] = []
    unit: Literal["tokens", "blocks"] = "tokens"
    nonfinite = 0

    for family in families:
        documentation = getattr(family, "documentation", "") or ""
        if (
            getattr(family, "name", "").startswith("vllm:gpu_prefix_cache_queries")
            and "blocks" in documentation
        ):
            unit = "blocks"
        for sample in getattr(family, "samples", ()):
            name: str = sample.name
            if name.endswith("_created"):
                continue
            labels: dict[str, str] = sample.labels
            label = labels.get(label_key, "")
            if "model_name" in labels:
                models.add(labels["model_name"])
            value = _finite(float(sample.value))
            if name == _PROCESS_START:
                process_start = value
                continue
            if value is None:
                nonfinite += 1
                continue
            if name in name_to_counter:
                per = counters.setdefault(label, {})
                per[name] = per.get(name, 0.0) + value
            elif name in name_to_gauge:
                per = gauges.setdefault(label, {})
                per[name] = max(per.get(name, -math.inf), value)
            elif name in hist_names:
                bound = labels.get("le", "")
                try:
                    le = float(bound)
                except ValueError:
                    continue
                per_b = buckets.setdefault(label, {}).setdefault(name, {})
                per_b[le] = per_b.get(le, 0.0) + value
            elif name in sum_names:
                per_s = sums.setdefault(label, {})
                per_s[sum_names[name]] = per_s.get(sum_names[name], 0.0) + value
            elif name == _CACHE_CONFIG:
                pool = _pool_from_cache_config(labels)
                if pool is not None:
                    pools[label] = pool
                block = _label_int(labels, "block_size")
                if block is not None:
                    block_sizes[label] = block

    if nonfinite:
        warnings.append(f"{nonfinite} NaN or infinite sample(s) ignored")
    if unit == "blocks":
        warnings.append(
            "prefix-cache counters are in blocks (early vLLM V1): the hit ratio is block-weighted"
        )

    engines: dict[str, EngineSnapshot] = {}
    for label in sorted(set(counters) | set(gauges) | set(buckets) | set(pools)):
        fields: dict[str, float | int | None] = {}
        for field_name, names in counter_names.items():
            fields[field_name] = _first(counters.get(label, {}), names)
        for field_name, names in gauge_names.items():
            fields[field_name] = _first(gauges.get(label, {}), names)
        if kind == "sglang":
            # SGLang's token-weighted rate: cached / prompt tokens.
            fields["prefix_cache_queries"] = fields.get("prompt_tokens")
            fields["prefix_cache_hits"] = fields.get("cached_tokens")
            pool_value = fields.pop("pool_tokens", None)
            fields["pool_tokens"] = int(pool_value) if pool_value is not None else None
        else:
            fields["pool_tokens"] = pools.get(label)
            fields["block_size"] = block_sizes.get(label)
            if fields.get("cached_tokens") is None:
                fields["cached_tokens"] = fields.get("prefix_cache_hits")
        per_name = buckets.get(label, {})
        others = ((f, hist.pick(kind, f, per_name)) for f in hist.FAMILIES if f != "ttft")
        engines[label] = EngineSnapshot(
            engine_label=label,
            ttft_buckets=hist.pick(kind, "ttft", per_name),
            histograms=tuple((f, b) for f, b in others if b),
            histogram_sums=hist.pick_sums(kind, per_name, sums.get(label, {})),
            **fields,  # type: ignore[arg-type]
        )
    if kind == "sglang" and engines and all(e.cached_tokens is None for e in engines.values()):
        warnings.append(
            "no sglang:cached_tokens_total on this page (older SGLang): engine-side R_t is "
            "unavailable; sglang:cache_hit_rate covers only the last prefill batch"
        )
    if not engines:
        warnings.append(f"no canonical {kind} engine metrics on this page")
    return ParsedPage(
        kind=kind,
        engines=engines,
        process_start_ts=process_start,
        model_names=tuple(sorted(models)),
        prefix_cache_unit=unit,
        warnings=tuple(warnings),
    )


def page_from_samples(
    samples: Iterable[tuple[str, Mapping[str, str], float]], kind: Literal["vllm", "sglang"] = "vllm"
) -> ParsedPage:
    """The `ParsedPage` of one engine target from (sample name, labels, value) triples, as read from a
    Prometheus query API instead of a /metrics page: the same fields, engine labels and warnings."""
    rows = [SimpleNamespace(name=n, labels=labels, value=v) for n, labels, v in samples]
    return _collect((SimpleNamespace(name="samples", documentation="", samples=rows),), kind)


def _first(values: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in values:
            return values[name]
    return None


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None  # "None" and friends
    if not math.isfinite(value) or value <= 0:
        return None
    return int(value)


def _pool_from_cache_config(labels: Mapping[str, str]) -> int | None:
    tokens = _label_int(labels, "kv_cache_size_tokens")
    if tokens is not None:
        return tokens
    blocks = _label_int(labels, "num_gpu_blocks")
    block_size = _label_int(labels, "block_size")
    if blocks is not None and block_size is not None:
        return blocks * block_size
    return None


def pool_tokens(text: str) -> int | None:
    """The engine's KV pool in tokens from a /metrics page (summed over engine labels), or None.

    vLLM: ``kv_cache_size_tokens`` from ``vllm:cache_config_info``, else ``num_gpu_blocks ×
    block_size``; SGLang: ``sglang:max_total_num_tokens``. None when the page has neither
    or cannot be parsed.
    """
    try:
        page = parse_engine_metrics(text)
    except MetricsPageError:
        return None
    pools = [e.pool_tokens for e in page.engines.values() if e.pool_tokens is not None]
    return sum(pools) if pools else None
