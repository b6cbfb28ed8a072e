"""Issue 2's walking skeleton for real: simulator → sidecar → collectors → SQLite.

Starts the three as real processes on free loopback ports, drives closed-loop
sessions through the sidecar, and checks that the collectors stored the
sidecar's token-weighted hit rate exactly as the sidecar reports it, and the
engine's own counters-derived hit ratio beside it.
"""

import time

import httpx
import pytest
from sqlalchemy.exc import OperationalError

from db import make_engine
from db import queries as q
from tests.support import PYTHON, running, simulator_and_sidecar

pytestmark = pytest.mark.xdist_group("heavy")

SYSTEM = "You are a careful coding agent. Follow the repository conventions. " * 20


def drive_sessions(sidecar: str, sessions: int, turns: int) -> None:
    with httpx.Client(base_url=sidecar, timeout=60) as client:
        histories = {f"e2e-{i}": [{"role": "system", "content": SYSTEM}] for i in range(sessions)}
        for turn in range(turns):
            for sid, messages in histories.items():
                messages.append({"role": "user", "content": f"turn {turn} of {sid}: " + "read file. " * 40})
                response = client.post(
                    "/v1/chat/completions",
                    headers={"X-Session-Id": sid},
                    json={"model": "sim-model", "messages": messages, "max_tokens": 16},
                )
                assert response.status_code == 200, response.text
                answer = response.json()["choices"][0]["message"]["content"]
                messages.append({"role": "assistant", "content": answer})


def wait_until_scraped(tmp_path, db_url: str, url: str) -> None:
    deadline = time.monotonic() + 30
    while not (tmp_path / "prefixops.db").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    db = make_engine(db_url, read_only=True)
    while time.monotonic() < deadline:
        try:
            with db.connect() as conn:
                target = q.target_by_url(conn, url)
        except OperationalError:  # the collectors are still creating the schema
            target = None
        if target and target["up"]:
            return
        time.sleep(0.2)
    raise AssertionError(f"the collectors never scraped {url} successfully")


def test_collectors_store_the_sidecars_token_weighted_hit_rate(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'prefixops.db'}"
    with (
        simulator_and_sidecar(tmp_path, engine_args=("--speed", "50", "--model", "sim-model")) as (
            engine,
            sidecar,
        ),
        running(
            [PYTHON, "-m", "collectors", "--engine", engine, "--sidecar", sidecar, "--database-url", db_url],
            name="collectors",
        ),
    ):
        models = httpx.get(f"{sidecar}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["sim-model"]
        wait_until_scraped(tmp_path, db_url, engine)  # so the engine counters' baseline predates the traffic
        drive_sessions(sidecar, sessions=4, turns=5)
        state = httpx.get(f"{sidecar}/state", timeout=5).json()
        expected = state["reuse"]["token_weighted"]
        assert 0.3 < expected < 1.0  # later turns reuse their session's prefix
        assert {s["id"] for s in httpx.get(f"{sidecar}/sessions", timeout=5).json()} >= {
            f"e2e-{i}" for i in range(4)
        }

        db = make_engine(db_url, read_only=True)
        deadline = time.monotonic() + 20
        stored = None
        while time.monotonic() < deadline:
            with db.connect() as conn:
                target = q.target_by_url(conn, sidecar)
                latest = q.latest_value(conn, target["id"], "token_weighted") if target else None
                engine_target = q.target_by_url(conn, engine)
            if latest is not None and latest[1] == pytest.approx(expected, abs=1e-9) and engine_target:
                stored = latest
                break
            time.sleep(0.3)
        assert stored is not None, (
            f"no stored token_weighted equal to the sidecar's {expected} (last: {latest})"
        )
        assert engine_target["up"] and engine_target["kind"] == "vllm"
        # The engine's own counters saw the same traffic: its per-interval hit ratio rose with reuse.
        values: list[float] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (values and max(values) > 0.3):
            with db.connect() as conn:
                ratios = q.series_range(
                    conn,
                    signals="engine_hit_ratio",
                    start_ts=time.time() - 600,
                    end_ts=time.time(),
                    target_ids=[engine_target["id"]],
                    engine="0",
                )
            values = [v for series in ratios["series"] for v in series["value"] if v is not None]
            time.sleep(0.3)
        assert values and max(values) > 0.3 and all(0.0 <= v <= 1.0 for v in values), values
