"""The scrapers' HTTP: one bounded GET of a target's page, or a one-line reason it failed.

A page larger than ``max_bytes``, slower than twice the timeout, answered with a non-200 status,
refused, timed out or (for `fetch_json`) not JSON raises `ScrapeError`, whose str() names the
URL and what to check; nothing else escapes. Takes an ``httpx.Client`` so tests can hand it a
``MockTransport``.

`fetch_page` also says when the target answered (its response's headers arrived, on the caller's
clock): the moment nearest to when it read what it sent. An engine sample is stamped with it, not
with the moment the request left: a simulated engine answers ``/metrics`` only once no step runs
ahead of its clock (up to one step, ~75 ms in the collapse demo), and a sample stamped before that
read pairs the engine's interval with turns the sidecar recorded up to that much earlier. The
forecast's ``turn_overhead`` came out 0-6 ms under the 5-7 ms measured (`simulator.forecast`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import httpx


class ScrapeError(Exception):
    """An expected scrape failure; str() is the one-line reason."""


def _describe(exc: Exception, url: str, timeout_s: float) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timeout after {timeout_s:g} s fetching {url}"
    if isinstance(exc, httpx.ConnectError):
        reason = str(exc) or "connection failed"
        if "refused" in reason.lower() or "errno 111" in reason.lower():
            reason = "connection refused"
        return f"{reason} ({url}): is the process running and the port right?"
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__} fetching {url}: {exc}"
    return f"{type(exc).__name__}: {exc}"


class Page(NamedTuple):
    text: str
    answered: float  # the clock's time when the response's headers arrived


def fetch_page(
    client: httpx.Client,
    url: str,
    *,
    timeout_s: float,
    max_bytes: int,
    headers: dict[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> Page:
    """GET `url`: its body as text and when it answered; raises ScrapeError with the reason."""
    deadline = time.monotonic() + 2 * timeout_s  # per-read timeouts alone let a trickling server hang a job
    try:
        with client.stream("GET", url, timeout=timeout_s, headers=headers) as response:
            answered = clock()
            if response.status_code != 200:
                body = response.read()[:200].decode("utf-8", "replace")
                hint = ""
                if response.status_code in (401, 403):
                    hint = " (set viewer_token for this sidecar in the collectors' config)"
                raise ScrapeError(
                    f"HTTP {response.status_code} from {url}{hint}: {' '.join(body.split())[:120]!r}"
                )
            chunks = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if time.monotonic() > deadline:
                    raise ScrapeError(
                        f"{url} is sending its page too slowly (over {2 * timeout_s:g} s): not scraped"
                    )
                if size > max_bytes:
                    raise ScrapeError(
                        f"page from {url} is larger than {max_bytes} bytes: not scraped "
                        "(raise [collector] max_page_bytes if this is expected)"
                    )
                chunks.append(chunk)
            return Page(b"".join(chunks).decode("utf-8", "replace"), answered)
    except ScrapeError:
        raise
    except (httpx.HTTPError, OSError) as exc:
        raise ScrapeError(_describe(exc, url, timeout_s)) from None


def fetch_text(
    client: httpx.Client, url: str, *, timeout_s: float, max_bytes: int, headers: dict[str, str] | None = None
) -> str:
    """GET `url` and return its body as text; raises ScrapeError with the reason."""
    return fetch_page(client, url, timeout_s=timeout_s, max_bytes=max_bytes, headers=headers).text


def fetch_json(
    client: httpx.Client, url: str, *, timeout_s: float, max_bytes: int, headers: dict[str, str] | None = None
) -> Any:
    body = fetch_text(client, url, timeout_s=timeout_s, max_bytes=max_bytes, headers=headers)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ScrapeError(
            f"malformed JSON from {url}: {exc.args[0] if exc.args else exc} (starts with {body[:60]!r})"
        ) from None
