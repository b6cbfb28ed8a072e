"""Prometheus as a fleet source: engine signals read from a Prometheus-compatible query API (Prometheus,
Thanos, Mimir) instead of scraping every engine.

Fleet TOML::

    [[engines]]
    url = "http://prometheus.example:9090"      # the query API's base URL (/api/v1/query is added)
    kind = "prometheus"
    matchers = 'job="vllm", cluster="eu-1"'     # label matchers every query carries (optional)
    auth_header = "Bearer ..."                  # optional: sent as the Authorization header
    interval_s = 15                             # one cycle per interval: use Prometheus' scrape interval

Each cycle makes one instant query per signal family for all engines (``up``, the scrape time, the
prefix-cache queries and hits, prompt, generation and cached tokens, preemptions, KV usage, running and
waiting requests, ``vllm:cache_config_info``, ``process_start_time_seconds``, and each serving histogram of
`core.engine_metrics.histograms`: TTFT, end-to-end and inter-token latency, queue time, prompt and output
lengths; and the ``_sum`` of the histograms whose interval mean is a signal, for ``e2e_mean``,
``itl_mean``, ``decode_time_mean`` and ``output_len_mean``).
Every engine, identified by its ``job`` and ``instance`` labels, becomes a target row exactly like a
scraped one (URL ``http://<instance>``, name ``<instance>``, its other target labels as labels), and its
samples go through the same code as a scraped page (`core.engine_metrics.page_from_samples`, then
`EngineScraper`'s rates): counter resets (a new ``process_start_time_seconds``, or a counter going down)
give no rate for that interval, as when scraping.

Rates are computed between the engine's own scrape times (``timestamp()`` of its samples), so a cycle that
sees no new Prometheus scrape of an engine writes nothing for it. An engine Prometheus reports ``up == 0``
is a failed scrape (``target-down`` applies); one whose series are gone from Prometheus gets no sample, so
``stale-data`` fires. The Prometheus API itself is the configured target: its row records whether the
queries answered (role ``source``: not an engine on the pages; ``target-down`` and ``stale-data`` apply).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import insert, select, update

from collectors.config import EngineTarget
from collectors.scrape import EngineScraper, ScrapeOutcome
from collectors.store import Store
from core import engine_metrics as em
from core import signals as sig
from core.engine_metrics import histograms as hist
from db.models import Target

# Signal families of vLLM (current and legacy names of one family in one query).
FAMILIES: tuple[tuple[str, ...], ...] = (
    ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    ("vllm:prompt_tokens_total",),
    ("vllm:generation_tokens_total",),
    ("vllm:prompt_tokens_cached_total",),
    ("vllm:num_preemptions_total",),
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ("vllm:num_requests_running",),
    ("vllm:num_requests_waiting",),
    ("vllm:cache_config_info",),
    # The serving histograms (TTFT, end-to-end, inter-token, queue time, prompt and output lengths).
    *(kinds["vllm"] for kinds in hist.FAMILIES.values()),
    # Their ``_sum`` series where an interval mean is a signal (`histograms.MEAN_FAMILIES`).
    *((n,) for n in hist.sum_names_for("vllm")),
)
# Labels that tell series of one target apart (not the target's identity).
SERIES_LABELS = frozenset({"__name__", "engine", "model_name", "le"})
MAX_RESPONSE_BYTES = 200_000_000


class PromQueryError(Exception):
    """The query API failed or answered something unusable; str() says which query and why."""


def selector(names: tuple[str, ...], matchers: str) -> str:
    name = f'__name__="{names[0]}"' if len(names) == 1 else f'__name__=~"{"|".join(names)}"'
    return "{" + ", ".join(m for m in (name, matchers.strip().strip("{}").strip()) if m) + "}"


def engine_url(instance: str) -> str:
    return instance if urlsplit(instance).scheme in ("http", "https") else f"http://{instance}"


@dataclass
class _Engine:
    url: str
    name: str
    labels: dict[str, str]
    scraper: EngineScraper
    last_sample_ts: float | None = None


@dataclass
class PromSource:
    """One ``kind = "prometheus"`` target: `scrape` returns the API's own outcome, then one per engine."""

    target: EngineTarget
    interval_s: float
    timeout_s: float
    clock: Callable[[], float] = time.time
    engines: dict[tuple[str, str], _Engine] = field(default_factory=dict)
    role: str = "source"  # the query API's own row: up/down of the queries, no engine signals

    @property
    def url(self) -> str:
        return self.target.url

    @property
    def max_page_bytes(self) -> int:
        return MAX_RESPONSE_BYTES

    def _headers(self) -> dict[str, str]:
        return {"Authorization": self.target.auth_header} if self.target.auth_header else {}

    def query(self, client: httpx.Client, promql: str, ts: float) -> list[dict[str, Any]]:
        try:
            response = client.get(
                self.url + "/api/v1/query",
                params={"query": promql, "time": f"{ts:.3f}"},
                headers=self._headers(),
                timeout=self.timeout_s,
            )
        except httpx.HTTPError as exc:
            raise PromQueryError(f"{self.url}/api/v1/query {promql!r}: {type(exc).__name__}: {exc}") from None
        try:
            doc = response.json()
        except ValueError:
            raise PromQueryError(
                f"{self.url}/api/v1/query {promql!r}: HTTP {response.status_code}, not JSON "
                f"(starts with {response.text[:80]!r})"
            ) from None
        if response.status_code != 200 or doc.get("status") != "success":
            raise PromQueryError(
                f"{self.url}/api/v1/query {promql!r}: HTTP {response.status_code}: "
                f"{doc.get('errorType', '')} {doc.get('error', '')}".rstrip()
            )
        data = doc.get("data") or {}
        if data.get("resultType") != "vector":
            raise PromQueryError(
                f"{self.url}/api/v1/query {promql!r}: expected a vector, got {data.get('resultType')}"
            )
        return list(data.get("result") or [])

    def scrape(self, client: httpx.Client) -> list[ScrapeOutcome]:
        started = time.perf_counter()
        ts = self.clock()
        matchers = self.target.matchers
        try:
            up = self.query(client, selector(("up",), matchers), ts)
            stamps = self.query(
                client, f"timestamp({selector(('vllm:num_requests_running',), matchers)})", ts
            )
            families = [self.query(client, selector(names, matchers), ts) for names in FAMILIES]
            start = self.query(client, selector(("process_start_time_seconds",), matchers), ts)
        except PromQueryError as exc:
            return [
                ScrapeOutcome(
                    self.url,
                    self.role,
                    ts,
                    False,
                    time.perf_counter() - started,
                    error=str(exc),
                    kind="prometheus",
                )
            ]
        outcomes = self._engine_outcomes(up, stamps, families, start, ts)
        duration = time.perf_counter() - started
        api = ScrapeOutcome(
            self.url,
            self.role,
            ts,
            True,
            duration,
            kind="prometheus",
            samples=[("", sig.UP, 1.0), ("", sig.SCRAPE_DURATION_S, duration)],
            engine_labels=(),
        )
        return [api, *outcomes]

    def _engine(self, labels: dict[str, str]) -> _Engine:
        key = (labels.get("job", ""), labels.get("instance", ""))
        found = self.engines.get(key)
        if found is None:
            instance = key[1] or key[0]
            target_labels = {k: v for k, v in labels.items() if k not in SERIES_LABELS and k != "instance"}
            url = engine_url(instance)
            scraper = EngineScraper(
                EngineTarget(url=url, kind="vllm", name=instance, labels=target_labels),
                interval_s=self.interval_s,
                timeout_s=self.timeout_s,
                max_page_bytes=0,
                clock=self.clock,
            )
            found = self.engines[key] = _Engine(url, instance, target_labels, scraper)
        return found

    def _engine_outcomes(
        self,
        up: list[dict[str, Any]],
        stamps: list[dict[str, Any]],
        families: list[list[dict[str, Any]]],
        start: list[dict[str, Any]],
        ts: float,
    ) -> list[ScrapeOutcome]:
        samples: dict[tuple[str, str], list[tuple[str, dict[str, str], float]]] = {}
        for result in families + [start]:
            for row in result:
                labels = row["metric"]
                key = (labels.get("job", ""), labels.get("instance", ""))
                samples.setdefault(key, []).append(
                    (labels.get("__name__", ""), labels, float(row["value"][1]))
                )
        scraped_at: dict[tuple[str, str], float] = {}
        for row in stamps:
            key = (row["metric"].get("job", ""), row["metric"].get("instance", ""))
            scraped_at[key] = max(scraped_at.get(key, 0.0), float(row["value"][1]))
        up_of: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
        for row in up:
            labels = {k: v for k, v in row["metric"].items() if k != "__name__"}
            up_of[(labels.get("job", ""), labels.get("instance", ""))] = (float(row["value"][1]), labels)
        out: list[ScrapeOutcome] = []
        for key in sorted(set(samples) | set(up_of)):
            engine_samples = samples.get(key)
            up_value, up_labels = up_of.get(key, (1.0, {}))
            if up_value < 1 and (engine_samples or key in self.engines):
                engine = self._engine(up_labels)
                out.append(
                    ScrapeOutcome(
                        engine.url,
                        "engine",
                        ts,
                        False,
                        0.0,
                        kind="vllm",
                        error=f"Prometheus {self.url} reports up == 0 for {key[1] or key[0]}",
                    )
                )
                continue
            if not engine_samples:
                continue  # not a vLLM engine (another target of the matched jobs), or its series are gone
            engine = self._engine(up_labels or {k: v for k, v in engine_samples[0][1].items()})
            sample_ts = scraped_at.get(key, ts)
            if engine.last_sample_ts is not None and sample_ts <= engine.last_sample_ts:
                continue  # no new Prometheus scrape of this engine since the last cycle
            engine.last_sample_ts = sample_ts
            page = em.page_from_samples(engine_samples, "vllm")
            if not page.engines:
                out.append(
                    ScrapeOutcome(
                        engine.url,
                        "engine",
                        ts,
                        False,
                        0.0,
                        kind="vllm",
                        error=f"Prometheus {self.url}: no vLLM engine metrics for {engine.name}",
                    )
                )
                continue
            out.append(engine.scraper.ingest_page(page, sample_ts))
        return out


def register_engines(store: Store, engines: Mapping[str, _Engine], *, now: float) -> None:
    """Make every engine read through Prometheus a target row (like a configured engine; ``configured_kind``
    "prometheus"), and keep the store's URL -> id map current. Runs on the writer thread."""
    if not engines:
        return
    with store.engine.begin() as conn:
        existing = {
            r.url: r.id
            for r in conn.execute(select(Target.id, Target.url).where(Target.url.in_(list(engines))))
        }
        for url, e in engines.items():
            values = {
                "role": "engine",
                "configured_kind": "prometheus",
                "name": e.name,
                "labels": e.labels,
                "interval_s": e.scraper.interval_s,
                "configured": True,
            }
            if url in existing:
                conn.execute(update(Target).where(Target.id == existing[url]).values(**values))
            else:
                conn.execute(
                    insert(Target).values(
                        url=url, kind="vllm", up=False, consecutive_failures=0, created_ts=now, **values
                    )
                )
        rows = conn.execute(
            select(Target.id, Target.url, Target.role).where(Target.url.in_(list(engines)))
        ).all()
    for r in rows:
        store.target_ids[r.url] = r.id
        store.target_roles[r.url] = r.role
