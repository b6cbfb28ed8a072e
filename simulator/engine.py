"""The simulated engine: vLLM V1's scheduler loop over the KV block pool, with a step-cost model.

One implementation, stepped by the live server in scaled real time and by the
offline runs as fast as it goes. The clock is the engine's own ``now``
(seconds of simulated time); callers add requests stamped with their arrival
time and call ``run_until(t)``.

Scheduler (``_step``), as vLLM V1's ``Scheduler.schedule``:

* Running requests first, in admission order, each getting its remaining
  tokens up to the step's token budget (chunked prefill). When the pool
  cannot supply a block, the most recently admitted running request is
  preempted (blocks freed, progress reset, put at the front of the waiting
  queue) until the allocation fits; a request that preempts itself ends the
  running pass.
* Then, only if nothing was preempted in this step, waiting requests in order
  while budget and ``max_num_seqs`` allow: prefix lookup (longest cached run,
  capped at ``num_tokens - 1``), allocation; the first that does not fit stops
  admission (waiting requests never preempt).
* Step time = ``T0 + sum_prefill n*(alpha + beta*(s + n/2)) + sum_decode gamma*ctx``.

Fast mode: after a step in which every scheduled request decoded and no
waiting request could be admitted, nothing changes until a request finishes,
a block runs out, or something is added, so the next ``k`` decode steps are
applied in closed form (decode fast-forward). Exact mode steps one iteration at
a time; tests check both give the same hits, evictions and timings.

Prefix-cache statistics follow vLLM: queries and hits in tokens, counted when
a request is admitted (again after each preemption, so recomputed tokens count
as hits). ``cached_tokens`` reported to the client is the first admission's.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import math
from collections import deque
from dataclasses import dataclass, field

from simulator.config import CostModel, EngineConfig
from simulator.content import Content
from simulator.pool import make_pool

log = logging.getLogger(__name__)

WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"
ABORTED = "aborted"

# vLLM 0.33's bucket boundaries for the histograms we export
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (0, 1, 2, 5, 10, 20)


class RequestTooLong(ValueError):
    """A request needs more KV blocks than the whole pool; it could never be scheduled."""


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.n += times

    def cumulative(self) -> list[tuple[str, int]]:
        out = []
        acc = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((repr(float(bound)), acc))
        out.append(("+Inf", self.n))
        return out


@dataclass
class EngineStats:
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    prompt_tokens: int = 0
    prompt_computed: int = 0
    prompt_cached: int = 0
    prompt_offloaded: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    aborted: int = 0
    steps: int = 0
    busy_s: float = 0.0
    flushes: int = 0
    finished_by_reason: dict[str, int] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    prefill_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    decode_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    prompt_hist: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    generation_hist: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    prefill_kv_computed: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_BUCKETS))
    request_preemptions: Histogram = field(default_factory=lambda: Histogram(PREEMPTION_BUCKETS))


@dataclass(eq=False)
class Request:
    """One completion request inside the engine."""

    id: str
    content: Content
    prompt_tokens: int
    max_tokens: int
    arrival: float
    session: str | None = None
    tag: object = None  # caller's data (the offline driver's turn, the server's waiter)
    num_computed: int = 0
    output: int = 0
    status: str = WAITING
    table: object = None
    cached_tokens: int | None = None
    first_scheduled: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    preemptions: int = 0
    computed_prefill: int = 0
    finish_reason: str = "length"  # what the client is told when max_tokens is reached

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.output


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Engine:
    """vLLM V1-like engine over a block pool; see the module doc."""

    def __init__(self, config: EngineConfig | None = None, cost: CostModel | None = None,
                 model_name: str = "sim/agent-8b", start: float = 0.0) -> None:
        self.config = config or EngineConfig()
        self.cost = cost or CostModel()
        self.model_name = model_name
        self.block_size = self.config.block_size
        self.pool = make_pool(self.config.mode, self.config.num_blocks, self.block_size,
                              self.config.offload_blocks)
        self.fast = self.config.mode == "fast"
        self.now = start
        self.start = start
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = EngineStats()
        self._stationary = False
        self.last_step_dt = 0.0

    # ------------------------------------------------------------------ inputs
    def add_request(self, req: Request) -> None:
        if cdiv(req.prompt_tokens + req.max_tokens, self.block_size) > self.pool.num_blocks:
            raise RequestTooLong(
                f"request {req.id} needs up to {req.prompt_tokens + req.max_tokens} tokens of KV "
                f"({req.prompt_tokens} prompt + {req.max_tokens} max_tokens); the pool holds "
                f"{self.pool.num_blocks * self.block_size}: lower max_tokens or raise the pool size")
        req.table = self.pool.new_table()
        req.status = WAITING
        self.waiting.append(req)
        self._stationary = False

    def abort(self, req: Request) -> None:
        """Drop a request (client went away); its blocks are freed like a finished request's."""
        if req.status == RUNNING:
            self.running.remove(req)
            self.pool.free(req.table)
        elif req.status == WAITING:
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        else:
            return
        req.status = ABORTED
        req.finish_time = self.now
        self.stats.aborted += 1
        self._stationary = False

    def flush(self) -> int:
        """Reset the prefix cache, first preempting every running request (their work is recomputed)."""
        n = 0
        while self.running:
            self._preempt(self.running.pop())
            n += 1
        ok = self.pool.reset()
        assert ok, "every block is free after preempting all running requests"
        self.stats.flushes += 1
        self._stationary = False
        return n

    # ----------------------------------------------------------------- queries
    @property
    def kv_usage(self) -> float:
        return 1.0 - self.pool.num_free() / self.pool.num_blocks

    def idle(self) -> bool:
        return not self.running and not self.waiting

    # -------------------------------------------------------------- the loop
    def run_until(self, t_limit: float) -> list[Request]:
        """Step until ``now >= t_limit`` or a step finishes requests; returns those requests.

        A step that starts before ``t_limit`` runs to its end, so ``now`` may pass ``t_limit``.
        """
        while self.now < t_limit:
            if not self.running and not self.waiting:
                self.now = t_limit
                break
            if self._stationary and self.fast and self._fast_forward(t_limit):
                continue
            finished = self._step()
            if finished:
                return finished
        return []

    def _preempt(self, req: Request) -> None:
        self.pool.free(req.table)
        req.num_computed = 0
        req.status = WAITING
        req.preemptions += 1
        self.waiting.appendleft(req)
        self.stats.preemptions += 1

    def _step(self) -> list[Request]:
        cfg = self.config
        pool = self.pool
        bs = self.block_size
        cost = self.cost
        budget = cfg.max_num_batched_tokens
        running = self.running
        scheduled: list[tuple[Request, int]] = []
        dt = cost.step_overhead_s
        preempted = False
        all_decode = True
        i = 0
        gamma = cost.decode_per_ctx_token_s
        n_running = len(running)
        while i < n_running and budget > 0:
            req = running[i]
            num_tokens = req.prompt_tokens + req.output
            nc = req.num_computed
            n_new = num_tokens - nc
            if n_new > budget:
                n_new = budget
            end = nc + n_new
            table = req.table
            # the pool is only involved when the step needs a new block or fills one
            if end > table.num_blocks * bs or end // bs > table.keyed:
                total = -(-end // bs)
                ok = True
                while not pool.allocate(table, req.content, None, total, end // bs):
                    victim = running.pop()
                    n_running -= 1
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        ok = False
                        break
                if not ok:
                    break
            scheduled.append((req, n_new))
            budget -= n_new
            if n_new == 1 and req.output > 0:
                dt += gamma * num_tokens
            else:
                all_decode = False
                dt += cost.prefill_time(nc, n_new)
            i += 1

        admitted = False
        waiting_blocked = bool(self.waiting)
        if not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                req = waiting[0]
                num_tokens = req.prompt_tokens + req.output
                hit = pool.lookup(req.content, (num_tokens - 1) // bs)
                hit_tokens = hit.hit_blocks * bs
                load_tokens = hit.offload_blocks * bs
                computed = hit_tokens + load_tokens
                n_new = min(num_tokens - computed, budget)
                end = computed + n_new
                total = cdiv(end, bs)
                need = total - hit.hit_blocks
                available = pool.num_free() - hit.hit_free_blocks
                if cfg.full_sequence_fit:
                    full = cdiv(req.prompt_tokens + req.max_tokens, bs) - hit.hit_blocks
                    if full > available:
                        break
                if cfg.watermark > 0 and available - need < cfg.watermark * pool.num_blocks:
                    break
                if not pool.allocate(req.table, req.content, hit, total, end // bs):
                    break
                waiting.popleft()
                running.append(req)
                req.status = RUNNING
                admitted = True
                st = self.stats
                st.prefix_queries += num_tokens
                st.prefix_hits += hit_tokens
                if load_tokens:
                    st.external_queries += num_tokens - hit_tokens
                    st.external_hits += load_tokens
                if req.cached_tokens is None:
                    req.cached_tokens = computed
                    req.first_scheduled = self.now
                    st.prompt_cached += min(hit_tokens, req.prompt_tokens)
                    st.prompt_offloaded += min(load_tokens, req.prompt_tokens)
                req.num_computed = computed
                scheduled.append((req, n_new))
                budget -= n_new
                all_decode = False
                dt += cost.prefill_time(computed, n_new) + load_tokens * cost.offload_load_per_token_s
            waiting_blocked = bool(waiting)

        if not scheduled:
            # nothing can run until something external happens (cannot occur with a sane pool)
            self._stationary = True
            self.now += cost.step_overhead_s
            return []

        self.now += dt
        self.last_step_dt = dt
        st = self.stats
        st.steps += 1
        st.busy_s += dt
        h = st.iteration_tokens
        v = cfg.max_num_batched_tokens - budget
        h.counts[bisect.bisect_left(h.bounds, v)] += 1
        h.total += v
        h.n += 1
        now = self.now
        finished: list[Request] = []
        generated = 0
        for req, n in scheduled:
            nc = req.num_computed + n
            req.num_computed = nc
            out = req.output
            if out == 0 and nc > req.computed_prefill:
                req.computed_prefill = nc
            if nc >= req.prompt_tokens + out:
                out += 1
                req.output = out
                generated += 1
                if req.first_token_time is None:
                    req.first_token_time = now
                    self._record_first_token(req)
                if out >= req.max_tokens:
                    finished.append(req)
        st.generation_tokens += generated
        for req in finished:
            self._finish(req)
        self._stationary = (all_decode and not admitted and not finished and not preempted
                            and (waiting_blocked or not self.waiting))
        return finished

    def _record_first_token(self, req: Request) -> None:
        st = self.stats
        st.prompt_tokens += req.prompt_tokens
        cached = min(req.cached_tokens or 0, req.prompt_tokens)
        st.prompt_computed += req.prompt_tokens - cached
        st.ttft.observe(req.first_token_time - req.arrival)
        st.prefill_kv_computed.observe(req.prompt_tokens - cached)
        st.prompt_hist.observe(req.prompt_tokens)
        if req.first_scheduled is not None:
            st.prefill_time.observe(req.first_token_time - req.first_scheduled)

    def _finish(self, req: Request) -> None:
        self.running.remove(req)
        self.pool.free(req.table)
        req.status = FINISHED
        req.finish_time = self.now
        st = self.stats
        st.finished += 1
        st.finished_by_reason[req.finish_reason] = st.finished_by_reason.get(req.finish_reason, 0) + 1
        st.e2e.observe(self.now - req.arrival)
        if req.first_scheduled is not None:
            st.queue.observe(req.first_scheduled - req.arrival)
        if req.first_token_time is not None:
            st.decode_time.observe(self.now - req.first_token_time)
        st.generation_hist.observe(req.output)
        st.request_preemptions.observe(req.preemptions)

    # ------------------------------------------------------------ fast-forward
    def _fast_forward(self, t_limit: float) -> bool:
        """Apply ``k >= 1`` pure-decode steps in closed form; False when none can be (then step)."""
        running = self.running
        if not running:
            return False
        bs = self.block_size
        cost = self.cost
        B = len(running)
        k = min(r.max_tokens - r.output for r in running) - 1  # the finishing step runs normally
        if k <= 0:
            return False
        # steps that start before t_limit: t_j = now + j*T0 + g*(j*C + B*j*(j-1)/2) < t_limit
        t0 = cost.step_overhead_s
        g = cost.decode_per_ctx_token_s
        C = sum(r.num_computed + 1 for r in running)
        k = min(k, self._steps_before(t_limit - self.now, t0, g, C, B))
        if k <= 0:
            return False
        # blocks: all k steps must fit in the free queue (no preemption in the window)
        free = self.pool.num_free()

        def blocks_needed(steps: int) -> int:
            return sum(cdiv(r.num_computed + steps, bs) - r.table.num_blocks for r in running)

        if blocks_needed(k) > free:
            lo, hi = 0, k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if blocks_needed(mid) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
            if k <= 0:
                return False
        pool = self.pool
        for r in running:
            end = r.num_computed + k
            table = r.table
            if end > table.num_blocks * bs or end // bs > table.keyed:
                ok = pool.allocate(table, r.content, None, cdiv(end, bs), end // bs)
                assert ok
            r.num_computed = end
            r.output += k
        dt = k * t0 + g * (k * C + B * k * (k - 1) / 2)
        self.now += dt
        st = self.stats
        st.steps += k
        st.busy_s += dt
        st.generation_tokens += B * k
        st.iteration_tokens.observe(B, k)
        self.last_step_dt = t0 + g * (C + B * (k - 1))
        return True

    @staticmethod
    def _steps_before(horizon: float, t0: float, g: float, C: int, B: int) -> int:
        """Number of steps j >= 0 whose start offset j*t0 + g*(j*C + B*j*(j-1)/2) is < horizon."""
        if horizon <= 0:
            return 0
        a = g * B / 2
        b = t0 + g * C - g * B / 2
        if a > 0:
            j = int((-b + math.sqrt(b * b + 4 * a * horizon)) / (2 * a))
        else:
            j = int(horizon / b) if b > 0 else 1 << 30

        def offset(n: int) -> float:
            return n * t0 + g * (n * C + B * n * (n - 1) / 2)

        while j > 0 and offset(j) >= horizon:
            j -= 1
        while offset(j + 1) < horizon:
            j += 1
        return j + 1
