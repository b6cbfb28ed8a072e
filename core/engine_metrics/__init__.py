"""Engine /metrics pages (Prometheus text) to canonical engine signals. Pure: text in, plain data out.

Three dialects are understood, picked per page (``kind="auto"``) from the metric
name prefix, or forced by the caller:

- **vLLM V1, current names**: ``vllm:prefix_cache_queries_total`` / ``_hits_total``
  (tokens), ``vllm:kv_cache_usage_perc``, ``vllm:num_requests_running`` /
  ``_waiting``, ``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total``, ``vllm:prompt_tokens_cached_total``,
  ``vllm:time_to_first_token_seconds`` and ``vllm:cache_config_info``; the serving histograms of
  `core.engine_metrics.histograms` (end-to-end latency, inter-token latency, queue time, prompt and
  output lengths) where the page has them.
- **vLLM legacy names** (before 0.9.2, still exported in 0.10.x):
  ``vllm:gpu_prefix_cache_queries_total`` / ``_hits_total`` and
  ``vllm:gpu_cache_usage_perc``; used only when the current name is absent. Early V1
  counted prefix-cache queries in *blocks* (its HELP text says so); the ratio of
  hits to queries is still the token-weighted hit rate's best estimate, and
  `ParsedPage.warnings` says so.
- **SGLang**: ``sglang:prompt_tokens_total`` and ``sglang:cached_tokens_total`` (the
  token-weighted rate; every ``cache_source`` counts as cached), ``token_usage``,
  ``max_total_num_tokens``, ``num_running_reqs``, ``num_queue_reqs``,
  ``num_retracted_requests_total`` (retractions, reported as preemptions),
  ``generation_tokens_total``, ``time_to_first_token_seconds``.

Engine labels: vLLM's ``engine`` label and SGLang's ``dp_rank`` (data-parallel
ranks) are kept apart, one `EngineSnapshot` per value (``""`` when a sample has
none). SGLang's tokenizer-side counters carry no ``dp_rank``; in a data-parallel
page they are filed under ``""`` (the whole server). Within one engine label,
counters are summed over their other labels (``is_streaming``, ``cache_source``,
``model_name``); gauges take the largest value (tensor/pipeline ranks repeat the
same number). `ParsedPage.total()` sums across engine labels.

``*_created`` samples are timestamps, not data, and are ignored. NaN and
infinite values count as missing. KV pool in tokens: ``kv_cache_size_tokens``
from ``vllm:cache_config_info`` where present, else ``num_gpu_blocks ×
block_size``; SGLang ``max_total_num_tokens``.

Errors: `MetricsPageError` (a ``ValueError``) with a reason a person can act
on, for an empty page, an HTML page, text the Prometheus parser rejects (truncated
mid-line, garbage) or a page with no engine metrics at all.

The package: `snapshot` (the snapshot and page types, summing across engine labels), `parse`
(pages and query-API samples to a `ParsedPage`), `interval` (two snapshots to interval signals)
and `histograms` (bucket series to interval quantiles). Their public names are this package's API,
imported from here.
"""

from __future__ import annotations

from core.engine_metrics.histograms import histogram_quantile
from core.engine_metrics.interval import IntervalSignals, interval_signals
from core.engine_metrics.parse import (
    MetricsPageError,
    detect_kind,
    filter_page,
    page_from_samples,
    parse_engine_metrics,
    pool_tokens,
)
from core.engine_metrics.snapshot import EngineKind, EngineSnapshot, ParsedPage, sum_snapshots

__all__ = [
    "EngineKind",
    "EngineSnapshot",
    "IntervalSignals",
    "MetricsPageError",
    "ParsedPage",
    "detect_kind",
    "filter_page",
    "histogram_quantile",
    "interval_signals",
    "page_from_samples",
    "parse_engine_metrics",
    "pool_tokens",
    "sum_snapshots",
]
