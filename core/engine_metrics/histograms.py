"""Engine histograms (Prometheus ``_bucket`` series) to interval quantiles. Pure.

The serving panels operators expect of a vLLM dashboard are histogram quantiles over the last
scrape interval: the bucket counts' increase between two scrapes, then Prometheus'
``histogram_quantile`` (linear within a bucket). Families, by canonical name (the signal names are
``<family>_p50``, ``_p90``, ``_p99``; see `core.signals`):

========== ================================================ =============================================
family     vLLM                                             SGLang
========== ================================================ =============================================
ttft       ``vllm:time_to_first_token_seconds``             ``sglang:time_to_first_token_seconds``
e2e        ``vllm:e2e_request_latency_seconds``             ``sglang:e2e_request_latency_seconds``
itl        ``vllm:inter_token_latency_seconds``, else       ``sglang:inter_token_latency_seconds``, else
           ``vllm:time_per_output_token_seconds``           ``sglang:time_per_output_token_seconds``
queue_time ``vllm:request_queue_time_seconds``              ``sglang:queue_time_seconds``
prompt_len ``vllm:request_prompt_tokens``                   ``sglang:prompt_tokens_histogram``
output_len ``vllm:request_generation_tokens``               ``sglang:generation_tokens_histogram``
decode_    ``vllm:request_decode_time_seconds``             (none)
time
========== ================================================ =============================================

``decode_time`` (first token to last) excludes the time in the queue: the forecast's cost model is
estimated from it (`simulator.forecast`).

Buckets are cumulative ``(upper bound, count)`` pairs, ascending, ``+Inf`` last. An interval with no
new observations, a reset (a count went down) or changed bucket bounds gives no quantile (absent, not 0).

**Interval means.** For the families in ``MEAN_FAMILIES`` the snapshot also keeps the ``_sum`` series
of the name whose buckets it took (``<base>_sum``, summed over other labels), and the interval gives
``<family>_mean``: the sum's increase divided by the ``+Inf`` bucket's (the count's). It is exact
where a quantile is an interpolation inside a bucket: vLLM's e2e buckets are seconds wide above 10 s,
so a collapsed engine's ``e2e_p50`` is known only to within them. The forecast's turn overhead
compares ``e2e_mean`` with the sidecar's mean turn latency (`simulator.forecast`). ``itl_mean``, and
``decode_time_mean`` over ``output_len_mean`` minus one, are the engine's exact mean decode step in the
interval, from which the forecast estimates its cost model (`simulator.forecast_cost`), where the
medians are interpolations inside buckets 0.2-0.5 s wide around a 150-token answer's decode time. No
mean when the
interval has no observation, no ``+Inf`` bucket, a reset of either series, or a sum missing on
either side.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from core import rates

Buckets = tuple[tuple[float, float], ...]

# family -> {kind: sample names, the first present wins}
FAMILIES: dict[str, dict[str, tuple[str, ...]]] = {
    "ttft": {
        "vllm": ("vllm:time_to_first_token_seconds_bucket",),
        "sglang": ("sglang:time_to_first_token_seconds_bucket",),
    },
    "e2e": {
        "vllm": ("vllm:e2e_request_latency_seconds_bucket",),
        "sglang": ("sglang:e2e_request_latency_seconds_bucket",),
    },
    "itl": {
        "vllm": ("vllm:inter_token_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket"),
        "sglang": (
            "sglang:inter_token_latency_seconds_bucket",
            "sglang:time_per_output_token_seconds_bucket",
        ),
    },
    "queue_time": {
        "vllm": ("vllm:request_queue_time_seconds_bucket",),
        "sglang": ("sglang:queue_time_seconds_bucket",),
    },
    "prompt_len": {
        "vllm": ("vllm:request_prompt_tokens_bucket",),
        "sglang": ("sglang:prompt_tokens_histogram_bucket",),
    },
    "output_len": {
        "vllm": ("vllm:request_generation_tokens_bucket",),
        "sglang": ("sglang:generation_tokens_histogram_bucket",),
    },
    "decode_time": {"vllm": ("vllm:request_decode_time_seconds_bucket",)},
}
QUANTILES: tuple[tuple[float, str], ...] = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))
# families whose ``<family>_mean`` is a signal (module doc)
MEAN_FAMILIES: tuple[str, ...] = ("e2e", "itl", "decode_time", "output_len")
Sums = tuple[tuple[str, float], ...]  # (family, cumulative ``_sum``) for the families of MEAN_FAMILIES
BASES: frozenset[str] = frozenset(
    n.removesuffix("_bucket") for kinds in FAMILIES.values() for names in kinds.values() for n in names
)


def names_for(kind: str) -> dict[str, tuple[str, str]]:
    """Sample name -> (family, the name) for one dialect."""
    return {n: (family, n) for family, kinds in FAMILIES.items() for n in kinds.get(kind, ())}


def sum_names_for(kind: str) -> dict[str, str]:
    """``_sum`` sample name -> the ``_bucket`` name of its histogram, for the families of MEAN_FAMILIES."""
    return {
        n.removesuffix("_bucket") + "_sum": n
        for family in MEAN_FAMILIES
        for n in FAMILIES[family].get(kind, ())
    }


def pick_sums(kind: str, per_name: Mapping[str, Mapping[float, float]], sums: Mapping[str, float]) -> Sums:
    """For each family of MEAN_FAMILIES, the ``_sum`` of the name whose buckets `pick` takes (when present)."""
    out = []
    for family in MEAN_FAMILIES:
        name = next((n for n in FAMILIES[family].get(kind, ()) if n in per_name), None)
        if name is not None and name in sums:
            out.append((family, sums[name]))
    return tuple(out)


def pick(kind: str, family: str, per_name: Mapping[str, Mapping[float, float]]) -> Buckets:
    """The buckets of the first present name of `family` (summed over other labels already)."""
    for name in FAMILIES[family].get(kind, ()):
        if name in per_name:
            return tuple(sorted(per_name[name].items()))
    return ()


def merge(items: Iterable[Buckets]) -> Buckets:
    """Buckets summed across engine labels (same bounds expected; a bound present in one only is kept)."""
    merged: dict[float, float] = {}
    for buckets in items:
        for le, count in buckets:
            merged[le] = merged.get(le, 0.0) + count
    return tuple(sorted(merged.items()))


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus-style quantile from cumulative buckets (linear within a bucket); None when empty."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if not math.isfinite(total) or total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound  # above the largest finite bucket: its bound is the best we know
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def bucket_delta(prev: Buckets, cur: Buckets) -> Buckets | None:
    """The buckets' increase between two scrapes; None across a reset or changed bounds."""
    if not prev or not cur:
        return None
    before = dict(prev)
    if set(before) != {le for le, _ in cur}:
        return None
    out = []
    for le, count in cur:
        delta = rates.counter_delta(before[le], count)
        if delta is None:
            return None
        out.append((le, delta))
    return tuple(out)


