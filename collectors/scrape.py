"""One scrape of one target: HTTP in, a `ScrapeOutcome` (plain data for the writer) out.

Each target has one scraper object holding what rates need (the previous snapshot, its time,
the process start time, the sidecar's turn counter and its incremental cursors). Scrapers take
an ``httpx.Client`` so tests can hand them a ``MockTransport``.

Expected failures never raise: refused connections, timeouts, HTTP errors, oversized,
HTML/JSON/garbled pages, malformed sidecar JSON all give ``ok=False`` with a one-line
``error`` that names the URL and what to check.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from collectors import sidecar_docs as docs
from collectors.config import EngineTarget, SidecarTarget
from core import engine_metrics as em
from core import rates
from core import signals as sig


class ScrapeError(Exception):
    """An expected scrape failure; str() is the one-line reason."""


@dataclass
class ScrapeOutcome:
    url: str
    role: str  # engine | sidecar
    ts: float
    ok: bool
    duration_s: float
    error: str | None = None
    kind: str | None = None
    process_start_ts: float | None = None
    samples: list[tuple[str, str, float]] = field(default_factory=list)  # (engine label, signal, value)
    engine_labels: tuple[str, ...] = ()
    restarted: bool = False
    warnings: tuple[str, ...] = ()
    # Sidecars only
    state: dict[str, Any] | None = None
    sessions: list[dict[str, Any]] | None = None
    subtrees: list[dict[str, Any]] | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)


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


def fetch_text(client: httpx.Client, url: str, *, timeout_s: float, max_bytes: int,
               headers: dict[str, str] | None = None) -> str:
    """GET `url` and return its body as text; raises ScrapeError with the reason."""
    deadline = time.monotonic() + 2 * timeout_s  # per-read timeouts alone let a trickling server hang a job
    try:
        with client.stream("GET", url, timeout=timeout_s, headers=headers) as response:
            if response.status_code != 200:
                body = response.read()[:200].decode("utf-8", "replace")
                hint = ""
                if response.status_code in (401, 403):
                    hint = " (set viewer_token for this sidecar in the collectors' config)"
                raise ScrapeError(f"HTTP {response.status_code} from {url}{hint}: {' '.join(body.split())[:120]!r}")
            chunks = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if time.monotonic() > deadline:
                    raise ScrapeError(f"{url} is sending its page too slowly (over {2 * timeout_s:g} s): not scraped")
                if size > max_bytes:
                    raise ScrapeError(f"page from {url} is larger than {max_bytes} bytes: not scraped "
                                      "(raise [collector] max_page_bytes if this is expected)")
                chunks.append(chunk)
            return b"".join(chunks).decode("utf-8", "replace")
    except ScrapeError:
        raise
    except (httpx.HTTPError, OSError) as exc:
        raise ScrapeError(_describe(exc, url, timeout_s)) from None


def fetch_json(client: httpx.Client, url: str, *, timeout_s: float, max_bytes: int,
               headers: dict[str, str] | None = None) -> Any:
    body = fetch_text(client, url, timeout_s=timeout_s, max_bytes=max_bytes, headers=headers)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ScrapeError(f"malformed JSON from {url}: {exc.args[0] if exc.args else exc} "
                          f"(starts with {body[:60]!r})") from None


class EngineScraper:
    """Scrapes one engine's /metrics and turns counters into rates across scrapes."""

    role = "engine"

    def __init__(self, target: EngineTarget, *, interval_s: float, timeout_s: float, max_page_bytes: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self.url = target.url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_page_bytes = max_page_bytes
        self.clock = clock
        self.prev: dict[str, em.EngineSnapshot] = {}
        self.prev_ts: float | None = None
        self.prev_start: float | None = None
        self.kind: str | None = None

    @property
    def max_gap_s(self) -> float:
        # Longer than this since the last good scrape and a rate would average over a gap.
        return 3 * self.interval_s + self.timeout_s + 1.0

    def scrape(self, client: httpx.Client) -> ScrapeOutcome:
        started = time.perf_counter()
        ts = self.clock()
        try:
            text = fetch_text(client, self.url + "/metrics", timeout_s=self.timeout_s, max_bytes=self.max_page_bytes)
            page = em.parse_engine_metrics(text, self.target.kind)
            if not page.engines:
                hint = ""
                looks_like = em.detect_kind(text)
                if self.target.kind not in ("auto", looks_like) and looks_like != "unknown":
                    hint = f" (configured kind {self.target.kind!r}, but the page looks like {looks_like!r})"
                raise ScrapeError(f"{self.url}/metrics: {'; '.join(page.warnings) or 'no engine metrics'}{hint}")
        except (ScrapeError, em.MetricsPageError) as exc:
            message = str(exc)
            if isinstance(exc, em.MetricsPageError):
                message = f"{self.url}/metrics: {message}"
            return ScrapeOutcome(self.url, self.role, ts, False, time.perf_counter() - started, error=message,
                                 kind=self.kind)
        return self._outcome(page, ts, started)

    def ingest_text(self, text: str, ts: float) -> ScrapeOutcome:
        """Parse an already-fetched page (benchmarks and tests)."""
        started = time.perf_counter()
        try:
            page = em.parse_engine_metrics(text, self.target.kind)
        except em.MetricsPageError as exc:
            return ScrapeOutcome(self.url, self.role, ts, False, time.perf_counter() - started, error=str(exc))
        return self._outcome(page, ts, started)

    def ingest_page(self, page: em.ParsedPage, ts: float) -> ScrapeOutcome:
        """An engine page read elsewhere (the Prometheus source, `collectors.prom_source`)."""
        return self._outcome(page, ts, time.perf_counter())

    def _outcome(self, page: em.ParsedPage, ts: float, started: float) -> ScrapeOutcome:
        self.kind = page.kind
        restarted = (page.process_start_ts is not None and self.prev_start is not None
                     and page.process_start_ts != self.prev_start)
        samples: list[tuple[str, str, float]] = []
        any_reset = restarted
        for label, snap in page.engines.items():
            result = em.interval_signals(self.prev.get(label), self.prev_ts, snap, ts, restarted=restarted,
                                         max_gap_s=self.max_gap_s)
            any_reset = any_reset or result.reset
            samples.extend((label, name, value) for name, value in result.values.items())
        self.prev = dict(page.engines)
        self.prev_ts = ts
        if page.process_start_ts is not None:
            self.prev_start = page.process_start_ts
        duration = time.perf_counter() - started
        samples.append(("", sig.UP, 1.0))
        samples.append(("", sig.SCRAPE_DURATION_S, duration))
        return ScrapeOutcome(self.url, self.role, ts, True, duration, kind=page.kind,
                             process_start_ts=page.process_start_ts, samples=samples,
                             engine_labels=tuple(page.engines), restarted=any_reset, warnings=page.warnings)


class SidecarScraper:
    """Scrapes one sidecar: /state every time, /sessions and /subtrees, and new decisions and audit entries."""

    role = "sidecar"

    def __init__(self, target: SidecarTarget, *, interval_s: float, timeout_s: float, max_page_bytes: int,
                 decision_cursor: int = 0, audit_cursor: int = 0, clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self.url = target.url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_page_bytes = max_page_bytes
        self.clock = clock
        self.decision_cursor = decision_cursor
        self.audit_cursor = audit_cursor
        self.prev_turns: float | None = None
        self.prev_ts: float | None = None
        self.prev_started: float | None = None

    def _headers(self) -> dict[str, str] | None:
        token = self.target.viewer_token
        return {"Authorization": f"Bearer {token}"} if token else None

    def _get(self, client: httpx.Client, path: str) -> Any:
        return fetch_json(client, self.url + path, timeout_s=self.timeout_s, max_bytes=self.max_page_bytes,
                          headers=self._headers())

    def scrape(self, client: httpx.Client) -> ScrapeOutcome:
        started = time.perf_counter()
        ts = self.clock()
        try:
            state = dict(docs.require_object(self._get(client, "/state"), f"{self.url}/state"))
            sessions = [r for r in (docs.session_row(d) for d in
                                    docs.require_list(self._get(client, "/sessions"), f"{self.url}/sessions")) if r]
            subtrees = [r for r in (docs.subtree_row(d) for d in
                                    docs.require_list(self._get(client, "/subtrees"), f"{self.url}/subtrees")) if r]
            decisions = [r for r in (docs.decision_row(d) for d in docs.require_list(
                self._get(client, f"/compaction/decisions?after_id={self.decision_cursor}"),
                f"{self.url}/compaction/decisions")) if r and r["remote_id"] > self.decision_cursor]
            audit = [r for r in (docs.audit_row(d) for d in docs.require_list(
                self._get(client, f"/audit?after_id={self.audit_cursor}"), f"{self.url}/audit"))
                if r and r["remote_id"] > self.audit_cursor]
        except (ScrapeError, docs.SidecarPayloadError) as exc:
            return ScrapeOutcome(self.url, self.role, ts, False, time.perf_counter() - started, error=str(exc),
                                 kind="sidecar")
        return self.outcome(state, sessions, subtrees, decisions, audit, ts, started)

    def outcome(self, state: dict[str, Any], sessions: list[dict[str, Any]], subtrees: list[dict[str, Any]],
                decisions: list[dict[str, Any]], audit: list[dict[str, Any]], ts: float,
                started: float) -> ScrapeOutcome:
        values = docs.state_signals(state)
        turns = docs.turns_total(state)
        started_at = docs.started_at(state)
        restarted = started_at is not None and self.prev_started is not None and started_at != self.prev_started
        rate = rates.counter_rate(self.prev_turns, self.prev_ts, turns, ts,
                                  max_gap_s=3 * self.interval_s + self.timeout_s + 1.0,
                                  prev_start=self.prev_started, cur_start=started_at)
        if rate is not None and not restarted:
            values[sig.TURNS_PER_S] = rate
        self.prev_turns, self.prev_ts = turns, ts
        if started_at is not None:
            self.prev_started = started_at
        if decisions:
            self.decision_cursor = max(d["remote_id"] for d in decisions)
        if audit:
            self.audit_cursor = max(a["remote_id"] for a in audit)
        duration = time.perf_counter() - started
        samples = [("", name, value) for name, value in values.items()]
        samples.append(("", sig.UP, 1.0))
        samples.append(("", sig.SCRAPE_DURATION_S, duration))
        return ScrapeOutcome(self.url, self.role, ts, True, duration, kind="sidecar", samples=samples,
                             engine_labels=("",), restarted=restarted, state=state, sessions=sessions,
                             subtrees=subtrees, decisions=decisions, audit=audit,
                             warnings=tuple(str(w) for w in state.get("warnings") or () if isinstance(w, str)))
