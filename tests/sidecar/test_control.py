"""Control API: auth, validation (nothing changes on a bad request), audit, compaction gate over HTTP."""

from __future__ import annotations

import datetime as dt
import hmac
import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

import sidecar.auth as sidecar_auth

from .conftest import OP_HEADERS, OPERATOR, VIEWER, settle, sidecar

pytestmark = pytest.mark.anyio

READS = ["/state", "/sessions", "/subtrees", "/compaction/decisions", "/audit"]


async def test_without_operator_token_the_sidecar_is_read_only(tmp_path: Path) -> None:
    async with sidecar(tmp_path, operator_token=None) as h:
        r = await h.client.put("/control/budgeter", json={"mode": "off"}, headers=OP_HEADERS)
        assert r.status_code == 403 and "read-only" in r.json()["error"]["message"]
        state = await h.state()
        assert state["read_only"] is True
        assert any("read-only" in w for w in state["warnings"])
        assert state["budgeter"]["mode"] == "budgeter-park"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": OPERATOR},
        {"Authorization": f"Basic {OPERATOR}"},
        {"Authorization": f"Bearer {VIEWER}"},
    ],
)
async def test_missing_or_wrong_token_is_401_and_nothing_changes(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    async with sidecar(tmp_path, viewer_token=VIEWER) as h:
        await h.chat("s1")
        calls = [
            ("PUT", "/control/budgeter", {"mode": "off"}),
            ("POST", "/control/sessions/s1/park", None),
            ("POST", "/control/sessions/s1/unpark", {"pin": True}),
            ("POST", "/control/compaction/defer", {"minutes": 5}),
            ("POST", "/control/compaction/allow", None),
        ]
        for method, path, body in calls:
            r = await h.client.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (path, r.text)
            assert r.headers["WWW-Authenticate"] == "Bearer"
        state = await h.state()
        assert state["budgeter"]["mode"] == "budgeter-park"
        assert state["compaction"]["deferred_until"] is None
        s1 = (await h.client.get("/sessions/s1", headers=OP_HEADERS)).json()
        assert s1["state"] == "admitted" and not s1["pinned"]
        assert (await h.client.get("/audit", headers=OP_HEADERS)).json() == []


async def test_tokens_are_compared_in_constant_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bytes] = []
    original = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append(b)
        return original(a, b)

    monkeypatch.setattr(sidecar_auth.hmac, "compare_digest", spy)
    async with sidecar(tmp_path) as h:
        await h.client.put(
            "/control/budgeter", json={"mode": "off"}, headers={"Authorization": "Bearer nope"}
        )
        assert OPERATOR.encode() in seen


async def test_viewer_token_guards_json_reads_but_not_metrics_or_healthz(tmp_path: Path) -> None:
    async with sidecar(tmp_path, viewer_token=VIEWER) as h:
        for path in READS:
            assert (await h.client.get(path)).status_code == 401, path
            assert (await h.client.get(path, headers={"Authorization": "Bearer x"})).status_code == 401, path
            assert (
                await h.client.get(path, headers={"Authorization": f"Bearer {VIEWER}"})
            ).status_code == 200
            assert (
                await h.client.get(path, headers={"Authorization": f"Bearer {OPERATOR}"})
            ).status_code == 200
        assert (await h.client.get("/metrics")).status_code == 200
        assert (await h.client.get("/healthz")).status_code == 200
        # the viewer token is not an operator token
        r = await h.client.put(
            "/control/budgeter", json={"mode": "off"}, headers={"Authorization": f"Bearer {VIEWER}"}
        )
        assert r.status_code == 401


