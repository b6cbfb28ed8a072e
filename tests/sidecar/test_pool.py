"""KV pool size from the engine's Prometheus text (every captured engine fixture)."""

from __future__ import annotations

import pytest

from sidecar.pool import pool_tokens_from_text
from tests.support import ENGINE_METRICS

EXPECTED = {
    "vllm-0.33.0-statlogger.prom": (12160, "vllm"),
    "sglang-0.5.23-collectors.prom": (44856, "sglang"),
    # fragments without a pool metric: the budgeter must say so, not guess
    "sglang-docs-llama-3.1-8b.prom": (None, None),
    "sglang-dp8-deepseek-r1-fragment.prom": (None, None),
    "sglang-pr7944-deepseek-r1-fragment.prom": (None, None),
    "vllm-0.10.0-glm-4.5-fragment.prom": (None, None),
    "vllm-v1-0.8era-qwen2.5-coder-32b-fragment.prom": (None, None),
}


@pytest.mark.parametrize("name", sorted(p.name for p in ENGINE_METRICS.glob("*.prom")))
def test_every_fixture(name: str) -> None:
    assert pool_tokens_from_text((ENGINE_METRICS / name).read_text()) == EXPECTED[name]


INFO = "# TYPE vllm:cache_config_info gauge\n"


def test_vllm_falls_back_to_blocks_times_block_size() -> None:
    text = (
        INFO
        + 'vllm:cache_config_info{block_size="16",kv_cache_size_tokens="None",num_gpu_blocks="760"} 1.0\n'
    )
    assert pool_tokens_from_text(text) == (12160, "vllm")


def test_vllm_data_parallel_engines_add_up() -> None:
    text = INFO + "".join(
        f'vllm:cache_config_info{{engine="{e}",block_size="16",num_gpu_blocks="100"}} 1.0\n' for e in range(4)
    )
    assert pool_tokens_from_text(text) == (6400, "vllm")


def test_sglang_tensor_parallel_ranks_share_one_pool_per_dp_rank() -> None:
    text = "# TYPE sglang:max_total_num_tokens gauge\n" + "".join(
        f'sglang:max_total_num_tokens{{dp_rank="{dp}",tp_rank="{tp}"}} 1000.0\n'
        for dp in range(2)
        for tp in range(4)
    )
    assert pool_tokens_from_text(text) == (2000, "sglang")


def test_unusable_values_are_ignored() -> None:
    text = INFO + 'vllm:cache_config_info{block_size="x",kv_cache_size_tokens="NaN",num_gpu_blocks="0"} 1.0\n'
    assert pool_tokens_from_text(text) == (None, None)
