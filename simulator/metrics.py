"""Prometheus exposition of the simulated engine, with vLLM V1's names, labels and semantics.

``EngineCollector`` reads the engine at scrape time; register it on a fresh
``CollectorRegistry`` (no global state). Families and labels follow vLLM 0.33's
``PrometheusStatLogger`` (see tests/fixtures/engine-metrics/vllm-0.33.0-statlogger.prom):
``model_name`` and ``engine="0"`` on every engine family, ``cache_config_info``
without ``model_name``. ``vllm:kv_cache_usage_perc`` is ``1 - free/total``, so
cached prefixes no running request uses count as free; the ground truth the
gauge hides is exported under ``sim:``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from simulator.engine import Engine, Histogram


class EngineCollector(Collector):
    def __init__(
        self,
        engine: Engine,
        created: float,
        extra: Callable[[], dict[str, float]] | None = None,
        time_scale: float = 1.0,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        self.engine = engine
        self.created = created
        self.extra = extra
        self.time_scale = time_scale

    def _labels(self) -> tuple[list[str], list[str]]:
        return ["engine", "model_name"], ["0", self.engine.model_name]

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        names, values = self._labels()
        fam = CounterMetricFamily(name, doc, labels=names)
        fam.add_metric(values, value, created=self.created)
        return fam

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        names, values = self._labels()
        fam = GaugeMetricFamily(name, doc, labels=names)
        fam.add_metric(values, value)
        return fam

    def _histogram(self, name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
        names, values = self._labels()
        fam = HistogramMetricFamily(name, doc, labels=names)
        buckets, total = hist.cumulative(), hist.total
        if name.endswith("_seconds") and self.time_scale != 1.0:  # simulated seconds -> wall seconds
            buckets = [(b if b == "+Inf" else repr(float(b) / self.time_scale), c) for b, c in buckets]
            total = total / self.time_scale
        fam.add_metric(values, buckets, sum_value=total)
        return fam

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        st = e.stats
        pool = e.pool
        cfg = e.config
        names, values = self._labels()
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", len(e.running)
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", len(e.waiting)
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv_usage
        )
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            st.prefix_queries,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            st.prefix_hits,
        )
        yield self._counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
            st.external_queries,
        )
        yield self._counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, "
            "in terms of number of cached tokens.",
            st.external_hits,
        )
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", st.preemptions
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens)
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", labels=[*names, "source"]
        )
        for source, value in (
            ("local_compute", st.prompt_computed),
            ("local_cache_hit", st.prompt_cached),
            ("external_kv_transfer", st.prompt_offloaded),
        ):
            by_source.add_metric([*values, source], value, created=self.created)
        yield by_source
        yield self._counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            st.prompt_cached + st.prompt_offloaded,
        )
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", st.generation_tokens
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=["engine", "finished_reason", "model_name"],
        )
        for reason in ("stop", "length"):
            success.add_metric(
                ["0", reason, e.model_name], st.finished_by_reason.get(reason, 0), created=self.created
            )
        success.add_metric(["0", "abort", e.model_name], st.aborted, created=self.created)
        yield success
        for name, doc, hist in (
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", st.prompt_hist),
            ("vllm:request_generation_tokens", "Number of generation tokens processed.", st.generation_hist),
            (
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                st.iteration_tokens,
            ),
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", st.ttft),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", st.e2e),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                st.queue,
            ),
            (
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                st.prefill_time,
            ),
            (
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                st.decode_time,
            ),
            (
                "vllm:request_num_preemptions",
                "Histogram of the number of times a request was preempted.",
                st.request_preemptions,
            ),
            (
                "vllm:request_prefill_kv_computed_tokens",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                st.prefill_kv_computed,
            ),
        ):
            yield self._histogram(name, doc, hist)
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[
                "block_size",
                "cache_dtype",
                "enable_prefix_caching",
                "engine",
                "gpu_memory_utilization",
                "kv_cache_size_tokens",
                "num_cpu_blocks",
                "num_gpu_blocks",
                "prefix_caching_hash_algo",
            ],
        )
        info.add_metric(
            [
                str(cfg.block_size),
                "auto",
                "True",
                "0",
                "0.9",
                str(cfg.kv_cache_size_tokens),
                str(cfg.offload_blocks) if cfg.offload_blocks else "None",
                str(cfg.num_blocks),
                "sha256",
            ],
            1.0,
        )
        yield info
        # ground truth the vLLM families cannot show
        yield self._gauge("sim:num_blocks", "Blocks in the KV pool.", pool.num_blocks)
        yield self._gauge("sim:free_blocks", "Free blocks (the queue), cached or not.", pool.num_free())
        yield self._gauge(
            "sim:cached_free_blocks",
            "Free blocks that still hold a cached prefix (counted as free by kv_cache_usage_perc).",
            pool.num_cached_free(),
        )
        yield self._gauge(
            "sim:cached_blocks", "Blocks holding a cached prefix, in use or free.", pool.num_cached()
        )
        yield self._gauge(
            "sim:kv_resident_perc",
            "Fraction of the pool holding KV (in use or cached): what kv_cache_usage_perc is not.",
            1.0 - (pool.num_free() - pool.num_cached_free()) / pool.num_blocks,
        )
        yield self._counter(
            "sim:evicted_blocks", "Cached blocks evicted (key dropped) by allocation.", pool.evictions()
        )
        yield self._counter("sim:cache_flushes", "Prefix-cache flushes (with preemption).", st.flushes)
        yield self._counter("sim:engine_steps", "Scheduler iterations.", st.steps)
        yield self._counter("sim:busy_seconds", "Simulated seconds the engine spent stepping.", st.busy_s)
        yield self._gauge("sim:time_seconds", "The engine's simulated clock.", e.now)
        if self.extra is not None:
            for key, value in self.extra().items():
                yield self._gauge(f"sim:{key}", f"Simulator ground truth: {key}.", value)


def engine_registry(
    engine: Engine,
    created: float,
    extra: Callable[[], dict[str, float]] | None = None,
    time_scale: float = 1.0,
) -> CollectorRegistry:
    """``time_scale``: simulated seconds per wall second (the server's ``speed``); see the module doc."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, created, extra, time_scale))
    return registry
