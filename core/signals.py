"""Canonical signal names: one vocabulary for the database, `collectors status --json` and the pages.

A *signal* is one number per (target, engine label, time). Engines' own metric
names (vLLM V1, legacy vLLM `gpu_*`, SGLang) are mapped onto these by
`core.engine_metrics`; sidecar `/state` fields by the collectors. Every
row in the `series` table carries one of these names in its `signal` column.

Units: ratios and fractions are in [0, 1]; `*_per_s` are per-second rates over
the last scrape interval (counters turned into rates, resets give no sample);
token counts are tokens; TTFT quantiles are seconds (estimated from the
histogram's buckets observed over the last interval).

Engine signals (engine label kept apart: vLLM `engine="0"`, SGLang `dp_rank`):

- ``engine_hit_ratio``: R_t from engine counters over the last interval,
  prefix-cache hits / queries (vLLM) or cached / prompt tokens (SGLang).
- ``kv_usage``: KV-cache usage as a 0-1 fraction.
- ``requests_running``, ``requests_waiting``: gauges.
- ``preemptions_per_s``: vLLM preemptions, SGLang retractions.
- ``prompt_tokens_per_s``, ``generation_tokens_per_s``, ``cached_tokens_per_s``.
- ``prefix_cache_queries_per_s``, ``prefix_cache_hits_per_s``: the numerator and
  denominator of ``engine_hit_ratio``, stored so ratios can be summed correctly
  over engine labels (sum the rates, then divide).
- ``ttft_p50``, ``ttft_p90``, ``ttft_p99``: time to first token, seconds.
- ``e2e_p50/p90/p99`` (end-to-end request latency), ``itl_p50/p90/p99`` (inter-token latency),
  ``queue_time_p50/p90/p99`` (time in the engine's queue) and ``decode_time_p50/p90/p99`` (first
  token to last; vLLM only), seconds;
  ``prompt_len_p50/p90/p99`` and
  ``output_len_p50/p90/p99``: prompt and output lengths of the requests finished in the interval,
  tokens. All from the engine's histograms over the last interval (`core.engine_metrics.histograms`).
- ``e2e_mean``: the mean end-to-end latency of the requests finished in the interval, seconds,
  exact (the histogram's ``_sum`` increase over its count's), where ``e2e_p50`` is interpolated
  inside buckets seconds wide. The forecast's turn overhead compares it with the sidecar's turns.
- ``itl_mean``, ``decode_time_mean`` (seconds) and ``output_len_mean`` (tokens): the exact means of
  the same interval, from those histograms' ``_sum``; the forecast's cost model reads the mean decode
  step from them (``itl_mean``, else ``decode_time_mean / (output_len_mean - 1)``).
- ``pool_tokens``: KV pool size in tokens.
- ``block_size``: KV block size in tokens (vLLM's ``cache_config_info``; the granularity of prefix
  reuse, for `core.attribution`).

Sidecar signals (engine label is always ""):

- ``token_weighted`` (R_t), ``request_weighted`` (R_r), ``divergence`` (D = R_r - R_t).
- ``known_turns``: turns with a known cached count in the sidecar's reuse window (the thin-reuse
  judgement needs at least ``RegimeConfig.min_turns`` of them).
- ``thin_reuse``: 1 while the sidecar reports the thin-reuse regime, else 0.
- ``pool_tokens``, ``demand_tokens``, ``demand_fraction`` (demand / pool),
  ``band_low``, ``band_high`` (fractions of the pool).
- ``turns_per_s``, ``sessions_in_system`` (admitted + parked + waiting),
  ``admitted``, ``parked``, ``waiting``.
- ``low_half_cached_fraction``: fraction of recent turns with under half of their
  prompt cached.
- ``oldest_waiting_s``: seconds the longest-waiting new session has waited for admission
  (``/state`` ``backlog``; 0 when nobody waits, so the admission-wait alert resolves).
- ``oldest_parked_s``: seconds the longest-parked session has been parked (no sample while
  nobody is parked).
- ``time_to_admit_p50``, ``time_to_admit_p95``, ``park_time_p50``, ``park_time_p95``:
  seconds, over the sidecar's recent window.

Collapse risk (`core.risk`), computed by the collectors from the signals above and stored on the
key it was judged for (the sidecar's, or a bare engine's label):

- ``collapse_risk``: the score in [0, 1].
- ``risk_<input>``: each input's contribution to it (``risk_kv_demand``, ``risk_missed_prefill``, ...;
  the inputs are listed in `core.risk`), so the pages can show the leading inputs over time.

Per-target signals written by the collector itself for every target:

- ``up`` (1 or 0) and ``scrape_duration_s``.

The collector's own heartbeat lives in the ``collector_heartbeat`` table.
"""

from __future__ import annotations

from typing import Final

# Reuse (sidecar)
TOKEN_WEIGHTED: Final = "token_weighted"
REQUEST_WEIGHTED: Final = "request_weighted"
DIVERGENCE: Final = "divergence"
KNOWN_TURNS: Final = "known_turns"
THIN_REUSE: Final = "thin_reuse"

