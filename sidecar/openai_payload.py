"""Pure functions over OpenAI-shaped payloads: prompt size, output budget, subtree id,
usage extraction and SSE re-framing. No I/O, no clock; unit-tested in tests/sidecar/test_openai_payload.py.

- `prompt_size`: a request's text characters and token ids (counted exactly): what the sidecar knows of
  its prompt before the engine answers (``core.prompt_estimate`` turns it into tokens).
- `output_budget`: ``max_completion_tokens`` or ``max_tokens`` when a positive integer.
- `subtree_of`: the ``X-Prefix-Id`` header, else ``sys-<hash>`` of the system/developer message.
- `usage_numbers`: (prompt, cached or None when not reported, completion) from a usage object.
- `SseReframer`: feeds raw stream bytes, yields whole ``data:`` events, picks out the usage
  event and, when the sidecar injected ``stream_options.include_usage``, strips usage the client
  did not ask for.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

DONE = b"data: [DONE]"


def prompt_size(payload: dict[str, Any]) -> tuple[int, int]:
    """(text characters, token ids) of a completion or chat payload's prompt."""
    chars = 0
    tokens = 0
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        chars += len(part["text"])
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        chars += len(prompt)
    elif isinstance(prompt, list):
        for item in prompt:
            if isinstance(item, str):
                chars += len(item)
            elif isinstance(item, int):
                tokens += 1
            elif isinstance(item, list):
                tokens += len(item)
    return chars, tokens


def output_budget(payload: dict[str, Any]) -> int | None:
    """The requested output budget in tokens, or None when the request sets none."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def subtree_of(payload: dict[str, Any], header: str | None) -> str | None:
    if header:
        return header[:256]
    messages = payload.get("messages")
    if (
        isinstance(messages, list)
        and messages
        and isinstance(messages[0], dict)
        and messages[0].get("role") in ("system", "developer")
    ):
        content = messages[0].get("content")
        if not isinstance(content, str):
            content = json.dumps(content, sort_keys=True)
        return "sys-" + hashlib.blake2b(content.encode(), digest_size=8).hexdigest()
    return None


def _as_int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def usage_numbers(usage: Any) -> tuple[int | None, int | None, int | None]:
    """(prompt, cached or None when not reported, completion) from an OpenAI usage object."""
    if not isinstance(usage, dict):
        return None, None, None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return _as_int(usage.get("prompt_tokens")), _as_int(cached), _as_int(usage.get("completion_tokens"))


def checked_usage(
    prompt: int | None, cached: int | None, completion: int | None, max_tokens: int
) -> tuple[int | None, int | None, int | None, str | None]:
    """Engine-reported usage range-checked before it enters demand (issue 11 item 3).

    Returns (prompt, cached, completion, problem): a prompt or completion outside ``[0, max_tokens]``
    becomes None (the turn's usage is unknown) and ``problem`` says why; cached is clamped to
    ``[0, prompt]``."""
    problem = None
    if prompt is not None and not 0 <= prompt <= max_tokens:
        problem = f"engine reported prompt_tokens={prompt}, outside [0, {max_tokens}]"
        prompt = None
    if completion is not None and not 0 <= completion <= max_tokens:
        problem = f"engine reported completion_tokens={completion}, outside [0, {max_tokens}]"
        completion = None
    if prompt is None:
        return None, None, completion, problem
    if cached is not None:
        cached = min(prompt, max(0, cached))
    return prompt, cached, completion, problem


def sse_event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


class SseReframer:
    """Re-frames an SSE byte stream into whole events, noting the usage and ``[DONE]``.

    ``feed(chunk)`` returns the bytes to pass on (possibly empty); ``tail()`` what is left at the end.
    ``usage`` holds the last usage object seen, ``done`` whether ``data: [DONE]`` arrived. With
    ``strip_usage`` (the sidecar asked for usage on the client's behalf) the usage-only event is
    dropped and ``usage`` keys are removed from other events.
    """

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.usage: Any = None
        self.done = False
        self._buffer = b""

    def feed(self, chunk: bytes) -> bytes:
        self._buffer += chunk
        if b"\n\n" not in self._buffer:
            return b""
        *complete, self._buffer = self._buffer.split(b"\n\n")
        out = []
        for event in complete:
            if event.startswith(DONE):
                self.done = True
            elif b'"usage"' in event and event.startswith(b"data:"):
                try:
                    data = json.loads(event[5:])
                except (ValueError, RecursionError):
                    data = None
                if isinstance(data, dict) and data.get("usage"):
                    self.usage = data["usage"]
                    if self.strip_usage:
                        if not data.get("choices"):
                            continue
                        data.pop("usage", None)
                        event = b"data: " + json.dumps(data).encode()
                elif isinstance(data, dict) and self.strip_usage and "usage" in data:
                    data.pop("usage", None)
                    event = b"data: " + json.dumps(data).encode()
            out.append(event + b"\n\n")
        return b"".join(out)

    def tail(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        return rest if rest.strip() else b""
