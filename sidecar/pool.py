"""KV pool size in tokens from the engine's /metrics, through the shared parser in core.engine_metrics.

``core.engine_metrics.pool_tokens`` (collectors helper) reads vLLM's ``vllm:cache_config_info``
(``kv_cache_size_tokens``, else ``num_gpu_blocks × block_size``, summed over engines) and SGLang's
``sglang:max_total_num_tokens``; this module adds the HTTP fetch and one-line error messages.
"""

from __future__ import annotations

import logging

import httpx

from core.engine_metrics import detect_kind, pool_tokens

log = logging.getLogger(__name__)


def pool_tokens_from_text(text: str) -> tuple[int | None, str | None]:
    """(pool tokens, engine kind) from Prometheus text; (None, None) when no pool metric is there."""
    tokens = pool_tokens(text)
    if tokens is None:
        return None, None
    kind = detect_kind(text)
    return tokens, (kind if kind in ("vllm", "sglang") else None)


async def fetch_pool_tokens(
    client: httpx.AsyncClient, engine: str
) -> tuple[int | None, str | None, str | None]:
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
    except Exception as exc:  # a parser bug must not stop the sidecar; report it in one line
        return None, None, f"engine metrics at {url} could not be parsed: {type(exc).__name__}: {exc}"
    if tokens is None:
        return (
            None,
            None,
            (
                f"engine metrics at {url} carry neither vllm:cache_config_info nor "
                "sglang:max_total_num_tokens; pass --pool-tokens"
            ),
        )
    return tokens, kind, None
