"""Operator actions: ask, confirm in a dialog, send, show and record the result.

The flow (CONVENTIONS.md): a page's button calls `request(Action(...))`, which
stores the pending action in `st.session_state`; `render_pending()` (called by
app.py on every run) opens the confirmation dialog while one is pending; the
dialog's Confirm sends it (`execute`) and stores the outcome, which
`render_outcome()` shows on the page (and in a toast) until the next action.
Gating the dialog on session state, not on a button's return value, keeps it
open across reruns and reachable from AppTest.

Who may act is checked again at confirmation (a session signed out in between
sends nothing). Sidecar actions are audited by the sidecar (it names the
person from `X-Actor`); an action the sidecar never applied (down, token
rejected, refused) and the dashboard's own actions (acknowledge, silence,
sign-in) are written to the audit table here with ``source='dashboard'``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import streamlit as st
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from dashboard import data
from dashboard import frames as q
from dashboard.auth import Operator, current_operator
from dashboard.control import ControlResult, SidecarControl, load_sidecar_tokens, token_for
from dashboard.settings import Settings
from dashboard.ui import escape_md

logger = logging.getLogger(__name__)

PENDING_KEY = "pending_action"
OUTCOME_KEY = "action_outcome"
SIDECAR_KINDS = frozenset({"park", "unpark", "budgeter", "defer", "allow"})
DB_KINDS = frozenset({"ack", "silence", "unsilence"})
READBACK_KEY = "sidecar_readback"  # sidecar URL -> (ts, /state read back right after a confirmed change)


@dataclass(frozen=True)
class Action:
    kind: str
    effect: str  # the sentence the confirmation dialog shows
    engine: str
    sidecar_target_id: int | None = None
    sidecar_url: str | None = None
    sidecar_name: str | None = None
    session_ids: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    summary: str
    details: tuple[str, ...] = ()
    kind: str = ""
    ts: float = 0.0


def request(action: Action) -> None:
    st.session_state[PENDING_KEY] = action


def pending() -> Action | None:
    action = st.session_state.get(PENDING_KEY)
    return action if isinstance(action, Action) else None


def _clear_pending() -> None:
    st.session_state.pop(PENDING_KEY, None)


def _sidecar_control(
    action: Action, operator: Operator, settings: Settings, client: httpx.Client
) -> SidecarControl:
    tokens = load_sidecar_tokens(settings.config_path)
    name = action.sidecar_name or action.sidecar_url or "?"
    token = token_for(name, action.sidecar_url or "", tokens=tokens, default=settings.default_operator_token)
    return SidecarControl(
        client,
        action.sidecar_url or "",
        token=token,
        actor=operator.name,
        name=name,
        timeout=settings.control_timeout,
    )


def _ended(sid: str, result: ControlResult, verb: str) -> ControlResult:
    """A 404 on a session action: the session has ended (the sidecar forgets ended sessions)."""
    if result.status == 404:
        return ControlResult(
            False,
            f"session {sid} has ended (the sidecar no longer tracks it): nothing to {verb} "
            f"({result.message})",
            404,
        )
    return result


def _send(action: Action, ctl: SidecarControl) -> list[tuple[str, ControlResult]]:
    p = action.params
    if action.kind == "park":
        return [(sid, _ended(sid, ctl.park(sid), "park")) for sid in action.session_ids]
    if action.kind == "unpark":
        return [
            (sid, _ended(sid, ctl.unpark(sid, pin=bool(p.get("pin"))), "unpark"))
            for sid in action.session_ids
        ]
    if action.kind == "budgeter":
        return [("budgeter", ctl.set_budgeter(mode=p.get("mode"), low=p.get("low"), high=p.get("high")))]
    if action.kind == "defer":
        return [
            (
                "compaction",
                ctl.defer_compaction(minutes=p.get("minutes"), until=p.get("until"), reason=p.get("reason")),
            )
        ]
    if action.kind == "allow":
        return [("compaction", ctl.allow_compaction())]
    raise ValueError(f"unknown sidecar action {action.kind!r}")


def _audit(engine: Engine, **kwargs: Any) -> str | None:
    try:
        q.write_audit(engine, **kwargs)
        return None
    except SQLAlchemyError as exc:
        logger.error("could not write audit row: %s", type(exc).__name__)
        return (
            f"Could not record this in the audit table ({type(exc).__name__}); the result above still holds."
        )


def execute(
    action: Action, operator: Operator | None, settings: Settings, *, client: httpx.Client, db: Engine
) -> Outcome:
    """Carry out a confirmed action; never raises for an expected failure."""
    now = time.time()
    if operator is None:
        return Outcome(False, "Not signed in as an operator: nothing was sent.", kind=action.kind, ts=now)
    if action.kind in SIDECAR_KINDS:
        if not action.sidecar_url:
            return Outcome(
                False,
                f"Engine {action.engine} has no sidecar: there is nothing to control.",
                kind=action.kind,
                ts=now,
            )
        ctl = _sidecar_control(action, operator, settings, client)
        results = _send(action, ctl)
        failed = [(item, r) for item, r in results if not r.ok]
        done = len(results) - len(failed)
        if action.kind in ("park", "unpark"):
            verb = "parked" if action.kind == "park" else "unparked"
            summary = f"{verb} {done} of {len(results)} session(s) on engine {action.engine}"
        else:
            summary = f"{action.kind} on engine {action.engine}: " + ("done" if not failed else "failed")
        details = [f"{item}: {r.message}" for item, r in failed]
        readback = _read_back(ctl, action) if done else None
        if readback:
            details.insert(0, readback)
        if action.params.get("undo_of") and not failed:
            note = _audit(
                db,
                actor=operator.name,
                action="budgeter.undo",
                outcome="ok",
                params={
                    "engine": action.engine,
                    "undo_of": action.params["undo_of"],
                    **{k: v for k, v in action.params.items() if k in ("mode", "low", "high")},
                },
                target_url=action.sidecar_url,
                now=now,
            )
            if note:
                details.append(note)
        if failed:
            note = _audit(
                db,
                actor=operator.name,
                action=action.kind,
                outcome="; ".join(details)[:2000],
                params={"engine": action.engine, "sessions": list(action.session_ids), **action.params},
                target_url=action.sidecar_url,
                now=now,
            )
            if note:
                details.append(note)
        logger.info(
            "action %s by %r on %s: %d ok, %d failed",
            action.kind,
            operator.name,
            action.engine,
            done,
            len(failed),
        )
        return Outcome(not failed, summary, tuple(details), action.kind, now)
    if action.kind == "ack":
        alert_id = int(action.params["alert_id"])
        try:
            changed = q.acknowledge_alert(db, alert_id, operator.name, now=now)
        except SQLAlchemyError as exc:
            return Outcome(
                False, f"Could not acknowledge: database error {type(exc).__name__}", kind="ack", ts=now
            )
        outcome = "ok" if changed else "already acknowledged"
        note = _audit(
            db,
            actor=operator.name,
            action="alert.acknowledge",
            outcome=outcome,
            params={"alert_id": alert_id, "rule": action.params.get("rule"), "engine": action.engine},
            target_url=action.params.get("target_url"),
            now=now,
        )
        details = (note,) if note else ()
        if not changed:
            return Outcome(
                False,
                "That alert was already acknowledged (or no longer exists); nothing changed.",
                details,
                "ack",
                now,
            )
        return Outcome(
            True, f"Acknowledged alert {action.params.get('rule')} on {action.engine}", details, "ack", now
        )
    if action.kind == "unsilence":
        silence_id = int(action.params["silence_id"])
        try:
            ended = q.expire_silence(db, silence_id, now=now)
        except SQLAlchemyError as exc:
            return Outcome(
                False,
                f"Could not expire the silence: database error {type(exc).__name__}",
                kind="unsilence",
                ts=now,
            )
        note = _audit(
            db,
            actor=operator.name,
            action="alert.unsilence",
            outcome="ok" if ended else "already over",
            params={"silence_id": silence_id, "rule": action.params.get("rule")},
            now=now,
        )
        if not ended:
            return Outcome(
                False,
                "That silence had already ended; nothing changed.",
                (note,) if note else (),
                "unsilence",
                now,
            )
        return Outcome(
            True,
            f"Expired the silence of {action.params.get('rule') or 'all rules'} on "
            f"{action.engine}: notifications resume",
            (note,) if note else (),
            "unsilence",
            now,
        )
    if action.kind == "silence":
        try:
            for target_id in action.params.get("target_ids") or [None]:
                q.add_silence(
                    db,
                    rule=action.params.get("rule"),
                    target_id=target_id,
                    minutes=float(action.params["minutes"]),
                    actor=operator.name,
                    comment=action.params.get("comment"),
                    now=now,
                )
        except ValueError as exc:
            return Outcome(False, str(exc), kind="silence", ts=now)
        except SQLAlchemyError as exc:
            return Outcome(
                False,
                f"Could not add the silence: database error {type(exc).__name__}",
                kind="silence",
                ts=now,
            )
        note = _audit(
            db,
            actor=operator.name,
            action="alert.silence",
            outcome="ok",
            params={**action.params, "engine": action.engine},
            target_url=action.params.get("target_url"),
            now=now,
        )
        return Outcome(
            True,
            f"Silenced {action.params.get('rule') or 'all rules'} on {action.engine} for "
            f"{float(action.params['minutes']):g} min",
            (note,) if note else (),
            "silence",
            now,
        )
    raise ValueError(f"unknown action kind {action.kind!r}")


def _read_back(ctl: SidecarControl, action: Action) -> str | None:
    """Read the sidecar's /state right after a change, so the page shows the new state at once (the
    collectors' next scrape may be seconds away); kept in the session for the pages to use."""
    result = ctl.state()
    if not result.ok or not isinstance(result.body, dict):
        return f"could not read the new state back from the sidecar: {result.message}"
    # Outside a Streamlit run (tests of `execute`) there is no session to keep it in.
    with contextlib.suppress(Exception):
        st.session_state.setdefault(READBACK_KEY, {})[action.sidecar_url] = (time.time(), result.body)
    state = result.body
    budgeter, backlog = state.get("budgeter") or {}, state.get("backlog") or {}
    return (
        f"now, read back from the sidecar: budgeter {budgeter.get('mode')} bands {budgeter.get('low')}-"
        f"{budgeter.get('high')}; {backlog.get('admitted', '?')} admitted, {backlog.get('parked', '?')} parked, "
        f"{backlog.get('waiting', '?')} waiting"
    )


