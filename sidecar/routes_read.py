"""Read routes: /healthz, /state, /sessions, /subtrees, /compaction/decisions, /audit, /turns, /metrics.

No read advances the regime state machine: they show what the clock-driven tick last judged.
"""

import math
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from core.budgeter import UnknownSession

from .context import Sidecar
from .errors import ApiError, json_safe
from .wire import (
    AuditEntry,
    DecisionDoc,
    HealthDoc,
    SessionDoc,
    SessionDocState,
    SessionsPage,
    StateDoc,
    TurnsPage,
)

SessionIdPath = Annotated[str, Path(max_length=256, examples=["agent-1"])]


def parse_cursor(cursor: str) -> tuple[float, str]:
    ts_text, sep, sid = cursor.partition(":")
    try:
        ts = float(ts_text)
    except ValueError:
        ts = math.nan
    if not sep or not math.isfinite(ts):
        raise ApiError(
            422,
            "invalid_value",
            f"cursor must be a 'next' value of /sessions, got {cursor[:80]!r}",
            field="cursor",
            value=cursor[:200],
        )
    return ts, sid


def router(sc: Sidecar) -> APIRouter:
    cp, store = sc.cp, sc.store
    api = APIRouter(tags=["read"])
    viewer = [Depends(sc.auth.viewer)]

    @api.get("/healthz", response_model=HealthDoc)
    async def healthz() -> JSONResponse:
        return JSONResponse(json_safe(cp.health_doc()))

    @api.get("/state", dependencies=viewer, response_model=StateDoc)
    async def state(include_sessions: bool = False) -> JSONResponse:
        return JSONResponse(json_safe(cp.state_doc(include_sessions=include_sessions)))

    @api.get(
        "/sessions",
        dependencies=viewer,
        response_model=list[SessionDoc] | SessionsPage,
        summary="Sessions: the whole list, or with updated_after / limit / cursor one page "
        '{"sessions": [...], "next": CURSOR or null} in ascending (updated_at, id) order',
    )
    async def sessions(
        state: SessionDocState | None = None,
        include_ended: bool = True,
        updated_after: Annotated[float | None, Query(allow_inf_nan=False)] = None,
        limit: Annotated[int | None, Query(ge=1, le=10000)] = None,
        cursor: Annotated[str | None, Query(max_length=600)] = None,
    ) -> JSONResponse:
        if updated_after is None and limit is None and cursor is None:
            return JSONResponse(json_safe(cp.sessions_doc(include_ended=include_ended, state=state)))
        after = parse_cursor(cursor) if cursor is not None else None
        page, last = cp.sessions_page(
            updated_after=updated_after,
            cursor=after,
            limit=limit or 1000,
            include_ended=include_ended,
            state=state,
        )
        return JSONResponse(
            json_safe({"sessions": page, "next": None if last is None else f"{last[0]!r}:{last[1]}"})
        )

    @api.get("/sessions/{session_id:path}", dependencies=viewer, response_model=SessionDoc)
    async def session(session_id: SessionIdPath) -> JSONResponse:
        try:
            return JSONResponse(json_safe(cp.session_doc(session_id)))
        except UnknownSession:
            for record in reversed(cp.ended):
                if record["id"] == session_id:
                    return JSONResponse(json_safe(record))
            raise ApiError(
                404, "unknown_session", f"unknown session {session_id!r}", session=session_id
            ) from None

    @api.get("/subtrees", dependencies=viewer)
    async def subtrees() -> JSONResponse:
        return JSONResponse(json_safe(cp.subtrees_doc()))

    @api.get("/compaction/decisions", dependencies=viewer, response_model=list[DecisionDoc])
    async def compaction_decisions(
        after_id: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=10000)] = 1000
    ) -> JSONResponse:
        return JSONResponse(json_safe(store.decisions(after_id, limit)))

    @api.get("/audit", dependencies=viewer, response_model=list[AuditEntry])
    async def audit(
        after_id: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=10000)] = 1000
    ) -> JSONResponse:
        return JSONResponse(json_safe(store.audit(after_id, limit)))

    @api.get(
        "/turns",
        dependencies=viewer,
        response_model=TurnsPage,
        summary='The turn trace: {"turns": [...], "next_after_id": N}, turns with id > after_id in id order',
    )
    async def turns(
        after_id: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
        limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    ) -> JSONResponse:
        cp.flush_turns()  # what finished before this read is in the answer
        return JSONResponse(
            json_safe(
                cp.turn_log.page(after_id, limit)
                if cp.turn_log is not None
                else {"turns": [], "next_after_id": after_id}
            )
        )

    @api.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(sc.registry), media_type=CONTENT_TYPE_LATEST)

    return api
