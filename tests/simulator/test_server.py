"""The live simulated engine over HTTP: vLLM's OpenAI shapes, errors and /metrics, checked with real clients."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import ENGINE_METRICS, PYTHON, free_port, running

MODEL = "sim/test-model"


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    port = free_port()
    cmd = [
        PYTHON,
        "-m",
        "simulator",
        "serve",
        "--port",
        str(port),
        "--speed",
        "50",
        "--model",
        MODEL,
        "--pool-tokens",
        "200000",
        "--seed",
        "3",
    ]
    with running(cmd, name="simulator", ready_url=f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def conversation(turn: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are a careful agent. " * 40}]
    for k in range(turn):
        msgs.append({"role": "user", "content": f"step {k}: " + "tool output line. " * 30})
        if k < turn - 1:
            msgs.append({"role": "assistant", "content": "ok " * 20})
    return msgs


def test_models_and_health(base: str, client: openai.OpenAI) -> None:
    assert httpx.get(f"{base}/health").status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_completion_reports_cached_tokens_of_the_previous_turn(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=conversation(1), max_tokens=20)
    assert first.object == "chat.completion"
    assert first.choices[0].message.role == "assistant"
    assert first.usage.completion_tokens == len(first.choices[0].message.content) // 4
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    msgs = [
        *conversation(1),
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "next " * 50},
    ]
    second = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0
    assert cached >= first.usage.prompt_tokens - 16  # the whole previous prompt (block-granular) is reused


def test_streaming_chat_ends_with_a_usage_only_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=conversation(2),
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == len(text) // 4
    assert last.usage.prompt_tokens_details.cached_tokens is not None


def test_streaming_sse_wire_format(base: str) -> None:
    body = {"model": MODEL, "prompt": "hello " * 100, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(p["object"] == "text_completion" for p in payloads)
    assert "".join(p["choices"][0]["text"] for p in payloads)
    assert not any("usage" in p for p in payloads)  # no include_usage: no usage chunk


def test_completions_non_streaming(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="The cache " * 64, max_tokens=12)
    assert out.object == "text_completion"
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_unknown_model_gets_vllms_404_error_body(base: str, client: openai.OpenAI) -> None:
    r = httpx.post(
        f"{base}/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "The model `nope` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_bad_requests_are_400_with_a_message(base: str) -> None:
    r = httpx.post(f"{base}/v1/chat/completions", json={"model": MODEL, "messages": []})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = httpx.post(
        f"{base}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_match_vllm_names_labels_and_types(base: str, client: openai.OpenAI) -> None:
    client.chat.completions.create(model=MODEL, messages=conversation(1), max_tokens=5)
    ours = _families(httpx.get(f"{base}/metrics").text)
    real = _families(Path(ENGINE_METRICS / "vllm-0.33.0-statlogger.prom").read_text())
    required = [
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:cache_config_info",
        "vllm:time_to_first_token_seconds",
        "vllm:request_prefill_kv_computed_tokens",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_success",
        "vllm:prompt_tokens_by_source",
    ]
    for name in required:
        assert name in ours, name
        mine, theirs = ours[name], real[name]
        assert mine.type == theirs.type, name
        my_labels = {k for s in mine.samples for k in s.labels}
        their_labels = {k for s in theirs.samples for k in s.labels}
        assert my_labels <= their_labels, (name, my_labels - their_labels)
    samples = {(s.name): s for f in ours.values() for s in f.samples}
    assert samples["vllm:prefix_cache_queries_total"].labels == {"engine": "0", "model_name": MODEL}
    info = samples["vllm:cache_config_info"].labels
    assert info["block_size"] == "16" and info["num_gpu_blocks"] == str(200000 // 16)
    assert info["kv_cache_size_tokens"] == "200000"
    assert samples["vllm:prefix_cache_queries_total"].value > 0
    assert samples["vllm:time_to_first_token_seconds_count"].value > 0
    assert "sim:cached_free_blocks" in samples and "sim:sessions_in_system" in samples


def test_flush_control(base: str, client: openai.OpenAI) -> None:
    msgs = conversation(3)
    client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3)
    r = httpx.post(f"{base}/sim/flush")
    assert r.status_code == 200 and r.json()["flushed"]
    again = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3)
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    state = httpx.get(f"{base}/sim/state").json()
    assert state["model"] == MODEL and state["num_blocks"] == 200000 // 16
