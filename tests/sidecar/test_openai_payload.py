"""sidecar.openai_payload: pure functions, exact values."""

from __future__ import annotations

import json

from sidecar.openai_payload import (
    SseReframer,
    checked_usage,
    output_budget,
    prompt_size,
    subtree_of,
    usage_numbers,
)


def test_prompt_size_counts_characters_and_token_ids() -> None:
    payload = {
        "messages": [
            {"role": "system", "content": "abcd" * 10},
            {"role": "user", "content": [{"type": "text", "text": "xyz"}, {"type": "image"}]},
            "not-a-message",
        ]
    }
    assert prompt_size(payload) == (43, 0)
    assert prompt_size({"prompt": [1, 2, 3, [4, 5], "abcdefgh"]}) == (8, 5)
    assert prompt_size({"prompt": "abc"}) == (3, 0)
    assert prompt_size({}) == (0, 0)


def test_output_budget_prefers_max_completion_tokens_and_ignores_junk() -> None:
    assert output_budget({"max_completion_tokens": 5, "max_tokens": 9}) == 5
    assert output_budget({"max_tokens": 9}) == 9
    assert output_budget({"max_tokens": True}) is None
    assert output_budget({"max_tokens": 0}) is None
    assert output_budget({"max_tokens": 1.5}) is None


def test_subtree_from_header_or_system_prompt() -> None:
    assert subtree_of({}, "docs-1") == "docs-1"
    assert subtree_of({}, "x" * 300) == "x" * 256
    a = subtree_of({"messages": [{"role": "system", "content": "S"}]}, None)
    b = subtree_of({"messages": [{"role": "developer", "content": "S"}]}, None)
    assert a == b and a is not None and a.startswith("sys-") and len(a) == 20
    assert subtree_of({"messages": [{"role": "user", "content": "S"}]}, None) is None


def test_usage_numbers() -> None:
    assert usage_numbers(
        {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}}
    ) == (10, 8, 2)
    assert usage_numbers({"prompt_tokens": 10, "completion_tokens": 2}) == (10, None, 2)
    assert usage_numbers({"prompt_tokens": float("inf"), "completion_tokens": True}) == (None, None, None)
    assert usage_numbers("nope") == (None, None, None)


def test_checked_usage_range_checks_before_demand() -> None:
    assert checked_usage(10, 12, 2, 100) == (10, 10, 2, None)
    assert checked_usage(10, -3, 2, 100) == (10, 0, 2, None)
    prompt, cached, completion, problem = checked_usage(10**30, 5, 2, 100)
    assert (prompt, cached, completion) == (None, None, 2) and problem and "prompt_tokens" in problem
    prompt, cached, completion, problem = checked_usage(10, 5, -1, 100)
    assert (prompt, cached, completion) == (10, 5, None) and problem and "completion_tokens" in problem


def _event(data: object) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def test_sse_reframer_joins_split_events_and_strips_injected_usage() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 1}
    stream = (
        _event({"choices": [{"delta": {"content": "hi"}}], "usage": None})
        + _event({"choices": [], "usage": usage})
        + b"data: [DONE]\n\n"
    )
    frames = SseReframer(strip_usage=True)
    out = b"".join(frames.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + frames.tail()
    assert frames.done and frames.usage == usage
    assert out == _event({"choices": [{"delta": {"content": "hi"}}]}) + b"data: [DONE]\n\n"
    keep = SseReframer(strip_usage=False)
    assert keep.feed(stream) == stream and keep.usage == usage


def test_sse_reframer_passes_an_unterminated_tail_and_survives_bad_json() -> None:
    frames = SseReframer(strip_usage=True)
    assert frames.feed(b'data: {"usage": [[[' + b"\n\n") == b'data: {"usage": [[[\n\n'
    assert frames.feed(b"data: partial") == b""
    assert frames.tail() == b"data: partial" and not frames.done and frames.usage is None
