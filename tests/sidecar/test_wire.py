"""The typed wire contracts (sidecar.wire): every document the sidecar serves validates against its
model, every field it sends is declared, and /sessions pages incrementally."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, get_args, get_origin

import pydantic
import pytest

from core.budgeter import CONTROLS, SESSION_STATES
from sidecar import wire

from .conftest import OP_HEADERS, sidecar

pytestmark = pytest.mark.anyio


def assert_declared(model: type[pydantic.BaseModel], doc: Any, where: str = "") -> None:
    """Validate ``doc`` and check each of its keys (recursively) is a field of the model."""
    model.model_validate(doc)
    assert isinstance(doc, dict), where
    undeclared = set(doc) - set(model.model_fields)
    assert not undeclared, f"{model.__name__}{where}: undeclared fields {sorted(undeclared)}"
    for name, field in model.model_fields.items():
        value = doc.get(name)
        if get_origin(field.annotation) is dict and isinstance(value, dict):
            inner = get_args(field.annotation)[1]
            if isinstance(inner, type) and issubclass(inner, pydantic.BaseModel):
                for key, item in value.items():
                    assert_declared(inner, item, f"{where}.{name}[{key!r}]")
            continue
        for arg in (field.annotation, *get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, pydantic.BaseModel) and isinstance(value, dict):
                assert_declared(arg, value, f"{where}.{name}")
            if get_args(arg) and isinstance(value, list):
                for inner in get_args(arg):
                    if isinstance(inner, type) and issubclass(inner, pydantic.BaseModel):
                        for item in value:
                            assert_declared(inner, item, f"{where}.{name}[]")


def test_literals_are_the_core_names() -> None:
    assert get_args(wire.ControlMode) == CONTROLS
    assert get_args(wire.SessionState) == SESSION_STATES
    assert get_args(wire.SessionDocState) == (*SESSION_STATES, "ended")


def test_wire_imports_only_pydantic_typing_and_core() -> None:
    tree = ast.parse(Path(wire.__file__).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    assert roots <= {"__future__", "typing", "pydantic", "core"}, roots


async def test_every_read_document_matches_its_model(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=100_000) as h:
        await h.chat("s1")
        await h.chat("s2", headers={"X-Session-End": "true"})
        await h.client.post("/control/sessions/s1/park", json={"reason": "test"}, headers=OP_HEADERS)
        r = await h.client.post("/compaction/requests", json={"subtrees": ["a", "b"]}, headers=OP_HEADERS)
        assert r.status_code == 200, r.text
        assert_declared(wire.StateDoc, await h.state())
        state = await h.state()
        assert state["backlog"]["oldest_parked_s"] == 0.0
        assert state["backlog"]["oldest_waiting_s"] is None
        h.clock.advance(7)
        assert (await h.state())["backlog"]["oldest_parked_s"] == 7.0
        sessions = (await h.client.get("/sessions", headers=OP_HEADERS)).json()
        assert isinstance(sessions, list) and {s["id"] for s in sessions} == {"s1", "s2"}
        for doc in sessions:
            assert_declared(wire.SessionDoc, doc)
        assert_declared(wire.SessionDoc, (await h.client.get("/sessions/s1", headers=OP_HEADERS)).json())
        decisions = (await h.client.get("/compaction/decisions", headers=OP_HEADERS)).json()
        assert len(decisions) == 2
        for doc in decisions:
            assert_declared(wire.DecisionDoc, doc)
        audit = (await h.client.get("/audit", headers=OP_HEADERS)).json()
        assert audit
        for doc in audit:
            assert_declared(wire.AuditEntry, doc)
        assert_declared(wire.HealthDoc, (await h.client.get("/healthz")).json())


async def test_sessions_page_and_incremental_reads(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=10_000_000) as h:
        for i in range(5):
            await h.chat(f"s{i}")
            h.clock.advance(1)
        r = await h.client.get("/sessions", params={"limit": 2}, headers=OP_HEADERS)
        assert r.status_code == 200, r.text
        page = wire.SessionsPage.model_validate(r.json())
        assert [s.id for s in page.sessions] == ["s0", "s1"] and page.next is not None
        seen = [s.id for s in page.sessions]
        while page.next is not None:
            page = wire.SessionsPage.model_validate(
                (
                    await h.client.get(
                        "/sessions", params={"limit": 2, "cursor": page.next}, headers=OP_HEADERS
                    )
                ).json()
            )
            seen += [s.id for s in page.sessions]
        assert seen == ["s0", "s1", "s2", "s3", "s4"]
        mark = max(
            s.updated_at or 0
            for s in wire.SessionsPage.model_validate(
                (await h.client.get("/sessions", params={"limit": 100}, headers=OP_HEADERS)).json()
            ).sessions
        )
        # nothing changed: an incremental read is empty
        empty = (await h.client.get("/sessions", params={"updated_after": mark}, headers=OP_HEADERS)).json()
        assert empty == {"sessions": [], "next": None}
        h.clock.advance(1)
        await h.chat("s3")
        h.clock.advance(1)
        await h.client.delete("/sessions/s1", headers=OP_HEADERS)
        changed = (await h.client.get("/sessions", params={"updated_after": mark}, headers=OP_HEADERS)).json()
        assert [(s["id"], s["state"]) for s in changed["sessions"]] == [("s3", "admitted"), ("s1", "ended")]
        assert changed["next"] is None


@pytest.mark.parametrize(
    "params",
    [
        {"cursor": "garbage"},
        {"cursor": "nan:x"},
        {"limit": 0},
        {"updated_after": "inf"},
        {"state": "sleeping"},
    ],
)
async def test_sessions_bad_paging_parameters_are_422(tmp_path: Path, params: dict[str, Any]) -> None:
    async with sidecar(tmp_path) as h:
        r = await h.client.get("/sessions", params=params, headers=OP_HEADERS)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["type"] == "invalid_value"


async def test_openapi_names_the_wire_models(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        schemas = (await h.client.get("/openapi.json")).json()["components"]["schemas"]
        for name in ("StateDoc", "SessionDoc", "SessionsPage", "DecisionDoc", "AuditEntry", "BacklogDoc"):
            assert name in schemas, name
        backlog = schemas["BacklogDoc"]["properties"]
        assert "oldest_waiting_s" in backlog and "oldest_parked_s" in backlog