# Engine
ENGINE_HIT_RATIO: Final = "engine_hit_ratio"
KV_USAGE: Final = "kv_usage"
REQUESTS_RUNNING: Final = "requests_running"
REQUESTS_WAITING: Final = "requests_waiting"
PREEMPTIONS_PER_S: Final = "preemptions_per_s"
PROMPT_TOKENS_PER_S: Final = "prompt_tokens_per_s"
GENERATION_TOKENS_PER_S: Final = "generation_tokens_per_s"
CACHED_TOKENS_PER_S: Final = "cached_tokens_per_s"
PREFIX_CACHE_QUERIES_PER_S: Final = "prefix_cache_queries_per_s"
PREFIX_CACHE_HITS_PER_S: Final = "prefix_cache_hits_per_s"
TTFT_P50: Final = "ttft_p50"
TTFT_P90: Final = "ttft_p90"
TTFT_P99: Final = "ttft_p99"
SERVING_QUANTILES: Final = tuple(
    f"{family}_{q}"
    for family in ("e2e", "itl", "queue_time", "prompt_len", "output_len", "decode_time")
    for q in ("p50", "p90", "p99")
)
E2E_MEAN: Final = "e2e_mean"
ITL_MEAN: Final = "itl_mean"
DECODE_TIME_MEAN: Final = "decode_time_mean"
OUTPUT_LEN_MEAN: Final = "output_len_mean"
# one per `core.engine_metrics.histograms.MEAN_FAMILIES`
SERVING_MEANS: Final = (E2E_MEAN, ITL_MEAN, DECODE_TIME_MEAN, OUTPUT_LEN_MEAN)
POOL_TOKENS: Final = "pool_tokens"
BLOCK_SIZE: Final = "block_size"

# Budgeter / backlog (sidecar)
DEMAND_TOKENS: Final = "demand_tokens"
DEMAND_FRACTION: Final = "demand_fraction"
PROJECTED_DEMAND_FRACTION: Final = "projected_demand_fraction"  # core.projection over core.risk's horizon
BAND_LOW: Final = "band_low"
BAND_HIGH: Final = "band_high"
TURNS_PER_S: Final = "turns_per_s"
SESSIONS_IN_SYSTEM: Final = "sessions_in_system"
ADMITTED: Final = "admitted"
PARKED: Final = "parked"
WAITING: Final = "waiting"
LOW_HALF_CACHED_FRACTION: Final = "low_half_cached_fraction"
OLDEST_WAITING_S: Final = "oldest_waiting_s"
OLDEST_PARKED_S: Final = "oldest_parked_s"
TIME_TO_ADMIT_P50: Final = "time_to_admit_p50"
TIME_TO_ADMIT_P95: Final = "time_to_admit_p95"
PARK_TIME_P50: Final = "park_time_p50"
PARK_TIME_P95: Final = "park_time_p95"

# Collapse risk (core.risk): the score, and a prefix + input name for each input's contribution
COLLAPSE_RISK: Final = "collapse_risk"
RISK_PREFIX: Final = "risk_"
RISK_INPUT_SIGNALS: Final = tuple(
    RISK_PREFIX + name
    for name in (
        "demand_projection",
        "kv_demand",
        "demand_trend",
        "session_flow",
        "missed_prefill",
        "rt_trend",
        "kv_usage",
        "queue",
        "queue_growth",
        "preemptions",
        "hit_trend",
        "throughput",
    )
)
RISK_SIGNALS: Final = (COLLAPSE_RISK, *RISK_INPUT_SIGNALS)

# Collector bookkeeping
UP: Final = "up"
SCRAPE_DURATION_S: Final = "scrape_duration_s"

ENGINE_SIGNALS: Final = (
    ENGINE_HIT_RATIO,
    KV_USAGE,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    PREEMPTIONS_PER_S,
    PROMPT_TOKENS_PER_S,
    GENERATION_TOKENS_PER_S,
    CACHED_TOKENS_PER_S,
    PREFIX_CACHE_QUERIES_PER_S,
    PREFIX_CACHE_HITS_PER_S,
    TTFT_P50,
    TTFT_P90,
    TTFT_P99,
    POOL_TOKENS,
    BLOCK_SIZE,
    *SERVING_QUANTILES,
    *SERVING_MEANS,
)
SIDECAR_SIGNALS: Final = (
    TOKEN_WEIGHTED,
    REQUEST_WEIGHTED,
    DIVERGENCE,
    KNOWN_TURNS,
    THIN_REUSE,
    POOL_TOKENS,
    DEMAND_TOKENS,
    DEMAND_FRACTION,
    PROJECTED_DEMAND_FRACTION,
    BAND_LOW,
    BAND_HIGH,
    TURNS_PER_S,
    SESSIONS_IN_SYSTEM,
    ADMITTED,
    PARKED,
    WAITING,
    LOW_HALF_CACHED_FRACTION,
    OLDEST_WAITING_S,
    OLDEST_PARKED_S,
    TIME_TO_ADMIT_P50,
    TIME_TO_ADMIT_P95,
    PARK_TIME_P50,
    PARK_TIME_P95,
)
TARGET_SIGNALS: Final = (UP, SCRAPE_DURATION_S)
ALL_SIGNALS: Final = tuple(dict.fromkeys(ENGINE_SIGNALS + SIDECAR_SIGNALS + RISK_SIGNALS + TARGET_SIGNALS))

# Signals whose meaning is a sum over engine labels (summing ratios would be wrong).
ADDITIVE_SIGNALS: Final = frozenset(
    {
        REQUESTS_RUNNING,
        REQUESTS_WAITING,
        PREEMPTIONS_PER_S,
        PROMPT_TOKENS_PER_S,
        GENERATION_TOKENS_PER_S,
        CACHED_TOKENS_PER_S,
        PREFIX_CACHE_QUERIES_PER_S,
        PREFIX_CACHE_HITS_PER_S,
        POOL_TOKENS,
    }
)
