"""`python -m collectors` as a real process against fake targets on loopback: rows, status, reload, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from db import make_engine
from db.models import CollectorHeartbeat, Sample, Series, Target
from tests.collectors.fake_targets import FakeEngine, FakeSidecar
from tests.support import PYTHON, REPO, read_log, running, wait_for


def count_samples(db, url: str, signal_name: str) -> int:
    with db.connect() as conn:
        try:
            return conn.execute(
                select(func.count())
                .select_from(Sample)
                .join(Series, Series.id == Sample.series_id)
                .join(Target, Target.id == Series.target_id)
                .where(Target.url == url, Series.signal == signal_name)
            ).scalar()
        except OperationalError:
            return 0  # the collector is still creating the schema


def status_json(db_url: str) -> list[dict]:
    out = subprocess.run(
        [PYTHON, "-m", "collectors", "status", "--json", "--database-url", db_url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_collectors_process_scrapes_reloads_and_stops_cleanly(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'prefixops.db'}"
    with (
        FakeEngine() as engine,
        FakeSidecar() as sidecar,
        FakeEngine(queries_step=500, hits_step=100) as second,
    ):
        sidecar.viewer_token = "view-secret"
        config = tmp_path / "collectors.toml"
        config.write_text(
            f'[collector]\ninterval_s = 0.5\n\n[[engines]]\nurl = "{engine.url}"\nname = "e0"\n\n'
            f'[[sidecars]]\nurl = "{sidecar.url}"\nengine = "{engine.url}"\n'
            f'viewer_token = "view-secret"\n'
        )
        cmd = [
            PYTHON,
            "-m",
            "collectors",
            "--config",
            str(config),
            "--engine",
            "http://127.0.0.1:9",
            "--database-url",
            db_url,
        ]
        with running(cmd, name="collectors") as proc:
            db = make_engine(db_url)
            wait_for(lambda: count_samples(db, engine.url, "engine_hit_ratio") >= 2, what="engine rows")
            wait_for(lambda: count_samples(db, sidecar.url, "token_weighted") >= 2, what="sidecar rows")

            rows = {(r["target"], r["engine"]): r for r in status_json(db_url)}
            e0 = rows[(engine.url, "0")]
            assert e0["up"] and e0["kind"] == "vllm" and e0["token_weighted"] == pytest.approx(0.8)
            assert e0["kv_usage"] == pytest.approx(0.42) and e0["requests_running"] == 3
            assert e0["requests_waiting"] == 1 and e0["alerts"] == []
            side = rows[(sidecar.url, None)]
            assert side["up"] and side["kind"] == "sidecar" and side["token_weighted"] == pytest.approx(0.75)
            down = rows[("http://127.0.0.1:9", None)]
            assert down["up"] is False and "connection refused" in down["last_error"]

            # Edit the file: a new engine is picked up without a restart.
            config.write_text(config.read_text() + f'\n[[engines]]\nurl = "{second.url}"\nkind = "vllm"\n')
            wait_for(
                lambda: count_samples(db, second.url, "engine_hit_ratio") >= 1, what="reloaded target rows"
            )
            ratio = {(r["target"], r["engine"]): r for r in status_json(db_url)}[(second.url, "0")][
                "token_weighted"
            ]
            assert ratio == pytest.approx(0.2)

            with db.connect() as conn:
                beat = conn.execute(select(CollectorHeartbeat)).first()
            assert beat is not None
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
            log = read_log(proc)
        refused = [line for line in log.splitlines() if "127.0.0.1:9/metrics" in line]
        assert refused and all("connection refused" in line for line in refused)
        assert "Traceback" not in log
        # Failures of the same target are logged once, not every second.
        assert len(refused) <= 3, refused


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_once_exits_zero_with_a_down_target_and_keeps_history(tmp_path, backend, request):
    if backend == "sqlite":
        db_url = f"sqlite:///{tmp_path / 'once.db'}"
    else:
        from tests.db.pg import fresh_database

        db_url = fresh_database(request.getfixturevalue("postgres_server_url"))
    with FakeEngine() as engine:
        cmd = [
            PYTHON,
            "-m",
            "collectors",
            "--engine",
            engine.url,
            "--engine",
            "http://127.0.0.1:9",
            "--once",
            "--database-url",
            db_url,
        ]
        for _ in range(2):
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert "Traceback" not in done.stderr
    db = make_engine(db_url)
    # Two runs of two scrapes each: the second run upgraded and appended, nothing was lost.
    assert count_samples(db, engine.url, "kv_usage") == 4
    assert count_samples(db, engine.url, "engine_hit_ratio") == 2
    rows = {r["target"]: r for r in status_json(db_url)}
    assert rows[engine.url]["up"] and rows["http://127.0.0.1:9"]["up"] is False
    assert rows[engine.url]["token_weighted"] == pytest.approx(0.8)


def test_status_and_bad_arguments(tmp_path):
    missing = subprocess.run(
        [PYTHON, "-m", "collectors", "status", "--database-url", f"sqlite:///{tmp_path / 'nope.db'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "no database at" in missing.stderr
    bad = subprocess.run(
        [PYTHON, "-m", "collectors", "--engine", "localhost:8000", "--once"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "URL must be http" in bad.stderr and "Traceback" not in bad.stderr
    none = subprocess.run([PYTHON, "-m", "collectors", "--once"], cwd=REPO, capture_output=True, text=True)
    assert none.returncode == 2 and "no targets" in none.stderr


def test_slow_targets_do_not_delay_a_healthy_one(tmp_path):
    """80 targets that never answer in time (more than the shared pool's threads) and one healthy target.

    Counted relative to the slow targets' own scrapes, not against the clock: while each slow target
    completes 4 more (timed-out) scrapes, the healthy one, scraped every 0.5 s and answering at once,
    must complete clearly more (sharing one pool with them it would get about one per round).
    """
    rounds, n_slow = 4, 80
    db_url = f"sqlite:///{tmp_path / 'slow.db'}"
    with FakeEngine() as healthy, FakeEngine() as slow:
        slow.mode = "slow"
        slow.slow_s = 60.0
        config = tmp_path / "c.toml"
        config.write_text(
            "[collector]\ninterval_s = 0.5\ntimeout_s = 1.0\n\n"
            + "".join(f'[[engines]]\nurl = "{slow.url}/s{i}"\n\n' for i in range(n_slow))
            + f'[[engines]]\nurl = "{healthy.url}"\n'
        )
        cmd = [PYTHON, "-m", "collectors", "--config", str(config), "--database-url", db_url]
        with running(cmd, name="collectors"):
            db = make_engine(db_url)

            def slow_total() -> int:
                return sum(count_samples(db, f"{slow.url}/s{i}", "up") for i in range(n_slow))

            wait_for(lambda: slow_total() >= 2 * n_slow, what="every slow target failing", timeout=60)
            start, slow_start = count_samples(db, healthy.url, "up"), slow_total()
            wait_for(
                lambda: slow_total() >= slow_start + rounds * n_slow, what="more slow rounds", timeout=90
            )
            healthy_done = count_samples(db, healthy.url, "up") - start
        assert healthy_done >= 2 * rounds, healthy_done
        with db.connect() as conn:
            row = conn.execute(
                select(Target.up, Target.last_error).where(Target.url == f"{slow.url}/s0")
            ).one()
        assert not row.up and "timeout" in row.last_error