async def test_reads_are_open_without_a_viewer_token(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        for path in READS:
            assert (await h.client.get(path)).status_code == 200, path


BAD_BUDGETER = [
    ({"low": float("nan")}, "low"),
    ({"low": "NaN"}, "low"),
    ({"high": float("inf")}, "high"),
    ({"high": "Infinity"}, "high"),
    ({"low": "0.5"}, "low"),
    ({"low": 0.0}, "low"),
    ({"low": -0.1}, "low"),
    ({"high": 1.01}, "high"),
    ({"low": 0.96}, "low"),
    ({"low": 0.5, "high": 0.4}, "low"),
    ({"mode": "yolo"}, "mode"),
    ({"mode": None, "colour": "red"}, "colour"),
    ({"low": True}, "low"),
    ({}, "body"),
]


@pytest.mark.parametrize(("body", "field"), BAD_BUDGETER)
async def test_invalid_budgeter_updates_are_4xx_naming_field_and_value(
    tmp_path: Path, body: dict[str, Any], field: str
) -> None:
    async with sidecar(tmp_path) as h:
        raw = json.dumps(body)  # json.dumps writes NaN / Infinity literals, as some clients do
        r = await h.client.put(
            "/control/budgeter", content=raw, headers={**OP_HEADERS, "Content-Type": "application/json"}
        )
        assert 400 <= r.status_code < 500, r.text
        err = r.json()["error"]
        assert err["param"] == field, err
        assert field in err["message"]
        if field not in ("body", "colour"):
            assert str(body[field])[:3].lower() in err["message"].lower()  # the offending value is named
        state = await h.state()
        assert (state["budgeter"]["mode"], state["budgeter"]["low"], state["budgeter"]["high"]) == (
            "budgeter-park",
            0.75,
            0.95,
        )
        assert (await h.client.get("/audit")).json() == []


async def test_partial_budgeter_updates_are_applied_and_audited(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        r = await h.client.put("/control/budgeter", json={"high": 0.9}, headers=OP_HEADERS)
        assert r.status_code == 200 and r.json()["budgeter"]["high"] == 0.9
        r = await h.client.put(
            "/control/budgeter",
            json={"mode": "session-cap-park", "low": 0.5},
            headers={**OP_HEADERS, "X-Actor": "bob"},
        )
        assert r.json()["budgeter"] == {
            "mode": "session-cap-park",
            "low": 0.5,
            "high": 0.9,
            "session_cap": 12,
            "latency_limit_s": 10.0,
        }
        state = await h.state()
        assert (state["budgeter"]["mode"], state["budgeter"]["low"], state["budgeter"]["high"]) == (
            "session-cap-park",
            0.5,
            0.9,
        )
        audit = (await h.client.get("/audit")).json()
        assert [a["id"] for a in audit] == [1, 2]
        assert audit[0]["actor"] == "alice" and audit[1]["actor"] == "bob" and audit[1]["role"] == "operator"
        assert audit[1]["action"] == "budgeter.update"
        assert audit[1]["params"] == {"mode": "session-cap-park", "low": 0.5}
        assert (
            audit[1]["before"]["mode"] == "budgeter-park" and audit[1]["after"]["mode"] == "session-cap-park"
        )
        assert audit[1]["ts"] == h.clock()
        assert [a["id"] for a in (await h.client.get("/audit?after_id=1")).json()] == [2]
        assert (await h.client.get("/audit?after_id=-1")).status_code == 422
        # the token holder without X-Actor is recorded as "operator"
        await h.client.put(
            "/control/budgeter", json={"high": 0.95}, headers={"Authorization": f"Bearer {OPERATOR}"}
        )
        assert (await h.client.get("/audit?after_id=2")).json()[0]["actor"] == "operator"


async def test_audit_log_is_append_only(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        await h.client.put("/control/budgeter", json={"high": 0.9}, headers=OP_HEADERS)
        db = sqlite3.connect(h.settings.state_db)
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("UPDATE audit SET actor = 'mallory'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("DELETE FROM audit")
        db.close()


async def test_park_unpark_unknown_session_is_404_and_bodies_are_optional(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        for action in ("park", "unpark"):
            r = await h.client.post(f"/control/sessions/ghost/{action}", headers=OP_HEADERS)
            assert r.status_code == 404 and r.json()["error"]["type"] == "unknown_session"
        await h.chat("s1")
        assert (
            await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS, json={})
        ).status_code == 200
        assert (
            await h.client.post("/control/sessions/s1/unpark", headers=OP_HEADERS, json={})
        ).status_code == 200
        await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS)
        r = await h.client.post("/control/sessions/s1/unpark", headers=OP_HEADERS, json={"pin": "yes"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "pin"
        r = await h.client.post("/control/sessions/s1/unpark", headers=OP_HEADERS, json={"pin": True})
        assert r.json()["session"]["pinned"] is True
        actions = [a["action"] for a in (await h.client.get("/audit")).json()]
        assert actions == ["session.park", "session.unpark", "session.park", "session.unpark"]


async def test_compaction_defer_and_allow(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        now = h.clock()
        r = await h.client.post(
            "/control/compaction/defer", headers=OP_HEADERS, json={"minutes": 30, "reason": "incident 42"}
        )
        assert r.status_code == 200
        state = await h.state()
        assert state["compaction"]["deferred_until"] == pytest.approx(now + 1800)
        assert state["compaction"]["deferred_by"] == "alice"
        decided = (await h.client.post("/compaction/requests", json={"subtrees": ["cold-one"]})).json()
        assert (
            decided["deferred"] == ["cold-one"] and "operator deferral" in decided["decisions"][0]["reason"]
        )
        assert (await h.client.post("/control/compaction/allow", headers=OP_HEADERS)).status_code == 200
        assert (await h.state())["compaction"]["deferred_until"] is None
        decided = (await h.client.post("/compaction/requests", json={"subtrees": ["cold-one"]})).json()
        assert decided["granted"] == ["cold-one"]
        until = dt.datetime.fromtimestamp(now + 600, tz=dt.UTC).isoformat()
        r = await h.client.post("/control/compaction/defer", headers=OP_HEADERS, json={"until": until})
        assert r.status_code == 200 and r.json()["compaction"]["deferred_until"] == pytest.approx(now + 600)
        h.clock.advance(601)
        h.cp.tick()
        assert (await h.state())["compaction"]["deferred_until"] is None
        # the dashboard sends `until` as Unix seconds
        r = await h.client.post(
            "/control/compaction/defer", headers=OP_HEADERS, json={"until": h.clock() + 60}
        )
        assert r.status_code == 200 and r.json()["compaction"]["deferred_until"] == pytest.approx(
            h.clock() + 60
        )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "until"),
        ({"minutes": 5, "until": "2999-01-01T00:00:00Z"}, "until"),
        ({"minutes": 0}, "minutes"),
        ({"minutes": "NaN"}, "minutes"),
        ({"minutes": 1e9}, "minutes"),
        ({"until": "2001-01-01T00:00:00Z"}, "until"),
        ({"until": "tomorrow"}, "until"),
        ({"minutes": 5, "extra": 1}, "extra"),
    ],
)
async def test_invalid_deferrals_are_rejected(tmp_path: Path, body: dict[str, Any], field: str) -> None:
    async with sidecar(tmp_path) as h:
        r = await h.client.post("/control/compaction/defer", headers=OP_HEADERS, json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == field
        assert (await h.state())["compaction"]["deferred_until"] is None


async def test_compaction_requests_follow_warmth_and_regime_and_are_recorded(tmp_path: Path) -> None:
    async with sidecar(tmp_path, regime_min_turns=5) as h:
        docs = "shared retrieved documents " * 30
        for i in range(6):
            await h.chat(f"s{i}", system=docs, headers={"X-Prefix-Id": "docs-warm"})
        await h.chat("x", headers={"X-Prefix-Id": "docs-cold"})
        body = {"subtrees": ["docs-warm", "docs-cold"], "reason": "nightly", "urgency": "normal"}
        decided = (await h.client.post("/compaction/requests", json=body)).json()
        assert decided["regime"] == "normal"
        assert decided["granted"] == ["docs-cold"] and decided["deferred"] == ["docs-warm"]
        assert all(d["reason"] for d in decided["decisions"])
        # a storm of short, low-overlap requests: R_r high, R_t low -> thin-reuse
        storm_prefix = "p" * 64
        for i in range(40):
            await h.chat(f"storm{i}", system=storm_prefix, content=f"question {i} " + "q" * 400, max_tokens=1)
        h.cp.tick()  # the regime advances on the clock-driven tick only, never on a read
        state = await h.state()
        assert state["reuse"]["regime"] == "thin-reuse", state["reuse"]
        decided = (await h.client.post("/compaction/requests", json=body)).json()
        assert decided["deferred"] == ["docs-warm", "docs-cold"]
        assert "thin-reuse" in decided["decisions"][1]["reason"]
        pressure = {**body, "urgency": "storage-pressure"}
        decided = (await h.client.post("/compaction/requests", json=pressure)).json()
        # under storage pressure the hottest subtrees stay pinned even in thin-reuse; cold ones go
        assert decided["deferred"] == ["docs-warm"] and decided["granted"] == ["docs-cold"]
        rows = (await h.client.get("/compaction/decisions")).json()
        assert [r["id"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) == 6
        assert [r["id"] for r in (await h.client.get("/compaction/decisions?after_id=4")).json()] == [5, 6]
        assert rows[0]["request_reason"] == "nightly" and rows[0]["urgency"] == "normal"
        assert rows[0]["regime"] == "normal" and rows[-1]["regime"] == "thin-reuse"
        assert rows[-1]["divergence"] == pytest.approx(state["reuse"]["divergence"])
        bad = await h.client.post("/compaction/requests", json={"subtrees": [], "urgency": "normal"})
        assert bad.status_code == 422
        bad = await h.client.post("/compaction/requests", json={"subtrees": ["a"], "urgency": "panic"})
        assert bad.status_code == 422 and bad.json()["error"]["param"] == "urgency"


async def test_a_cold_subtree_is_deferred_while_a_turn_under_it_is_in_flight(tmp_path: Path) -> None:
    """Its blocks are being loaded: the sidecar tells the gate when a turn starts, not only when it ends."""
    async with sidecar(tmp_path) as h:
        body = {"subtrees": ["docs"], "reason": "nightly", "urgency": "normal"}
        async with anyio.create_task_group() as tg:

            async def slow_turn() -> None:
                await h.chat("s1", headers={"X-Prefix-Id": "docs", "x-stub-wait-for": "docs turn"})

            tg.start_soon(slow_turn)
            await settle(lambda: h.cp.in_flight == 1, "the docs turn in flight")
            assert [s["in_flight"] for s in (await h.client.get("/subtrees")).json()] == [1]
            decided = (await h.client.post("/compaction/requests", json=body)).json()
            assert decided["deferred"] == ["docs"]
            assert "1 turn(s) in flight" in decided["decisions"][0]["reason"]
            h.engine.gate("docs turn").set()
        assert [s["in_flight"] for s in (await h.client.get("/subtrees")).json()] == [0]
        decided = (await h.client.post("/compaction/requests", json=body)).json()
        assert decided["granted"] == ["docs"]  # cold (one hit at most) and nothing in flight


async def test_openapi_schema_is_served(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        schema = (await h.client.get("/openapi.json")).json()
        for path in (
            "/state",
            "/sessions",
            "/subtrees",
            "/compaction/requests",
            "/compaction/decisions",
            "/audit",
            "/metrics",
            "/healthz",
            "/control/budgeter",
            "/control/sessions/{session_id}/park",
            "/control/sessions/{session_id}/unpark",
            "/control/compaction/defer",
            "/control/compaction/allow",
            "/sessions/{session_id}",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/models",
        ):
            assert path in schema["paths"], path
