"""/state's per-model breakdown: turns counted under the request's `model`, bounded in size."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.control_state import MAX_MODELS, Counters

from .conftest import sidecar

pytestmark = pytest.mark.anyio


async def test_state_splits_turns_by_the_requests_model(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        for i in range(3):
            assert (await h.chat("a", f"turn {i}")).status_code == 200
        refused = await h.chat("b", "hello", model="adapter-x")  # the stub serves one model: vLLM's 404
        assert refused.status_code == 404
        models = (await h.client.get("/state")).json()["models"]
    assert set(models) == {"stub-model", "adapter-x"}
    assert models["stub-model"]["turns_total"] == 3 and models["stub-model"]["errors_total"] == 0
    assert models["adapter-x"] == {**models["adapter-x"], "turns_total": 1, "errors_total": 1}
    base = models["stub-model"]
    assert base["completion_tokens_total"] > 0
    assert base["token_weighted"] == pytest.approx(base["cached_tokens_total"] / base["prompt_tokens_total"])


def test_model_names_beyond_the_cap_share_one_row() -> None:
    counters = Counters()
    for i in range(MAX_MODELS + 5):
        counters.model_turn(f"m{i}", 100, 50, 10, 0.5, ok=True)
    counters.model_turn(None, 100, None, 10, 1.0, ok=False)
    assert len(counters.models) == MAX_MODELS + 1
    assert counters.models["(other)"].turns == 6  # five names past the cap, and the request with none
    assert counters.models["(other)"].errors == 1
    assert counters.models["m0"].doc() == {
        "turns_total": 1,
        "errors_total": 0,
        "prompt_tokens_total": 100,
        "cached_tokens_total": 50,
        "completion_tokens_total": 10,
        "token_weighted": 0.5,
        "mean_latency_s": 0.5,
    }