def interval_quantiles(prev: Mapping[str, Buckets], cur: Mapping[str, Buckets]) -> dict[str, float]:
    """``{"<family>_p50": value, ...}`` for every family with observations in the interval."""
    out: dict[str, float] = {}
    for family in FAMILIES:
        delta = bucket_delta(prev.get(family, ()), cur.get(family, ()))
        if delta is None:
            continue
        for q, suffix in QUANTILES:
            estimate = histogram_quantile(q, delta)
            if estimate is not None:
                out[f"{family}_{suffix}"] = estimate
    return out


def interval_means(
    prev: Mapping[str, Buckets],
    prev_sums: Mapping[str, float],
    cur: Mapping[str, Buckets],
    cur_sums: Mapping[str, float],
) -> dict[str, float]:
    """``{"<family>_mean": value}`` for every family of MEAN_FAMILIES observed in the interval (module doc)."""
    out: dict[str, float] = {}
    for family in MEAN_FAMILIES:
        delta = bucket_delta(prev.get(family, ()), cur.get(family, ()))
        if delta is None or not math.isinf(delta[-1][0]) or delta[-1][1] <= 0:
            continue
        before, after = prev_sums.get(family), cur_sums.get(family)
        if before is None or after is None:
            continue
        total = rates.counter_delta(before, after)
        if total is not None:
            out[f"{family}_mean"] = total / delta[-1][1]
    return out
