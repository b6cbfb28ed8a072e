"""Control routes (operator token): budgeter settings, park/unpark, compaction deferral.

Every accepted change is recorded in the audit with its actor, parameters (reasons included),
and the state before and after.
"""

import datetime as dt
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from core.budgeter import CONTROLS, ConfigError, UnknownSession

from .context import Sidecar
from .errors import ApiError, json_safe

Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
SessionIdPath = Annotated[str, Path(max_length=256, examples=["agent-1"])]


class BudgeterUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal[CONTROLS] | None = None  # type: ignore[valid-type]
    low: Finite | None = Field(default=None, gt=0, lt=1)
    high: Finite | None = Field(default=None, gt=0, le=1)
    session_cap: int | None = Field(default=None, ge=1, le=1_000_000, strict=True)
    latency_limit_s: Finite | None = Field(default=None, gt=0, le=86400)


class UnparkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pin: bool = Field(default=False, strict=True)


class ParkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=1000)


class DeferBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    until: dt.datetime | None = Field(
        default=None, description="ISO 8601 time (or Unix seconds) the deferral ends"
    )
    minutes: Finite | None = Field(default=None, gt=0, le=7 * 24 * 60)
    reason: str = Field(default="", max_length=1000)


class AllowBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=1000)


def unknown(session_id: str) -> ApiError:
    return ApiError(404, "unknown_session", f"unknown session {session_id!r}", session=session_id)


def router(sc: Sidecar) -> APIRouter:
    cp = sc.cp
    api = APIRouter(tags=["control"])
    Operator = Annotated[tuple[str, str], Depends(sc.auth.operator)]

    @api.put("/control/budgeter", summary="Change mode and/or bands (partial update)")
    async def control_budgeter(who: Operator, body: BudgeterUpdate) -> JSONResponse:
        actor, role = who
        changes = body.model_dump(exclude_none=True)
        if not changes:
            raise ApiError(
                422,
                "invalid_value",
                "the body must set at least one of mode, low, high, session_cap, latency_limit_s",
                field="body",
                value={},
            )
        try:
            after, audit_id = cp.update_budgeter(changes, actor, role)
        except ConfigError as exc:
            raise ApiError(
                422, "invalid_value", str(exc), field=exc.field or "body", value=json_safe(changes)
            ) from None
        return JSONResponse(json_safe({"budgeter": after, "audit_id": audit_id}))

    @api.post("/control/sessions/{session_id:path}/park")
    async def control_park(
        who: Operator, session_id: SessionIdPath, body: Annotated[ParkBody | None, Body()] = None
    ) -> JSONResponse:
        actor, role = who
        try:
            doc, audit_id = cp.park(session_id, actor, role, reason=body.reason if body is not None else None)
        except UnknownSession:
            raise unknown(session_id) from None
        return JSONResponse(json_safe({"session": doc, "audit_id": audit_id}))

    @api.post("/control/sessions/{session_id:path}/unpark")
    async def control_unpark(
        who: Operator, session_id: SessionIdPath, body: Annotated[UnparkBody | None, Body()] = None
    ) -> JSONResponse:
        actor, role = who
        try:
            doc, audit_id = cp.unpark(session_id, body.pin if body is not None else False, actor, role)
        except UnknownSession:
            raise unknown(session_id) from None
        return JSONResponse(json_safe({"session": doc, "audit_id": audit_id}))

    @api.post(
        "/control/compaction/defer", summary="Defer every compaction until a time (`until`) or for `minutes`"
    )
    async def control_defer(who: Operator, body: DeferBody) -> JSONResponse:
        actor, role = who
        now = cp.clock()
        if (body.until is None) == (body.minutes is None):
            raise ApiError(
                422,
                "invalid_value",
                "give exactly one of until and minutes",
                field="until",
                value=json_safe(body.model_dump(mode="json")),
            )
        if body.until is not None:
            until_dt = body.until if body.until.tzinfo else body.until.replace(tzinfo=dt.UTC)
            until = until_dt.timestamp()
            if not until > now:
                raise ApiError(
                    422,
                    "invalid_value",
                    f"until must be in the future, got {body.until.isoformat()}",
                    field="until",
                    value=body.until.isoformat(),
                )
            if until - now > 7 * 24 * 3600:
                raise ApiError(
                    422,
                    "invalid_value",
                    f"until must be within 7 days, got {body.until.isoformat()}",
                    field="until",
                    value=body.until.isoformat(),
                )
        else:
            assert body.minutes is not None
            until = now + body.minutes * 60.0
        after, audit_id = cp.defer_compaction(until, body.reason, actor, role)
        return JSONResponse(json_safe({"compaction": after, "audit_id": audit_id}))

    @api.post("/control/compaction/allow", summary="End an operator compaction deferral")
    async def control_allow(who: Operator, body: Annotated[AllowBody | None, Body()] = None) -> JSONResponse:
        actor, role = who
        after, audit_id = cp.allow_compaction(actor, role, reason=body.reason if body is not None else "")
        return JSONResponse(json_safe({"compaction": after, "audit_id": audit_id}))

    return api
