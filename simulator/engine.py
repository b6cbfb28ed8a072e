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

from simulator.config import CostModel, EngineConfig
from simulator.engine_stats import EngineStats, Histogram
from simulator.pool import make_pool
from simulator.request import ABORTED, FINISHED, RUNNING, WAITING, Request, RequestTooLong, cdiv
from simulator.truth import Watch

__all__ = [
    "ABORTED",
    "FINISHED",
    "RUNNING",
    "WAITING",
    "Engine",
    "EngineStats",
    "Histogram",
    "Request",
    "RequestTooLong",
    "cdiv",
]

log = logging.getLogger(__name__)


class Engine:
    """vLLM V1-like engine over a block pool; see the module doc."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        cost: CostModel | None = None,
        model_name: str = "sim/agent-8b",
        start: float = 0.0,
    ) -> None:
        self.config = config or EngineConfig()
        self.cost = cost or CostModel()
        self.model_name = model_name
        self.block_size = self.config.block_size
        self.pool = make_pool(
            self.config.mode, self.config.num_blocks, self.block_size, self.config.offload_blocks
        )
        self.fast = self.config.mode == "fast"
        self.now = start
        self.start = start
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = EngineStats()
        self._stationary = False
        self.last_step_dt = 0.0
        self.watch: Watch | None = None

    def set_watch(self, watch: Watch | None) -> None:
        """Record why missing blocks were missing (``simulator.truth``); None stops recording."""
        self.watch = watch
        self.pool.watch = watch
        if watch is not None:
            watch.block_size = self.block_size

    # ------------------------------------------------------------------ inputs
    def check_request(self, req: Request) -> None:
        """Raise ``RequestTooLong`` when ``req`` could never fit the pool (``add_request`` checks it too)."""
        if cdiv(req.prompt_tokens + req.max_tokens, self.block_size) > self.pool.num_blocks:
            raise RequestTooLong(
                f"request {req.id} needs up to {req.prompt_tokens + req.max_tokens} tokens of KV "
                f"({req.prompt_tokens} prompt + {req.max_tokens} max_tokens); the pool holds "
                f"{self.pool.num_blocks * self.block_size}: lower max_tokens or raise the pool size"
            )

    def add_request(self, req: Request) -> None:
        self.check_request(req)
        req.table = self.pool.new_table()
        req.status = WAITING
        self.waiting.append(req)
        self._stationary = False

    def abort(self, req: Request) -> None:
        """Drop a request (client went away); its blocks are freed like a finished request's."""
        if req.status == RUNNING:
            self.running.remove(req)
            if self.watch is not None:
                self.watch.stopped(req.content, req.num_computed)
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
        if self.watch is not None:
            self.watch.stopped(req.content, req.num_computed)
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
            watch = self.watch
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
                truth = None
                if watch is not None and req.cached_tokens is None:
                    truth = watch.lookup(req, computed)
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
                    if watch is not None:
                        watch.admitted(req, truth)
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
        self._stationary = (
            all_decode
            and not admitted
            and not finished
            and not preempted
            and (waiting_blocked or not self.waiting)
        )
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
        if self.watch is not None:
            self.watch.stopped(req.content, req.num_computed)
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
