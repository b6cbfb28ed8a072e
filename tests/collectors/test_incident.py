"""export-incident: a bundle of one engine's series, alerts, audit, turns and settings; nothing secret."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from collectors.__main__ import main
from collectors.incident import IncidentError, parse_time, read_bundle, scrub
from db import make_engine
from db.models import AuditEntry, Session, Target
from tests.dashboard.fill import COLLAPSE_AGO, filled_engine


@pytest.fixture
def filled(tmp_path: Path) -> tuple[str, float]:
    url = f"sqlite:///{tmp_path / 'filled.db'}"
    engine, now = filled_engine(url)
    engine.dispose()
    return url, now


def test_export_then_open_a_gzip_bundle(
    filled: tuple[str, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, now = filled
    engine = make_engine(url)
    with engine.begin() as conn:  # a secret that reached the audit must not reach the bundle
        conn.execute(
            insert(AuditEntry).values(
                source="dashboard",
                ts=now - COLLAPSE_AGO,
                actor="alice",
                action="webhook.add",
                params={"url": "http://hook", "headers": {"X-Key": "s3cret-1"}, "api_token": "s3cret-2"},
                data={},
            )
        )
        side = conn.execute(select(Target.id).where(Target.name == "a-sidecar")).scalar_one()
        conn.execute(  # a session that had left before the window
            insert(Session).values(
                target_id=side,
                session_id="gone-before",
                state="admitted",
                present=False,
                first_seen_ts=now - 7200,
                last_seen_ts=now - 7000,
                data={"output_budget": 64},
            )
        )
    engine.dispose()
    out = tmp_path / "incident.json.gz"
    start, end = now - COLLAPSE_AGO - 300, now - COLLAPSE_AGO + 900
    assert (
        main(
            [
                "export-incident",
                "--engine",
                "a",
                "--from",
                str(start),
                "--to",
                str(end),
                "--out",
                str(out),
                "--database-url",
                url,
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    raw = out.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    doc = read_bundle(out)
    assert doc["engine"] == "a" and doc["from"] == start and doc["to"] == end
    assert {t["role"] for t in doc["targets"]} == {"engine", "sidecar"}
    signals = {s["signal"] for s in doc["series"]}
    assert {"token_weighted", "demand_fraction", "kv_usage"} <= signals
    assert all(start <= ts <= end for s in doc["series"] for ts in s["ts"])
    assert {a["rule"] for a in doc["alerts"]} >= {"collapse", "thin-reuse"}
    assert "target-down" not in {a["rule"] for a in doc["alerts"]}  # engine c's
    assert doc["turns"] and all(start <= t["ts"] < end for t in doc["turns"])
    assert all(t["prompt_tokens"] > 0 and "cached_tokens" in t for t in doc["turns"])  # counts are no secrets
    assert doc["decisions"] and doc["settings"]["sidecars"]
    # the sessions engine a's sidecar saw in the window (fill: agent-i first seen at now - 3000 + 60 i),
    # with the output budget each client declared; none of engine b's
    first_seen = {s["session_id"]: s["first_seen_ts"] for s in doc["sessions"]}
    assert (
        len(first_seen) == sum(now - 3000 + 60 * i <= end for i in range(30))
        and "gone-before" not in first_seen
    )
    assert all(ts <= end for ts in first_seen.values()) and not any(k.startswith("rag-") for k in first_seen)
    assert {s["output_budget"] for s in doc["sessions"]} == {1024}
    text = gzip.decompress(raw).decode()
    assert "webhook.add" in text and "http://hook" in text and "s3cret" not in text


def test_rfc3339_times_plain_json_and_errors(
    filled: tuple[str, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, now = filled
    assert parse_time("2026-12-01T14:00:00Z", "--from") == parse_time("1796133600", "--from")
    with pytest.raises(IncidentError, match="--to"):
        parse_time("yesterday", "--to")
    with pytest.raises(IncidentError, match="time zone"):
        parse_time("2026-12-01T14:00:00", "--from")
    out = tmp_path / "b.json"
    assert (
        main(
            [
                "export-incident",
                "--engine",
                "a",
                "--from",
                "1970-01-01T00:00:00Z",
                "--to",
                str(now),
                "--out",
                str(out),
                "--database-url",
                url,
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["format"] == "prefixops-incident/1"
    assert (
        main(
            [
                "export-incident",
                "--engine",
                "zz",
                "--from",
                "0",
                "--to",
                "1",
                "--out",
                str(out),
                "--database-url",
                url,
            ]
        )
        == 2
    )
    assert "'zz' is not an engine" in capsys.readouterr().err


def test_scrub_drops_every_secret_key() -> None:
    doc = {
        "a": 1,
        "viewer_token": "x",
        "prompt_tokens": 5,
        "Token": "t",
        "nested": [{"Authorization": "Bearer y", "headers": {"X": "1"}, "password_hash": "z", "keep": 2}],
    }
    assert scrub(doc) == {"a": 1, "prompt_tokens": 5, "nested": [{"keep": 2}]}
