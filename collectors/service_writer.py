"""The collectors' writer thread: store scrape outcomes, run the alert rules, keep the database.

A mixin of `collectors.service.Collector`. The writer drains the queue the scrape jobs fill in
batches, writes each batch in one transaction (`collectors.store.Store.write`), then feeds the
alert evaluator and persists alert transitions and outbox rows. A failed write is logged in one
line per cause and its samples are retried with the next batch. The small jobs that touch the
database (heartbeat, the alert sweep for stale data, rollups and retention, acknowledgements)
are queued here too, so the database has one writer.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine

from collectors import notify
from collectors.config import CollectorConfig
from collectors.failures import FailureLog, describe_failure
from collectors.prom_source import PromSource, register_engines
from collectors.scrape import EngineScraper, ScrapeOutcome
from collectors.scrape_sidecar import SidecarScraper
from collectors.store import Store
from collectors.store_write import WriteResult
from core.alerts import AlertEvaluator

log = logging.getLogger(__name__)

Scraper = EngineScraper | SidecarScraper | PromSource
RETRY_FOR_S = 600.0  # samples of a failed write are retried this long (a locked or full database)
RETRY_MAX = 20_000  # outcomes kept for retry at most (the newest)


class Writer:
    engine: Engine
    clock: Callable[[], float]
    config: CollectorConfig
    config_path: str | None
    store: Store
    evaluator: AlertEvaluator
    queue: queue.Queue[ScrapeOutcome | Callable[[], None]]
    scrapers: dict[str, Scraper]
    fronted: set[str]
    engine_labels: dict[str, tuple[str, ...]]
    failures: FailureLog
    skipped_runs: int
    scrapes_done: int
    write_failures: int
    _stop: threading.Event
    _writer: threading.Thread | None
    _retry: list[ScrapeOutcome]
    _pending_transitions: list[Any]
    _evaluated_ts: dict[str, float]

    def submit(self, op: Callable[[], None]) -> None:
        """Run `op` on the writer thread (or now, when no writer runs)."""
        if self._writer is None:
            op()
        else:
            self.queue.put(op)

    def process(self, outcomes: list[ScrapeOutcome]) -> WriteResult:
        """Store outcomes (with those a failed write left for retry), then run the alert rules on
        the targets they came from. A failed write is logged in one line and retried with the
        next batch; a sidecar's entries are simply read again (its cursors did not advance)."""
        batch = self._retry + list(outcomes)
        self._retry = []
        if not batch:
            return WriteResult()
        prom = self.prom_engines()
        fresh = {o.url: prom[o.url] for o in batch if o.url in prom and o.url not in self.store.target_ids}
        if fresh:
            try:
                register_engines(self.store, fresh, now=self.clock())
            except Exception as exc:  # noqa: BLE001 - locked or full: registered with a later batch
                cause = describe_failure(exc)
                self.failures.error(
                    "register", cause, "registering %d Prometheus engine(s) failed: %s", len(fresh), cause
                )
        result = self.store.write(batch)
        if result.failed:
            self._keep_for_retry(result)
        self.scrapes_done += len(outcomes)
        transitions = self._pending_transitions
        self._pending_transitions = []
        risk_rows: list[tuple[str, str, str, float, float]] = []
        for o in result.committed:
            scraper = self.scrapers.get(o.url)
            if scraper is None and o.url not in prom:
                continue
            if isinstance(scraper, SidecarScraper) and o.ok:
                scraper.commit(o)
            if o.ts <= self._evaluated_ts.get(o.url, -math.inf):
                continue  # a retried outcome older than what the rules have seen
            self._evaluated_ts[o.url] = o.ts
            self._observe(o)
            transitions.extend(self._evaluate(o.url, o.ts))
            if o.ok:  # the collapse risk judged on this scrape: its score and each input's contribution
                risk_rows.extend(
                    (o.url, label, name, o.ts, value)
                    for (_url, label), assessment in self.evaluator.risk_of(o.url, since=o.ts).items()
                    for name, value in assessment.signals().items()
                )
        self._apply(transitions)
        if risk_rows:
            try:
                self.store.write_derived(risk_rows)
            except Exception as exc:  # noqa: BLE001 - a lost risk sample is recomputed on the next scrape
                log.error(
                    "storing %d collapse-risk sample(s) failed: %s", len(risk_rows), describe_failure(exc)
                )
        return result

    def _keep_for_retry(self, result: WriteResult) -> None:
        now = self.clock()
        # Sidecar documents are read again from the uncommitted cursors; keep the samples only.
        kept = [
            replace(
                o, retried=True, state=None, sessions=None, subtrees=None, decisions=[], audit=[], turns=[]
            )
            for o in result.failed
            if now - o.ts <= RETRY_FOR_S
        ]
        self._retry = kept[-RETRY_MAX:]
        self.write_failures += 1
        cause = "; ".join(dict.fromkeys(result.causes))
        self.failures.error(
            "write",
            cause,
            "writing %d scrape outcome(s) failed (%s); %d kept to retry, sidecar entries will be read again",
            len(result.failed),
            cause,
            len(self._retry),
        )

    def _apply(self, transitions: list[Any]) -> None:
        try:
            self.store.apply_transitions(transitions, self.config)
        except Exception as exc:  # noqa: BLE001 - locked or full: keep them for the next batch
            self._pending_transitions = transitions + self._pending_transitions
            cause = describe_failure(exc)
            self.failures.error(
                "transitions",
                cause,
                "recording %d alert transition(s) failed (%s); retrying with the next batch",
                len(self._pending_transitions),
                cause,
            )

    def _observe(self, o: ScrapeOutcome) -> None:
        self.evaluator.observe_scrape(o.url, o.ts, o.ok, o.error)
        if not o.ok:
            return
        self.engine_labels[o.url] = o.engine_labels
        by_label: dict[str, dict[str, float | None]] = {}
        for label, name, value in o.samples:
            by_label.setdefault(label, {})[name] = value
        for label, values in by_label.items():
            self.evaluator.observe((o.url, label), o.ts, values)
        for d in o.decisions:
            regime = (d.get("data") or {}).get("regime")
            divergence = d.get("divergence")
            if divergence is None and regime is not None:
                divergence = 1.0 if regime == "thin-reuse" else 0.0
            # The collector's clock (when the grant was seen), not the sidecar's, times the hold.
            self.evaluator.observe_compaction(
                (o.url, ""), o.ts, granted=bool(d.get("granted")), divergence=divergence
            )

    def prom_engines(self) -> dict[str, Any]:
        """Engines read through `kind = "prometheus"` targets, by URL."""
        return {
            e.url: e for s in self.scrapers.values() if isinstance(s, PromSource) for e in s.engines.values()
        }

    def _evaluate(self, url: str, now: float) -> list[Any]:
        scraper = self.scrapers.get(url)
        if scraper is None:  # an engine read through a Prometheus source
            return self.evaluator.evaluate_target(
                url,
                now,
                role="engine",
                engine_labels=self.engine_labels.get(url) or ("",),
                fronted_by_sidecar=url in self.fronted,
            )
        labels = self.engine_labels.get(url) or ("",)
        return self.evaluator.evaluate_target(
            url, now, role=scraper.role, engine_labels=labels, fronted_by_sidecar=url in self.fronted
        )

    def sweep_alerts(self) -> None:
        """Evaluate every target now (stale-data needs a clock tick, not a scrape)."""
        now = self.clock()
        transitions = []
        for url in [*self.scrapers, *self.prom_engines()]:
            transitions.extend(self._evaluate(url, now))
        self._apply(transitions)

    def heartbeat(self) -> None:
        up = sum(1 for h in self.evaluator.health.values() if h.last_attempt_ok)
        self.store.heartbeat(
            targets=len(self.scrapers),
            targets_up=up,
            config_path=self.config_path,
            info={
                "scrapes": self.scrapes_done,
                "skipped_runs": self.skipped_runs,
                "write_failures": self.write_failures,
                "retry": len(self._retry),
                "queue": self.queue.qsize(),
            },
        )

    def maintenance(self) -> None:
        started = time.perf_counter()
        rolled = self.store.rollup()
        raw, roll = self.store.retention(self.config.raw_retention_s, self.config.rollup_retention_s)
        elapsed = time.perf_counter() - started
        log.debug(
            "maintenance: %d rollup rows, %d raw and %d rollup rows expired in %.2f s",
            rolled,
            raw,
            roll,
            elapsed,
        )
        self.queue_acks()

    def queue_acks(self) -> None:
        notify.queue_acknowledgements(self.engine, self.config.webhooks, now=self.clock())

    def _writer_loop(self) -> None:
        while not self._stop.is_set() or not self.queue.empty():
            try:
                item = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            batch: list[ScrapeOutcome] = []
            ops: list[Callable[[], None]] = []
            while True:
                (batch if isinstance(item, ScrapeOutcome) else ops).append(item)  # type: ignore[arg-type]
                if len(batch) >= 1000:
                    break
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
            self.guarded("processing scrape outcomes", self.process, batch)
            for op in ops:
                self.guarded(f"writer task {getattr(op, '__name__', '?')}", op)

    def guarded(self, what: str, op: Callable[..., Any], *args: Any) -> None:
        """Run `op`; a failure (a locked or full database) is one line per cause a minute, never a traceback."""
        try:
            op(*args)
        except Exception as exc:  # noqa: BLE001 - the writer and the jobs must outlive any failure
            cause = describe_failure(exc)
            self.failures.error(what, cause, "%s failed: %s", what, cause)

    def start_writer(self) -> None:
        self._writer = threading.Thread(target=self._writer_loop, name="writer", daemon=True)
        self._writer.start()

    def stop_writer(self) -> None:
        self._stop.set()
        if self._writer is not None:
            self._writer.join(timeout=30)
            self._writer = None
