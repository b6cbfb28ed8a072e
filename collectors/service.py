"""The collectors process: per-target scrape jobs on an APScheduler BlockingScheduler, one writer thread.

Threads:
- scheduler pool threads run one job per target every `interval_s` (``max_instances=1``: a
  slow target skips its own runs and never delays another target's) and put a
  `ScrapeOutcome` on the writer queue;
- the writer thread drains the queue in batches, writes each batch in one transaction,
  then feeds the alert evaluator and persists alert transitions and outbox rows;
- small jobs: heartbeat (every interval), alert sweep for stale data (every second),
  webhook delivery (every second), config reload (every 2 s), rollups and retention (every 60 s).
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor as FuturesPool
from dataclasses import replace
from typing import Any

import httpx
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.blocking import BlockingScheduler
from sqlalchemy import Engine

from collectors import notify
from collectors.alertmanager import AlertmanagerSender
from collectors.config import CollectorConfig, ConfigError, ConfigWatcher
from collectors.failures import FailureLog, describe_failure
from collectors.prom_source import PromSource, register_engines
from collectors.scrape import EngineScraper, ScrapeOutcome, SidecarScraper
from collectors.store import Store
from collectors.store_write import WriteResult
from core.alerts import AlertEvaluator, TargetHealth

log = logging.getLogger(__name__)

Scraper = EngineScraper | SidecarScraper | PromSource
MAINTENANCE_EVERY_S = 60.0
FAST_WORKERS = 32
SLOW_WORKERS = 512
SLOW_FRACTION = 0.5  # a scrape taking over half its interval (or timing out) marks the target slow
FAST_AGAIN_AFTER = 10  # consecutive quick scrapes before a slow target goes back to the shared pool
REPEAT_ERROR_LOG_S = 60.0
RETRY_FOR_S = 600.0  # samples of a failed write are retried this long (a locked or full database)
RETRY_MAX = 20_000  # outcomes kept for retry at most (the newest)


class Collector:
    def __init__(self, config: CollectorConfig, engine: Engine, *, config_path: str | None = None,
                 cli_engines: list[str] | None = None, cli_sidecars: list[str] | None = None,
                 clock: Callable[[], float] = time.time, name: str = "collectors") -> None:
        self.engine = engine
        self.clock = clock
        self.config_path = config_path
        self.cli_engines = list(cli_engines or [])
        self.cli_sidecars = list(cli_sidecars or [])
        self.store = Store(engine, clock=clock, name=name)
        self.evaluator = AlertEvaluator(config.alerts)
        self.client = httpx.Client(limits=httpx.Limits(max_connections=1000, max_keepalive_connections=1000),
                                   follow_redirects=False, headers={"User-Agent": "prefixops-collectors"})
        self.queue: queue.Queue[ScrapeOutcome | Callable[[], None]] = queue.Queue()
        self.scrapers: dict[str, Scraper] = {}
        self.scheduler: BlockingScheduler | None = None
        self.notifier = notify.Notifier(engine, self.client, clock=clock)
        self.alertmanager = AlertmanagerSender(engine, self.client, clock=clock)
        self.watcher = ConfigWatcher(config_path) if config_path else None
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._last_error_log: dict[str, tuple[str, float]] = {}
        self.skipped_runs = 0
        self.engine_labels: dict[str, tuple[str, ...]] = {}
        self._slow: set[str] = set()
        self._quick_streak: dict[str, int] = {}
        self.scrapes_done = 0
        self.write_failures = 0
        self._retry: list[ScrapeOutcome] = []
        self._pending_transitions: list[Any] = []
        self._evaluated_ts: dict[str, float] = {}
        self.failures = FailureLog(log, clock, REPEAT_ERROR_LOG_S)
        self.config = config
        self.apply_config(config)

    # ------------------------------------------------------------------ configuration

    def apply_config(self, config: CollectorConfig) -> None:
        """Install a (new) target list: targets added get scrapers and jobs, removed ones lose them."""
        if self.evaluator.settings != config.alerts:
            self.evaluator.update_settings(config.alerts)
        self.config = config
        self.store.sync_targets(config)
        register_engines(self.store, self.prom_engines(), now=self.clock())  # sync_targets unlisted them
        wanted: dict[str, Any] = {e.url: e for e in config.engines}
        wanted.update({s.url: s for s in config.sidecars})
        for url in list(self.scrapers):
            if url not in wanted or self._changed(self.scrapers[url], wanted[url], config):
                self._remove_job(url)
                del self.scrapers[url]
                self.evaluator.forget_target(url)
        for e in config.engines:
            if e.url not in self.scrapers and e.kind == "prometheus":
                self.scrapers[e.url] = PromSource(e, interval_s=config.interval_for(e), timeout_s=config.timeout_s,
                                                  clock=self.clock)
                self._add_job(e.url)
            elif e.url not in self.scrapers:
                self.scrapers[e.url] = EngineScraper(e, interval_s=config.interval_for(e), timeout_s=config.timeout_s,
                                                     max_page_bytes=config.max_page_bytes, clock=self.clock)
                self._add_job(e.url)
        for s in config.sidecars:
            if s.url not in self.scrapers:
                self.scrapers[s.url] = SidecarScraper(s, interval_s=config.interval_for(s), timeout_s=config.timeout_s,
                                                      max_page_bytes=config.max_page_bytes,
                                                      cursors=self.store.cursors(s.url), clock=self.clock)
                self._add_job(s.url)
        health = self.store.target_health()
        for url in self.scrapers:
            row = health.get(url)
            if url in self.evaluator.health or row is None or row["last_scrape_ts"] is None:
                continue
            # A restarted collector carries on from the stored scrape history of failing targets, so a
            # target that was down stays down (its open alert is neither resolved nor re-fired by the
            # restart). Healthy ones start fresh: the collector's own downtime is not stale data.
            failures = int(row["consecutive_failures"] or 0)
            if not failures:
                continue
            self.evaluator.health[url] = TargetHealth(
                last_attempt_ts=row["last_scrape_ts"], last_attempt_ok=bool(row["up"]),
                last_success_ts=row["last_success_ts"], consecutive_failures=failures,
                failing_since=(row["last_success_ts"] or row["last_scrape_ts"]) if failures else None,
                last_error=row["last_error"])
        for rule, url, label in self.store.open_alert_keys():
            if url in self.scrapers:
                self.evaluator.restore_firing(rule, (url, label))
        self.store.resolve_alerts_of_removed_targets(self.clock())
        self.fronted = {s.engine for s in config.sidecars if s.engine}

    @staticmethod
    def _changed(scraper: Scraper, target: Any, config: CollectorConfig) -> bool:
        return scraper.target != target or scraper.interval_s != config.interval_for(target) \
            or scraper.timeout_s != config.timeout_s

    def reload_config(self) -> None:
        if self.watcher is None:
            return
        try:
            fresh = self.watcher.poll()
        except ConfigError as exc:
            log.error("config reload failed, keeping the previous targets: %s", exc)
            return
        if fresh is None:
            return
        try:
            fresh = fresh.with_cli_targets(self.cli_engines, self.cli_sidecars)
        except ConfigError as exc:
            log.error("config reload failed: %s", exc)
            return
        log.info("config %s changed: %d engine(s), %d sidecar(s)", self.config_path, len(fresh.engines),
                 len(fresh.sidecars))
        self.submit(lambda: self.apply_config(fresh))

    # ------------------------------------------------------------------ jobs

    def _add_job(self, url: str) -> None:
        if self.scheduler is None:
            return
        scraper = self.scrapers[url]
        first = self.clock() + random.uniform(0, scraper.interval_s)  # spread targets over the interval
        import datetime as dt

        self.scheduler.add_job(self.scrape_target, "interval", seconds=scraper.interval_s, args=[url], id=f"scrape:{url}",
                               next_run_time=dt.datetime.fromtimestamp(first, dt.UTC), replace_existing=True,
                               executor="slow" if url in self._slow else "default")

    def _remove_job(self, url: str) -> None:
        if self.scheduler is not None and self.scheduler.get_job(f"scrape:{url}") is not None:
            self.scheduler.remove_job(f"scrape:{url}")

    def scrape_target(self, url: str) -> None:
        scraper = self.scrapers.get(url)
        if scraper is None or self._stop.is_set():
            return
        try:
            outcome = scraper.scrape(self.client)
        except Exception:  # a bug, not an expected failure: keep the job alive and say where
            log.exception("scrape of %s crashed", url)
            return
        if self._stop.is_set():
            return  # shutting down: the client was closed under this scrape, its failure is not data
        outcomes = outcome if isinstance(outcome, list) else [outcome]
        self._place(url, scraper, outcomes[0])
        for o in outcomes:
            self._log_outcome(o)
            self.queue.put(o)

    def _place(self, url: str, scraper: Scraper, outcome: ScrapeOutcome) -> None:
        """Move a target's job between the shared pool and the slow pool."""
        if self.scheduler is None:
            return
        slow = outcome.duration_s > SLOW_FRACTION * scraper.interval_s or (
            not outcome.ok and ("timeout" in (outcome.error or "") or "too slowly" in (outcome.error or "")))
        job_id = f"scrape:{url}"
        if slow:
            self._quick_streak[url] = 0
            if url not in self._slow:
                self._slow.add(url)
                with contextlib.suppress(JobLookupError):
                    self.scheduler.modify_job(job_id, executor="slow")
        elif url in self._slow:
            self._quick_streak[url] = self._quick_streak.get(url, 0) + 1
            if self._quick_streak[url] >= FAST_AGAIN_AFTER:
                self._slow.discard(url)
                with contextlib.suppress(JobLookupError):
                    self.scheduler.modify_job(job_id, executor="default")

    def _log_outcome(self, outcome: ScrapeOutcome) -> None:
        previous = self._last_error_log.get(outcome.url)
        if outcome.ok:
            if previous is not None:
                log.info("%s is back up", outcome.url)
                del self._last_error_log[outcome.url]
            return
        error = outcome.error or "unknown error"
        now = self.clock()
        if previous is None or previous[0] != error or now - previous[1] >= REPEAT_ERROR_LOG_S:
            log.warning("scrape failed: %s", error)
            self._last_error_log[outcome.url] = (error, now)

    def submit(self, op: Callable[[], None]) -> None:
        """Run `op` on the writer thread (or now, when no writer runs)."""
        if self._writer is None:
            op()
        else:
            self.queue.put(op)

    # ------------------------------------------------------------------ writer

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
                self.failures.error("register", cause, "registering %d Prometheus engine(s) failed: %s",
                                    len(fresh), cause)
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
                risk_rows.extend((o.url, label, name, o.ts, value)
                                 for (_url, label), assessment in self.evaluator.risk_of(o.url, since=o.ts).items()
                                 for name, value in assessment.signals().items())
        self._apply(transitions)
        if risk_rows:
            try:
                self.store.write_derived(risk_rows)
            except Exception as exc:  # noqa: BLE001 - a lost risk sample is recomputed on the next scrape
                log.error("storing %d collapse-risk sample(s) failed: %s", len(risk_rows), describe_failure(exc))
        return result

    def _keep_for_retry(self, result: WriteResult) -> None:
        now = self.clock()
        # Sidecar documents are read again from the uncommitted cursors; keep the samples only.
        kept = [replace(o, retried=True, state=None, sessions=None, subtrees=None, decisions=[], audit=[],
                        turns=[])
                for o in result.failed if now - o.ts <= RETRY_FOR_S]
        self._retry = kept[-RETRY_MAX:]
        self.write_failures += 1
        cause = "; ".join(dict.fromkeys(result.causes))
        self.failures.error("write", cause, "writing %d scrape outcome(s) failed (%s); %d kept to retry, sidecar "
                            "entries will be read again", len(result.failed), cause, len(self._retry))

    def _apply(self, transitions: list[Any]) -> None:
        try:
            self.store.apply_transitions(transitions, self.config)
        except Exception as exc:  # noqa: BLE001 - locked or full: keep them for the next batch
            self._pending_transitions = transitions + self._pending_transitions
            cause = describe_failure(exc)
            self.failures.error("transitions", cause, "recording %d alert transition(s) failed (%s); retrying "
                                "with the next batch", len(self._pending_transitions), cause)

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
            self.evaluator.observe_compaction((o.url, ""), o.ts, granted=bool(d.get("granted")),
                                              divergence=divergence)

    def prom_engines(self) -> dict[str, Any]:
        """Engines read through `kind = "prometheus"` targets, by URL."""
        return {e.url: e for s in self.scrapers.values() if isinstance(s, PromSource) for e in s.engines.values()}

    def _evaluate(self, url: str, now: float) -> list[Any]:
        scraper = self.scrapers.get(url)
        if scraper is None:  # an engine read through a Prometheus source
            return self.evaluator.evaluate_target(url, now, role="engine", engine_labels=self.engine_labels.get(url)
                                                  or ("",), fronted_by_sidecar=url in self.fronted)
        labels = self.engine_labels.get(url) or ("",)
        return self.evaluator.evaluate_target(url, now, role=scraper.role, engine_labels=labels,
                                              fronted_by_sidecar=url in self.fronted)

    def sweep_alerts(self) -> None:
        """Evaluate every target now (stale-data needs a clock tick, not a scrape)."""
        now = self.clock()
        transitions = []
        for url in [*self.scrapers, *self.prom_engines()]:
            transitions.extend(self._evaluate(url, now))
        self._apply(transitions)

    def heartbeat(self) -> None:
        up = sum(1 for h in self.evaluator.health.values() if h.last_attempt_ok)
        self.store.heartbeat(targets=len(self.scrapers), targets_up=up, config_path=self.config_path,
                             info={"scrapes": self.scrapes_done, "skipped_runs": self.skipped_runs,
                                   "write_failures": self.write_failures, "retry": len(self._retry),
                                   "queue": self.queue.qsize()})

    def maintenance(self) -> None:
        started = time.perf_counter()
        rolled = self.store.rollup()
        raw, roll = self.store.retention(self.config.raw_retention_s, self.config.rollup_retention_s)
        elapsed = time.perf_counter() - started
        log.debug("maintenance: %d rollup rows, %d raw and %d rollup rows expired in %.2f s", rolled, raw, roll, elapsed)
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

    # ------------------------------------------------------------------ running

    def run(self) -> None:
        """Run until SIGTERM/SIGINT."""
        # Few threads for healthy targets (hundreds of threads competing for the GIL cost more CPU per
        # scrape than they save), many for slow ones: a target that timed out or answered slowly moves
        # to the "slow" pool, where it waits without holding up anybody else's scrape.
        self.scheduler = BlockingScheduler(
            executors={"default": ThreadPoolExecutor(FAST_WORKERS),
                       "slow": ThreadPoolExecutor(min(SLOW_WORKERS, max(8, len(self.scrapers) + 8)))},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 5},
            timezone="UTC")

        def on_skip(event: JobExecutionEvent) -> None:
            self.skipped_runs += 1

        self.scheduler.add_listener(on_skip, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        for url in self.scrapers:
            self._add_job(url)
        interval = self.config.interval_s
        self.scheduler.add_job(lambda: self.submit(self.heartbeat), "interval", seconds=interval, id="heartbeat")
        self.scheduler.add_job(lambda: self.submit(self.sweep_alerts), "interval", seconds=1.0, id="alerts")
        self.scheduler.add_job(self.guarded, "interval", args=["webhook delivery", self._deliver], seconds=1.0,
                               id="notify")
        self.scheduler.add_job(self.guarded, "interval", args=["Alertmanager delivery", self._send_alertmanagers],
                               seconds=1.0, id="alertmanagers")
        self.scheduler.add_job(lambda: self.submit(self.queue_acks), "interval", seconds=5.0, id="acks")
        self.scheduler.add_job(lambda: self.submit(self.maintenance), "interval", seconds=MAINTENANCE_EVERY_S,
                               id="maintenance")
        if self.watcher is not None:
            self.scheduler.add_job(self.reload_config, "interval", seconds=2.0, id="config")
        self.start_writer()
        self.submit(self.heartbeat)
        self.submit(self.maintenance)

        def stop(signum: int, _frame: Any) -> None:
            log.info("signal %d: stopping", signum)
            self._stop.set()
            if self.scheduler is not None and self.scheduler.running:
                self.scheduler.shutdown(wait=False)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info("collecting from %d target(s) every %g s", len(self.scrapers), interval)
        try:
            self.scheduler.start()
        finally:
            self.stop_writer()
            self.client.close()

    def _send_alertmanagers(self) -> None:
        if self.config.alertmanagers:
            self.alertmanager.tick(self.config.alertmanagers, self.config.dashboard_url)

    def _deliver(self) -> None:
        if self.config.webhooks:
            self.notifier.deliver_due(self.config.webhooks, write=self.submit)

    def run_once(self, rounds: int = 2, pause_s: float | None = None) -> None:
        """Scrape every target `rounds` times (enough for rates), evaluate alerts, deliver, roll up; return."""
        pause = min(self.config.interval_s, 1.0) if pause_s is None else pause_s
        with FuturesPool(max_workers=min(64, max(4, len(self.scrapers)))) as pool:
            for i in range(rounds):
                if i:
                    time.sleep(pause)
                results = list(pool.map(lambda s: s.scrape(self.client), list(self.scrapers.values())))
                outcomes = [o for r in results for o in (r if isinstance(r, list) else [r])]
                for o in outcomes:
                    self._log_outcome(o)
                self.process(outcomes)
        self.sweep_alerts()
        self.heartbeat()
        if self.config.webhooks:
            self.notifier.deliver_due(self.config.webhooks)
        self._send_alertmanagers()
        self.store.rollup()
        self.client.close()

