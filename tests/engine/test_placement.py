"""realengine serve --cpus / --nice (realengine/serve.py place_engine): what the table's engine was measured with."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from realengine.serve import parse_cpus, place_engine
from tests.support import PYTHON, REPO


def test_cpu_lists_parse_as_taskset_takes_them():
    assert parse_cpus("0") == {0}
    assert parse_cpus("0-2,5") == {0, 1, 2, 5}
    with pytest.raises(ValueError, match="--cpus 'a-b'"):
        parse_cpus("a-b")


def test_nothing_asked_nothing_done():
    assert place_engine(None, None) == []


def test_pinning_and_nice_reach_the_process_and_its_own_autogroup():
    cpu = min(os.sched_getaffinity(0))
    code = (
        "import json, os; from pathlib import Path; from realengine.serve import place_engine; "
        f"done = place_engine('{cpu}', 19); "
        "ag = Path('/proc/self/autogroup'); "
        "print(json.dumps({'done': done, 'cpus': sorted(os.sched_getaffinity(0)), "
        "'nice': os.getpriority(os.PRIO_PROCESS, 0), 'sid': os.getsid(0) == os.getpid(), "
        "'autogroup': ag.read_text() if ag.exists() else None}))"
    )
    out = subprocess.run(
        [PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(out.stdout)
    assert got["cpus"] == [cpu] and got["nice"] == 19 and got["sid"]  # its own session, so its own autogroup
    assert f"pinned to CPUs [{cpu}]" in got["done"] and "nice 19" in got["done"]
    if got["autogroup"] is not None:
        assert got["autogroup"].strip().endswith("nice 19")
