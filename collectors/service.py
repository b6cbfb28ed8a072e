"""The collectors process: per-target scrape jobs on an APScheduler BlockingScheduler, one writer thread.

Threads:
- scheduler pool threads run one job per target every `interval_s` (``max_instances=1``: a
  slow target skips its own runs and never delays another target's) and put a
  `ScrapeOutcome` on the writer queue;
- the writer thread drains the queue in batches, writes each batch in one transaction,
  then feeds the alert evaluator and persists alert transitions and outbox rows;
- small jobs: heartbeat (every interval), alert sweep for stale data (every second),
  webhook delivery (every second), config reload (every 2 s), rollups and retention (every 60 s).

This module is the scheduling side: the configuration (targets added, changed, removed), the
per-target scrape jobs and the pools they run in, and running the process. What the writer
thread does is `collectors.service_writer.Writer`, a mixin of `Collector`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor as FuturesPool
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
from collectors.failures import FailureLog
from collectors.prom_source import PromSource, register_engines
from collectors.scrape import EngineScraper, ScrapeOutcome
from collectors.scrape_sidecar import SidecarScraper
from collectors.service_writer import Scraper, Writer
from collectors.store import Store
from core.alerts import AlertEvaluator, TargetHealth

log = logging.getLogger(__name__)

MAINTENANCE_EVERY_S = 60.0
FAST_WORKERS = 32
SLOW_WORKERS = 512
SLOW_FRACTION = 0.5  # a scrape taking over half its interval (or timing out) marks the target slow
FAST_AGAIN_AFTER = 10  # consecutive quick scrapes before a slow target goes back to the shared pool
REPEAT_ERROR_LOG_S = 60.0


class Collector(Writer):
    def __init__(
        self,
        config: CollectorConfig,
        engine: Engine,
        *,
        config_path: str | None = None,
        cli_engines: list[str] | None = None,
        cli_sidecars: list[str] | None = None,
        clock: Callable[[], float] = time.time,
        name: str = "collectors",
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.config_path = config_path
        self.cli_engines = list(cli_engines or [])
        self.cli_sidecars = list(cli_sidecars or [])
        self.store = Store(engine, clock=clock, name=name)
        self.evaluator = AlertEvaluator(config.alerts)
        self.client = httpx.Client(
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=1000),
            follow_redirects=False,
            headers={"User-Agent": "prefixops-collectors"},
        )
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
                self.scrapers[e.url] = PromSource(
                    e, interval_s=config.interval_for(e), timeout_s=config.timeout_s, clock=self.clock
                )
                self._add_job(e.url)
            elif e.url not in self.scrapers:
                self.scrapers[e.url] = EngineScraper(
                    e,
                    interval_s=config.interval_for(e),
                    timeout_s=config.timeout_s,
                    max_page_bytes=config.max_page_bytes,
                    clock=self.clock,
                )
                self._add_job(e.url)
        for s in config.sidecars:
            if s.url not in self.scrapers:
                self.scrapers[s.url] = SidecarScraper(
                    s,
                    interval_s=config.interval_for(s),
                    timeout_s=config.timeout_s,
                    max_page_bytes=config.max_page_bytes,
                    cursors=self.store.cursors(s.url),
                    clock=self.clock,
                )
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
                last_attempt_ts=row["last_scrape_ts"],
                last_attempt_ok=bool(row["up"]),
                last_success_ts=row["last_success_ts"],
                consecutive_failures=failures,
                failing_since=(row["last_success_ts"] or row["last_scrape_ts"]) if failures else None,
                last_error=row["last_error"],
            )
        for rule, url, label in self.store.open_alert_keys():
            if url in self.scrapers:
                self.evaluator.restore_firing(rule, (url, label))
        self.store.resolve_alerts_of_removed_targets(self.clock())
        self.fronted = {s.engine for s in config.sidecars if s.engine}

    @staticmethod
    def _changed(scraper: Scraper, target: Any, config: CollectorConfig) -> bool:
        return (
            scraper.target != target
            or scraper.interval_s != config.interval_for(target)
            or scraper.timeout_s != config.timeout_s
        )

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
        log.info(
            "config %s changed: %d engine(s), %d sidecar(s)",
            self.config_path,
            len(fresh.engines),
            len(fresh.sidecars),
        )
        self.submit(lambda: self.apply_config(fresh))

    # ------------------------------------------------------------------ jobs

    def _add_job(self, url: str) -> None:
        if self.scheduler is None:
            return
        scraper = self.scrapers[url]
        first = self.clock() + random.uniform(0, scraper.interval_s)  # spread targets over the interval
        import datetime as dt

        self.scheduler.add_job(
            self.scrape_target,
            "interval",
            seconds=scraper.interval_s,
            args=[url],
            id=f"scrape:{url}",
            next_run_time=dt.datetime.fromtimestamp(first, dt.UTC),
            replace_existing=True,
            executor="slow" if url in self._slow else "default",
        )

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
            not outcome.ok and ("timeout" in (outcome.error or "") or "too slowly" in (outcome.error or ""))
        )
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

    # ------------------------------------------------------------------ running

    def run(self) -> None:
        """Run until SIGTERM/SIGINT."""
        # Few threads for healthy targets (hundreds of threads competing for the GIL cost more CPU per
        # scrape than they save), many for slow ones: a target that timed out or answered slowly moves
        # to the "slow" pool, where it waits without holding up anybody else's scrape.
        self.scheduler = BlockingScheduler(
            executors={
                "default": ThreadPoolExecutor(FAST_WORKERS),
                "slow": ThreadPoolExecutor(min(SLOW_WORKERS, max(8, len(self.scrapers) + 8))),
            },
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 5},
            timezone="UTC",
        )

        def on_skip(event: JobExecutionEvent) -> None:
            self.skipped_runs += 1

        self.scheduler.add_listener(on_skip, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        for url in self.scrapers:
            self._add_job(url)
        interval = self.config.interval_s
        self.scheduler.add_job(
            lambda: self.submit(self.heartbeat), "interval", seconds=interval, id="heartbeat"
        )
        self.scheduler.add_job(lambda: self.submit(self.sweep_alerts), "interval", seconds=1.0, id="alerts")
        self.scheduler.add_job(
            self.guarded, "interval", args=["webhook delivery", self._deliver], seconds=1.0, id="notify"
        )
        self.scheduler.add_job(
            self.guarded,
            "interval",
            args=["Alertmanager delivery", self._send_alertmanagers],
            seconds=1.0,
            id="alertmanagers",
        )
        self.scheduler.add_job(lambda: self.submit(self.queue_acks), "interval", seconds=5.0, id="acks")
        self.scheduler.add_job(
            lambda: self.submit(self.maintenance), "interval", seconds=MAINTENANCE_EVERY_S, id="maintenance"
        )
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
