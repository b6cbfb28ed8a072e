"""Validated settings of the simulated engine, its cost model and the workloads.

Every field can be set from the command line with ``--set key=value`` (see
``apply_overrides``); a key names a field of exactly one of the config classes
below. Invalid values raise ``SimConfigError`` with the field and the value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any

from core.budgeter import BudgeterConfig
from core.compaction import CompactionPolicy, WarmthConfig
from core.reuse import RegimeConfig

# Policy defaults come from the core configs (one source); the simulator restates none of them.
_BUDGETER = BudgeterConfig()
_REGIME = RegimeConfig()
_WARMTH = WarmthConfig()
_COMPACTION = CompactionPolicy()


class SimConfigError(ValueError):
    """A simulator setting is invalid or unknown; the message names the key and the value."""


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise SimConfigError(message)


@dataclass(frozen=True)
class CostModel:
    """Step time ``t = T0 + sum_prefill n*(alpha + beta*(s + n/2)) + sum_decode gamma*ctx`` (seconds).

    Fitted to the published 0.15 s (1K tokens on a 20.6K cached prefix) and
    2.0 s (21.6K-token miss) prefill figures; see SIMULATOR.md.
    """

    step_overhead_s: float = 0.006  # T0
    prefill_per_token_s: float = 32.4e-6  # alpha
    prefill_attention_s: float = 5.57e-9  # beta, per token^2
    decode_per_ctx_token_s: float = 37e-9  # gamma
    offload_load_per_token_s: float = 2e-6  # CPU tier -> GPU, per token loaded

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            _check(
                math.isfinite(value) and value >= 0, f"{f.name} must be a finite number >= 0, got {value!r}"
            )

    def prefill_time(self, start: int, n: int) -> float:
        return n * (self.prefill_per_token_s + self.prefill_attention_s * (start + n / 2))


@dataclass(frozen=True)
class EngineConfig:
    """The engine: block pool, scheduler limits and admission guards (vLLM V1 names where they exist)."""

    pool_tokens: int = 400_000
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    # Admission guards (off in vLLM V1 by default): require the whole sequence
    # (prompt + max output) to fit at admission; keep this fraction of blocks free.
    full_sequence_fit: bool = False
    watermark: float = 0.0
    # Optional CPU offload tier, in tokens (0 = off): evicted cached blocks move
    # there (LRU) and a hit on them costs a load instead of a recompute.
    offload_tokens: int = 0
    # "fast" (decode fast-forward, run-length pool) or "exact" (per-step, per-block).
    mode: str = "fast"

    def __post_init__(self) -> None:
        _check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size!r}")
        _check(
            self.pool_tokens >= self.block_size * 4,
            f"pool_tokens must hold at least 4 blocks ({self.block_size * 4}), got {self.pool_tokens!r}",
        )
        _check(
            self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens!r}",
        )
        _check(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs!r}")
        _check(0.0 <= self.watermark < 1.0, f"watermark must be in [0, 1), got {self.watermark!r}")
        _check(self.offload_tokens >= 0, f"offload_tokens must be >= 0, got {self.offload_tokens!r}")
        _check(self.mode in ("fast", "exact"), f"mode must be 'fast' or 'exact', got {self.mode!r}")

    @property
    def num_blocks(self) -> int:
        return self.pool_tokens // self.block_size

    @property
    def kv_cache_size_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def offload_blocks(self) -> int:
        return self.offload_tokens // self.block_size


@dataclass(frozen=True)
class AgentWorkload:
    """Closed-loop agent sessions (SIMULATOR.md's agent preset)."""

    arrival_rate: float = 0.035  # sessions/s, Poisson
    burst_rate: float = 0.0  # extra sessions/s during the burst window (0.1 in agent-burst)
    burst_start_min: float = 5.0
    burst_minutes: float = 5.0
    # "uniform": burst_rate * window extra sessions, one in each equal slot of the window (a known,
    # operator-visible event of fixed size); "poisson": a Poisson number of them (adds variance)
    burst_process: str = "uniform"
    turns: int = 40  # calibrated (SIMULATOR.md: 36): see docs/simulator-results.md
    system_prompt_tokens: int = 2000
    initial_context: int = (
        6600  # first turn's prompt, system prompt included; calibrated (SIMULATOR.md: 4.6K)
    )
    context_growth: int = (
        800  # prompt growth per turn (previous output + new tool/user text); calibrated (1K)
    )
    output_tokens: int = 150  # calibrated (SIMULATOR.md: 200): see docs/simulator-results.md
    tool_latency_mean: float = (
        1.5  # s, lognormal; calibrated (SIMULATOR.md: ~3 s): see docs/simulator-results.md
    )
    tool_latency_sigma: float = 0.5  # of the underlying normal
    output_budget: int = (
        _BUDGETER.default_output_budget
    )  # what the client declares (max_tokens) to the budgeter
    flush_at_min: float = -1.0  # prefix-cache flush with preemption at this minute (< 0: none)

    def __post_init__(self) -> None:
        _check(self.arrival_rate >= 0, f"arrival_rate must be >= 0, got {self.arrival_rate!r}")
        _check(self.burst_rate >= 0, f"burst_rate must be >= 0, got {self.burst_rate!r}")
        _check(self.burst_minutes >= 0, f"burst_minutes must be >= 0, got {self.burst_minutes!r}")
        _check(self.turns >= 1, f"turns must be >= 1, got {self.turns!r}")
        _check(
            self.burst_process in ("poisson", "uniform"),
            f"burst_process must be poisson or uniform, got {self.burst_process!r}",
        )
        _check(self.output_tokens >= 1, f"output_tokens must be >= 1, got {self.output_tokens!r}")
        _check(
            self.initial_context > self.system_prompt_tokens >= 0,
            f"initial_context ({self.initial_context!r}) must exceed system_prompt_tokens "
            f"({self.system_prompt_tokens!r})",
        )
        _check(
            self.context_growth > self.output_tokens,
            f"context_growth ({self.context_growth!r}) must exceed output_tokens ({self.output_tokens!r}): "
            "each turn appends the previous answer plus new text",
        )
        _check(self.tool_latency_mean > 0, f"tool_latency_mean must be > 0, got {self.tool_latency_mean!r}")
        _check(
            self.tool_latency_sigma >= 0, f"tool_latency_sigma must be >= 0, got {self.tool_latency_sigma!r}"
        )


@dataclass(frozen=True)
class RagWorkload:
    """Retrieval traffic with shared document-set prefixes (subtrees), a storm, and a compaction job.

    Prefix tree: a short tenant preamble (``rag_head_tokens``) shared by all
    tenant traffic, the system prompt below it, then one of ``doc_sets``
    document sets (each a subtree ``rag-docs-N``), then a unique question. Storm
    queries share only the preamble and carry distinct retrievals. Cold
    requests share nothing. Compaction rewrites a document set: a new version
    of its tokens, so every cached block below the rewrite stops matching.
    """

    # The preset follows the published mechanism; the sweep that chose it is in docs/simulator-results.md
    # ("The RAG compaction storm"). Steady: document traffic only, R_t ~0.71 / R_r ~0.93.
    rag_rate: float = (
        0.5  # document-set requests/s, Poisson (open loop); 30 per minute keeps the regime judged
    )
    rag_head_tokens: int = 64
    rag_system_tokens: int = 1000  # preamble included
    doc_sets: int = 8  # a small set of document sets (subtrees)
    doc_tokens: int = 5000  # with the system prompt: the ~6K-token shared prefix
    doc_zipf: float = 2.6  # popularity skew over document sets: two hot ones, the rest rarely used
    suffix_tokens: int = 1700  # unique question + extra retrieved text
    cold_fraction: float = 0.06  # requests that share no prefix at all (other tenants)
    rag_output_tokens: int = 100
    storm_start_min: float = 10.0
    storm_minutes: float = 10.0
    storm_rate: float = 8.0  # extra storm requests/s: ~94% of the storm's requests, ~89% of its tokens
    storm_query_tokens: int = (
        2400  # a distinct retrieval (a few document chunks) + question below the preamble
    )
    storm_cold_fraction: float = 0.10
    storm_output_tokens: int = 30
    compaction_trigger: str = "naive"  # "naive" (every N requests), "gate" (core.compaction), "none"
    # requests between compaction jobs (naive: runs; gate: becomes due): ~17 minutes of steady traffic,
    # about a minute in the storm, whose requests count too
    compaction_every: int = 500
    compaction_check_s: float = 10.0  # gated job: how often it asks the gate about due subtrees
    gate_asks: str = "per-subtree"  # gated job: one gate request per due subtree, or "all-due" in one request
    warmth_window_s: float = _WARMTH.window_s
    warmth_floor: int = _WARMTH.floor
    top_k_pinned: int = _COMPACTION.top_k_pinned
    divergence_enter: float = _REGIME.enter
    divergence_exit: float = _REGIME.exit
    regime_min_turns: int = _REGIME.min_turns
    reuse_window_s: float = 60.0
    cached_price: float = 0.1  # price of a cached input token relative to an uncached one
    after_compaction_s: float = 15.0  # window after a compaction over which its damage is measured

    def __post_init__(self) -> None:
        _check(self.rag_rate >= 0, f"rag_rate must be >= 0, got {self.rag_rate!r}")
        _check(self.doc_sets >= 1, f"doc_sets must be >= 1, got {self.doc_sets!r}")
        _check(
            0 < self.rag_head_tokens < self.rag_system_tokens,
            f"rag_head_tokens ({self.rag_head_tokens!r}) must be in (0, rag_system_tokens)",
        )
        _check(0 <= self.cold_fraction <= 1, f"cold_fraction must be in [0, 1], got {self.cold_fraction!r}")
        _check(
            0 <= self.storm_cold_fraction <= 1,
            f"storm_cold_fraction must be in [0, 1], got {self.storm_cold_fraction!r}",
        )
        _check(
            self.compaction_trigger in ("naive", "gate", "none"),
            f"compaction_trigger must be naive, gate or none, got {self.compaction_trigger!r}",
        )
        _check(
            self.gate_asks in ("per-subtree", "all-due"),
            f"gate_asks must be per-subtree or all-due, got {self.gate_asks!r}",
        )
        _check(self.compaction_every >= 1, f"compaction_every must be >= 1, got {self.compaction_every!r}")
        _check(
            self.compaction_check_s > 0, f"compaction_check_s must be > 0, got {self.compaction_check_s!r}"
        )
        _check(0 <= self.cached_price <= 1, f"cached_price must be in [0, 1], got {self.cached_price!r}")


@dataclass(frozen=True)
class ControlConfig:
    """The sidecar's control as the simulator runs it (core.budgeter)."""

    control_start_min: float = 20.0
    low_band: float = _BUDGETER.low
    high_band: float = _BUDGETER.high
    session_cap: int = 13  # calibrated for the agent preset (core.budgeter.BudgeterConfig: 12)
    latency_limit_s: float = _BUDGETER.latency_limit_s

    def __post_init__(self) -> None:
        _check(self.control_start_min >= 0, f"control_start_min must be >= 0, got {self.control_start_min!r}")
        _check(
            0 < self.low_band < self.high_band <= 1,
            f"low band must be below high band, both in (0, 1], got {self.low_band!r} >= {self.high_band!r}",
        )


@dataclass(frozen=True)
class SimConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    cost: CostModel = field(default_factory=CostModel)
    agent: AgentWorkload = field(default_factory=AgentWorkload)
    rag: RagWorkload = field(default_factory=RagWorkload)
    control: ControlConfig = field(default_factory=ControlConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = ("engine", "cost", "agent", "rag", "control")


def settable_keys() -> dict[str, str]:
    """Every ``--set`` key mapped to the config section it belongs to."""
    result: dict[str, str] = {}
    base = SimConfig()
    for section in SECTIONS:
        for f in fields(getattr(base, section)):
            result[f.name] = section
    return result


def _coerce(key: str, raw: str, current: Any) -> Any:
    try:
        if isinstance(current, bool):
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if isinstance(current, int):
            value = float(raw)
            if not value.is_integer():
                raise ValueError(raw)
            return int(value)
        if isinstance(current, float):
            return float(raw)
    except ValueError:
        kind = type(current).__name__
        raise SimConfigError(f"--set {key}={raw!r}: expected a {kind}") from None
    return raw


def apply_overrides(config: SimConfig, overrides: dict[str, Any]) -> SimConfig:
    """``config`` with ``overrides`` (key -> str or value) applied and validated."""
    keys = settable_keys()
    changes: dict[str, dict[str, Any]] = {}
    for key, raw in overrides.items():
        section = keys.get(key)
        if section is None:
            raise SimConfigError(f"unknown setting {key!r}; settable keys: {', '.join(sorted(keys))}")
        current = getattr(getattr(config, section), key)
        value = _coerce(key, raw, current) if isinstance(raw, str) else raw
        changes.setdefault(section, {})[key] = value
    result = config
    for section, values in changes.items():
        try:
            result = dataclasses.replace(
                result, **{section: dataclasses.replace(getattr(result, section), **values)}
            )
        except TypeError as exc:
            raise SimConfigError(str(exc)) from None
    return result


def parse_set_args(items: list[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; a malformed item raises SimConfigError."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SimConfigError(f"--set expects key=value, got {item!r}")
        result[key.strip()] = value.strip()
    return result
