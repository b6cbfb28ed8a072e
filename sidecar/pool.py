"""KV pool size in tokens from an engine's Prometheus text (vLLM or SGLang).

Private to the sidecar: core/engine_metrics.py (collectors) did not exist when this
was written. vLLM: ``vllm:cache_config_info`` label ``kv_cache_size_tokens`` when it is a
number, else ``num_gpu_blocks * block_size``, summed over ``engine`` labels (data
parallel engines each have their own pool). SGLang: ``sglang:max_total_num_tokens``,
the largest value within a ``dp_rank`` (tensor-parallel ranks share one pool), summed
over ``dp_rank`` labels.
"""

from __future__ import annotations

import logging

import httpx
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)


def _int_label(labels: dict[str, str], name: str) -> int | None:
    raw = labels.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    if value != value or value <= 0 or value == float("inf"):
        return None
    return int(value)


def pool_tokens_from_text(text: str) -> tuple[int | None, str | None]:
    """(pool tokens, engine kind) from Prometheus text; (None, None) when no pool metric is there."""
    vllm: dict[str, int] = {}
    sglang: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            for sample in family.samples:
                if sample.name != "vllm:cache_config_info":
                    continue
                tokens = _int_label(sample.labels, "kv_cache_size_tokens")
                if tokens is None:
                    blocks = _int_label(sample.labels, "num_gpu_blocks")
                    block_size = _int_label(sample.labels, "block_size")
                    if blocks is not None and block_size is not None:
                        tokens = blocks * block_size
                if tokens is not None:
                    engine = sample.labels.get("engine", "")
                    vllm[engine] = max(vllm.get(engine, 0), tokens)
        elif family.name == "sglang:max_total_num_tokens":
            for sample in family.samples:
                value = sample.value
                if value != value or value <= 0 or value == float("inf"):
                    continue
                rank = sample.labels.get("dp_rank", "")
                sglang[rank] = max(sglang.get(rank, 0), int(value))
    if vllm:
        return sum(vllm.values()), "vllm"
    if sglang:
        return sum(sglang.values()), "sglang"
    return None, None


async def fetch_pool_tokens(client: httpx.AsyncClient, engine: str) -> tuple[int | None, str | None, str | None]:
    """(pool tokens, engine kind, error) from the engine's /metrics; never raises for expected failures."""
    url = engine.rstrip("/") + "/metrics"
    try:
        response = await client.get(url, timeout=5.0)
    except httpx.HTTPError as exc:
        return None, None, f"engine metrics at {url} unreachable: {type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return None, None, f"engine metrics at {url} answered HTTP {response.status_code}"
    try:
        tokens, kind = pool_tokens_from_text(response.text)
    except (ValueError, TypeError) as exc:
        return None, None, f"engine metrics at {url} could not be parsed: {exc}"
    if tokens is None:
        return None, None, (f"engine metrics at {url} carry neither vllm:cache_config_info nor "
                            "sglang:max_total_num_tokens; pass --pool-tokens")
    return tokens, kind, None