def read_back_state(sidecar_url: str | None, not_before: float) -> dict[str, Any] | None:
    """The /state read back after this session's last change to that sidecar, when newer than `not_before`."""
    entry = st.session_state.get(READBACK_KEY, {}).get(sidecar_url)
    if entry is None or entry[0] <= not_before:
        return None
    return entry[1]


def _confirm_body(settings: Settings) -> None:
    action = pending()
    if action is None:
        return
    st.markdown(escape_md(action.effect))
    if action.session_ids and len(action.session_ids) > 1:
        st.text("\n".join(action.session_ids[:50]) + ("\n..." if len(action.session_ids) > 50 else ""))
    operator = current_operator(settings)
    if operator is None:
        st.warning("You are not signed in as an operator; this cannot be sent.")
    cols = st.columns(2)
    if cols[0].button("Confirm", key="confirm_action", type="primary", disabled=operator is None):
        outcome = execute(
            action, operator, settings, client=data.http_client(), db=data.write_engine(settings.database_url)
        )
        st.session_state[OUTCOME_KEY] = outcome
        _clear_pending()
        data.clear_caches()
        st.rerun()
    if cols[1].button("Cancel", key="cancel_action"):
        _clear_pending()
        st.rerun()


@st.dialog("Confirm action", on_dismiss=_clear_pending)
def _confirm_dialog(settings: Settings) -> None:
    _confirm_body(settings)


def render_pending(settings: Settings) -> None:
    if pending() is not None:
        _confirm_dialog(settings)


def render_outcome() -> None:
    outcome = st.session_state.get(OUTCOME_KEY)
    if not isinstance(outcome, Outcome):
        return
    box = st.success if outcome.ok else st.error
    box(escape_md(outcome.summary))
    for line in outcome.details:
        st.text(line)
    if st.session_state.get("_outcome_toasted") != outcome.ts:
        st.toast("Action done" if outcome.ok else "Action failed: see the message on the page")
        st.session_state["_outcome_toasted"] = outcome.ts
    if st.button("Dismiss message", key="dismiss_outcome"):
        st.session_state.pop(OUTCOME_KEY, None)
        st.rerun()
