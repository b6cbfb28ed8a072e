"""One scrape of one target: HTTP in, a `ScrapeOutcome` (plain data for the writer) out.

This module holds the outcome and cursor types and the engine scraper; the sidecar scraper is
`collectors.scrape_sidecar`, the bounded GET both use `collectors.scrape_http`.

Each target has one scraper object holding what rates need (the previous snapshot, its time,
the process start time, the sidecar's turn counter and its incremental cursors). Scrapers take
an ``httpx.Client`` so tests can hand them a ``MockTransport``.

Expected failures never raise: refused connections, timeouts, HTTP errors, oversized,
HTML/JSON/garbled pages, malformed sidecar JSON all give ``ok=False`` with a one-line
``error`` that names the URL and what to check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from collectors import checks as check
from collectors.config import EngineTarget
from collectors.scrape_http import ScrapeError, fetch_page
from core import engine_metrics as em
from core import signals as sig


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
    sessions_full: bool = True  # False: `sessions` holds only the sessions changed since the last read
    sessions_mark: float | None = None  # the newest `updated_at` read (the sessions cursor once committed)
    sessions_next: str | None = None  # where a read cut short resumes
    decisions: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)
    decision_epoch: int = 0  # which of the sidecar's logs (a wiped state db starts a new one)
    audit_epoch: int = 0
    turns: list[dict[str, Any]] = field(default_factory=list)  # the turn trace (collectors/turn_trace.py)
    turns_epoch: int = 0
    retried: bool = False  # written again after a failed write


@dataclass(frozen=True)
class LogCursor:
    """Where reading one of a sidecar's logs resumes: the newest stored entry (id, ts and its
    action or decision, to recognise it again) in the newest log epoch."""

    epoch: int = 0
    after_id: int = 0
    ts: float | None = None
    key: str | None = None


class EngineScraper:
    """Scrapes one engine's /metrics and turns counters into rates across scrapes."""

    role = "engine"

    def __init__(
        self,
        target: EngineTarget,
        *,
        interval_s: float,
        timeout_s: float,
        max_page_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
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
        self.checker = check.Checker(self.url)

    @property
    def max_gap_s(self) -> float:
        # Longer than this since the last good scrape and a rate would average over a gap.
        return 3 * self.interval_s + self.timeout_s + 1.0

    def scrape(self, client: httpx.Client) -> ScrapeOutcome:
        started = time.perf_counter()
        ts = self.clock()  # a failure's time; a page's is when the engine answered (`scrape_http`)
        try:
            text, ts = fetch_page(
                client,
                self.url + "/metrics",
                timeout_s=self.timeout_s,
                max_bytes=self.max_page_bytes,
                clock=self.clock,
            )
            page = em.parse_engine_metrics(text, self.target.kind)
            if not page.engines:
                hint = ""
                looks_like = em.detect_kind(text)
                if self.target.kind not in ("auto", looks_like) and looks_like != "unknown":
                    hint = f" (configured kind {self.target.kind!r}, but the page looks like {looks_like!r})"
                raise ScrapeError(
                    f"{self.url}/metrics: {'; '.join(page.warnings) or 'no engine metrics'}{hint}"
                )
        except (ScrapeError, em.MetricsPageError) as exc:
            message = str(exc)
            if isinstance(exc, em.MetricsPageError):
                message = f"{self.url}/metrics: {message}"
            return ScrapeOutcome(
                self.url, self.role, ts, False, time.perf_counter() - started, error=message, kind=self.kind
            )
        return self._outcome(page, ts, started)

    def ingest_text(self, text: str, ts: float) -> ScrapeOutcome:
        """Parse an already-fetched page (benchmarks and tests)."""
        started = time.perf_counter()
        try:
            page = em.parse_engine_metrics(text, self.target.kind)
        except em.MetricsPageError as exc:
            return ScrapeOutcome(
                self.url, self.role, ts, False, time.perf_counter() - started, error=str(exc)
            )
        return self._outcome(page, ts, started)

    def ingest_page(self, page: em.ParsedPage, ts: float) -> ScrapeOutcome:
        """An engine page read elsewhere (the Prometheus source, `collectors.prom_source`)."""
        return self._outcome(page, ts, time.perf_counter())

    def _outcome(self, page: em.ParsedPage, ts: float, started: float) -> ScrapeOutcome:
        self.kind = page.kind
        restarted = (
            page.process_start_ts is not None
            and self.prev_start is not None
            and page.process_start_ts != self.prev_start
        )
        samples: list[tuple[str, str, float]] = []
        any_reset = restarted
        for label, snap in page.engines.items():
            result = em.interval_signals(
                self.prev.get(label), self.prev_ts, snap, ts, restarted=restarted, max_gap_s=self.max_gap_s
            )
            any_reset = any_reset or result.reset
            samples.extend((label, name, value) for name, value in result.values.items())
        self.prev = dict(page.engines)
        self.prev_ts = ts
        if page.process_start_ts is not None:
            self.prev_start = page.process_start_ts
        samples = self.checker.samples(samples)
        duration = time.perf_counter() - started
        samples.append(("", sig.UP, 1.0))
        samples.append(("", sig.SCRAPE_DURATION_S, duration))
        return ScrapeOutcome(
            self.url,
            self.role,
            ts,
            True,
            duration,
            kind=page.kind,
            process_start_ts=page.process_start_ts,
            samples=samples,
            engine_labels=tuple(page.engines),
            restarted=any_reset,
            warnings=page.warnings,
        )
