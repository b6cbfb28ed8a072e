"""The collectors against the project's real simulator and sidecar processes (not fakes)."""

from __future__ import annotations

import subprocess

import httpx
import pytest
from sqlalchemy import select

from core import signals as sig
from db import make_engine, queries
from db.models import Series, Target
from tests.support import PYTHON, REPO, simulator_and_sidecar


def test_collectors_read_the_simulator_and_the_sidecar(tmp_path):
    with simulator_and_sidecar(tmp_path, engine_args=("--pool-tokens", "400000")) as (
        engine_url,
        sidecar_url,
    ):
        model = httpx.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0]["id"]
        prompt = "You are a careful assistant. " * 40
        for turn in range(3):
            prompt += f" Turn {turn}: please continue the analysis of the logs."
            r = httpx.post(
                f"{sidecar_url}/v1/completions",
                headers={"X-Session-Id": "it-1"},
                timeout=60,
                json={"model": model, "prompt": prompt, "max_tokens": 8},
            )
            assert r.status_code == 200, r.text
        db_url = f"sqlite:///{tmp_path / 'prefixops.db'}"
        done = subprocess.run(
            [
                PYTHON,
                "-m",
                "collectors",
                "--engine",
                engine_url,
                "--sidecar",
                sidecar_url,
                "--once",
                "--database-url",
                db_url,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        # The real sidecar's documents match its typed wire contracts (sidecar/wire.py) as read.
        assert "does not match sidecar.wire" not in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "out of range" not in done.stderr, done.stderr
        state = httpx.get(f"{sidecar_url}/state", timeout=10).json()
    db = make_engine(db_url)
    with db.connect() as conn:
        targets = {t["url"]: t for t in queries.targets(conn)}
        assert targets[engine_url]["up"] and targets[engine_url]["kind"] == "vllm"
        assert targets[sidecar_url]["up"] and targets[sidecar_url]["kind"] == "sidecar"
        latest = {(r["url"], r["engine"]): r for r in queries.latest_signals(conn)}
        labels = [e for (u, e) in latest if u == engine_url and e is not None]
        assert labels, "the simulator's engine label is kept"
        engine_row = latest[(engine_url, labels[0])]
        assert engine_row[sig.POOL_TOKENS] == 400000
        assert 0.0 <= engine_row[sig.KV_USAGE] <= 1.0
        sidecar_row = latest[(sidecar_url, None)]
        assert sidecar_row[sig.TOKEN_WEIGHTED] == pytest.approx(state["reuse"]["token_weighted"], abs=1e-9)
        assert sidecar_row[sig.SESSIONS_IN_SYSTEM] >= 0
        sessions = queries.sessions(conn, present_only=False)
        assert "it-1" in {s["session_id"] for s in sessions}
        assert queries.sidecar_state(conn)[0]["state"]["reuse"]["window_s"] == state["reuse"]["window_s"]
        names = set(
            conn.execute(
                select(Series.signal)
                .join(Target, Target.id == Series.target_id)
                .where(Target.url == sidecar_url)
            ).scalars()
        )
    assert {sig.TOKEN_WEIGHTED, sig.REQUEST_WEIGHTED, sig.DIVERGENCE, sig.DEMAND_TOKENS, sig.PARKED} <= names


def test_incremental_sessions_against_the_real_sidecar(tmp_path, caplog, monkeypatch):
    """Pages, `next` cursors and `updated_after` as the real sidecar implements them (pages of 2)."""
    import logging

    from collectors.config import SidecarTarget
    from collectors.scrape_sidecar import SidecarScraper

    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(SidecarScraper, "PAGE", 2)
    with (
        simulator_and_sidecar(tmp_path, engine_args=("--pool-tokens", "400000")) as (engine_url, sidecar_url),
        httpx.Client() as client,
    ):
        model = client.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0]["id"]

        def turn(session: str) -> None:
            r = client.post(
                f"{sidecar_url}/v1/completions",
                headers={"X-Session-Id": session},
                timeout=60,
                json={"model": model, "prompt": f"{session}: summarise the logs. " * 20, "max_tokens": 4},
            )
            assert r.status_code == 200, r.text

        for i in range(5):
            turn(f"s-{i}")
        scraper = SidecarScraper(
            SidecarTarget(sidecar_url), interval_s=1.0, timeout_s=5.0, max_page_bytes=10**7
        )
        first = scraper.scrape(client)
        assert first.ok, first.error
        assert first.sessions_full and sorted(s["session_id"] for s in first.sessions) == [
            f"s-{i}" for i in range(5)
        ]
        scraper.commit(first)
        second = scraper.scrape(client)
        assert second.ok and not second.sessions_full and second.sessions == []
        scraper.commit(second)
        turn("s-3")
        third = scraper.scrape(client)
        assert [s["session_id"] for s in third.sessions] == ["s-3"] and third.sessions[0]["turns"] == 2
    assert not [r for r in caplog.records if "sidecar.wire" in r.getMessage()], caplog.text
