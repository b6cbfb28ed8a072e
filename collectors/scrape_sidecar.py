"""One scrape of one sidecar: /state, changed sessions, /subtrees and the new entries of its logs.

`SidecarScraper` reads the sidecar's documents (checked against their wire contracts in
`sidecar.wire`, read field by field by `collectors.sidecar_docs`) into a `ScrapeOutcome`, and
keeps the incremental cursors of its session listing and of its decision, audit and turn logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from collectors import checks as check
from collectors import sidecar_docs as docs
from collectors import turn_trace
from collectors.config import SidecarTarget
from collectors.scrape import LogCursor, ScrapeOutcome
from collectors.scrape_http import ScrapeError, fetch_json
from core import rates
from core import signals as sig
from sidecar import wire


class SidecarScraper:
    """Scrapes one sidecar: /state, changed sessions, /subtrees, and new decisions and audit entries.

    Cursors (the decision and audit logs' last ids, the sessions' last ``updated_at``) advance
    only in `commit`, called once the writer has stored an outcome: a failed write is read again.
    Each log read starts one entry early, at the newest stored one; when that entry is missing or
    different, the sidecar's log was reset (its state db wiped): reading starts again at id 0 in
    a new epoch, so its new entries are stored and not mistaken for ones already seen.
    """

    role = "sidecar"
    PAGE = 1000
    MAX_PAGES = 50  # per scrape; a longer backlog is read on the following scrapes
    FULL_EVERY_S = 300.0  # a full session listing this often marks sessions the sidecar forgot

    def __init__(
        self,
        target: SidecarTarget,
        *,
        interval_s: float,
        timeout_s: float,
        max_page_bytes: int,
        cursors: dict[str, LogCursor] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.url = target.url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_page_bytes = max_page_bytes
        self.clock = clock
        self.cursors: dict[str, LogCursor] = {
            "decisions": LogCursor(),
            "audit": LogCursor(),
            "turns": LogCursor(),
            **(cursors or {}),
        }
        self.sessions_mark: float | None = None  # committed; None: the next read is a full listing
        self.sessions_next: str | None = None  # committed `next` of a read cut short by MAX_PAGES
        self.last_full_ts: float | None = None
        self.prev_turns: float | None = None
        self.prev_ts: float | None = None
        self.prev_started: float | None = None
        self.checker = check.Checker(self.url)

    @property
    def decision_cursor(self) -> int:
        return self.cursors["decisions"].after_id

    @property
    def audit_cursor(self) -> int:
        return self.cursors["audit"].after_id

    def _headers(self) -> dict[str, str] | None:
        token = self.target.viewer_token
        return {"Authorization": f"Bearer {token}"} if token else None

    def _get(self, client: httpx.Client, path: str) -> Any:
        return fetch_json(
            client,
            self.url + path,
            timeout_s=self.timeout_s,
            max_bytes=self.max_page_bytes,
            headers=self._headers(),
        )

    def _typed(self, model: type[wire.Wire], doc: Any, path: str) -> Any:
        """`doc` unchanged; one warning (per document kind) when it drifts from its wire contract."""
        if "contract:" + path not in self.checker.warned:
            problem = docs.contract_problem(model, doc)
            if problem is not None:
                self.checker.warn_once(
                    "contract:" + path,
                    f"{self.url}{path}: does not match sidecar.wire."
                    f"{model.__name__} ({problem}); read field by field",
                )
        return doc

    def _read_log(
        self,
        client: httpx.Client,
        name: str,
        path: str,
        parse: Callable[[Mapping[str, Any]], dict[str, Any] | None],
        key: str,
        model: type[wire.Wire],
        pages: int = 1,
    ) -> tuple[int, list[dict[str, Any]]]:
        """(epoch, entries after the committed cursor) of one incremental log (up to ``pages`` pages)."""
        cur = self.cursors[name]

        def read(after: int) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for _ in range(pages):
                page = self._get(client, f"{path}?after_id={after}&limit={self.PAGE}")
                docs_ = docs.require_list(turn_trace.turns_items(page), f"{self.url}{path}")
                out += [
                    r
                    for r in (self.checker.row(parse(self._typed(model, d, path)), path) for d in docs_)
                    if r
                ]
                if len(docs_) < self.PAGE or not out:
                    break
                after = out[-1]["remote_id"]
            return out

        if cur.after_id <= 0:
            return cur.epoch, [r for r in read(0) if r["remote_id"] > 0]
        rows = read(cur.after_id - 1)
        anchor = rows[0] if rows else None
        same = (
            anchor is not None
            and anchor["remote_id"] == cur.after_id
            and anchor.get(key) == cur.key
            and (cur.ts is None or anchor["ts"] is None or abs(anchor["ts"] - cur.ts) < 1e-3)
        )
        if same:
            return cur.epoch, [r for r in rows if r["remote_id"] > cur.after_id]
        self.checker.warn_once(
            f"{name}-reset:{cur.epoch}",
            f"{self.url}{path}: entry {cur.after_id}, the last one stored, is "
            f"{'gone' if anchor is None or anchor['remote_id'] != cur.after_id else 'different'}: "
            "the sidecar's log restarted (state db wiped?); reading its new entries from id 1",
        )
        return cur.epoch + 1, [r for r in read(0) if r["remote_id"] > 0]

    def _read_sessions(
        self, client: httpx.Client, ts: float
    ) -> tuple[list[dict[str, Any]], bool, float | None, str | None]:
        """(session rows, whether they are the full list, newest updated_at seen, where to resume)."""
        mark, resume = self.sessions_mark, self.sessions_next
        full = resume is None and (
            self.last_full_ts is None or ts - self.last_full_ts >= self.FULL_EVERY_S or mark is None
        )
        if resume is not None:  # the last read stopped after MAX_PAGES: carry on where it stopped
            query = f"cursor={quote(resume)}&limit={self.PAGE}"
        elif full:
            query = f"limit={self.PAGE}"
        else:
            query = f"updated_after={mark!r}&limit={self.PAGE}"
        rows: list[dict[str, Any]] = []
        newest = mark
        for _ in range(self.MAX_PAGES):
            doc = self._get(client, f"/sessions?{query}")
            if isinstance(doc, list):  # a sidecar without pages: the whole list
                items, cursor = docs.require_list(doc, f"{self.url}/sessions"), None
                full = True
            else:
                page = docs.require_object(doc, f"{self.url}/sessions")
                items = docs.require_list(page.get("sessions"), f"{self.url}/sessions: sessions")
                cursor = page.get("next")
            for d in items:
                row = self.checker.row(
                    docs.session_row(self._typed(wire.SessionDoc, d, "/sessions")), "/sessions"
                )
                if row is None:
                    continue
                rows.append(row)
                updated = docs.num(d.get("updated_at"))
                if updated is not None and (newest is None or updated > newest):
                    newest = updated
            if not isinstance(cursor, str) or not cursor:
                return rows, full, newest, None
            query = f"cursor={quote(cursor)}&limit={self.PAGE}"
        return rows, False, newest, cursor  # more than MAX_PAGES pages changed: the rest on the next scrape

    def scrape(self, client: httpx.Client) -> ScrapeOutcome:
        started = time.perf_counter()
        ts = self.clock()
        try:
            state = dict(
                docs.require_object(
                    self._typed(wire.StateDoc, self._get(client, "/state"), "/state"), f"{self.url}/state"
                )
            )
            started_at = docs.started_at(state)
            if started_at is not None and self.prev_started is not None and started_at != self.prev_started:
                self.sessions_mark = None  # a restarted sidecar: list everything again
            sessions, full, mark, resume = self._read_sessions(client, ts)
            subtrees = [
                r
                for r in (
                    self.checker.row(docs.subtree_row(d), "/subtrees")
                    for d in docs.require_list(self._get(client, "/subtrees"), f"{self.url}/subtrees")
                )
                if r
            ]
            decision_epoch, decisions = self._read_log(
                client, "decisions", "/compaction/decisions", docs.decision_row, "decision", wire.DecisionDoc
            )
            audit_epoch, audit = self._read_log(
                client, "audit", "/audit", docs.audit_row, "action", wire.AuditEntry
            )
            turns_epoch, turns = self._read_turns(client)
        except (ScrapeError, docs.SidecarPayloadError) as exc:
            return ScrapeOutcome(
                self.url, self.role, ts, False, time.perf_counter() - started, error=str(exc), kind="sidecar"
            )
        outcome = self.outcome(state, sessions, subtrees, decisions, audit, ts, started)
        outcome.sessions_full, outcome.sessions_mark, outcome.sessions_next = full, mark, resume
        outcome.decision_epoch, outcome.audit_epoch = decision_epoch, audit_epoch
        outcome.turns, outcome.turns_epoch = turns, turns_epoch
        return outcome

    def _read_turns(self, client: httpx.Client) -> tuple[int, list[dict[str, Any]]]:
        """The turn trace after the committed cursor; a sidecar without /turns (older) has none."""
        try:
            return self._read_log(
                client, "turns", "/turns", turn_trace.turn_row, "outcome", wire.TurnDoc, pages=self.MAX_PAGES
            )
        except ScrapeError as exc:
            if "HTTP 404" not in str(exc):
                raise
            return self.cursors["turns"].epoch, []

    def commit(self, outcome: ScrapeOutcome) -> None:
        """The writer stored `outcome`: reading resumes after what it held."""
        for name, rows, epoch, key in (
            ("decisions", outcome.decisions, outcome.decision_epoch, "decision"),
            ("audit", outcome.audit, outcome.audit_epoch, "action"),
            ("turns", outcome.turns, outcome.turns_epoch, "outcome"),
        ):
            cur = self.cursors[name]
            if not rows or (epoch, max(r["remote_id"] for r in rows)) <= (cur.epoch, cur.after_id):
                continue
            last = max(rows, key=lambda r: r["remote_id"])
            self.cursors[name] = LogCursor(epoch, last["remote_id"], last["ts"], last.get(key))
        if outcome.sessions is not None:
            if outcome.sessions_full or (outcome.sessions_next is not None and self.sessions_next is None):
                self.last_full_ts = outcome.ts  # (a listing too long for one scrape is not restarted)
            self.sessions_next = outcome.sessions_next
            if outcome.sessions_mark is not None and (
                self.sessions_mark is None or outcome.sessions_mark > self.sessions_mark
            ):
                self.sessions_mark = outcome.sessions_mark

    def outcome(
        self,
        state: dict[str, Any],
        sessions: list[dict[str, Any]],
        subtrees: list[dict[str, Any]],
        decisions: list[dict[str, Any]],
        audit: list[dict[str, Any]],
        ts: float,
        started: float,
    ) -> ScrapeOutcome:
        values = docs.state_signals(state)
        turns = docs.turns_total(state)
        started_at = docs.started_at(state)
        restarted = (
            started_at is not None and self.prev_started is not None and started_at != self.prev_started
        )
        rate = rates.counter_rate(
            self.prev_turns,
            self.prev_ts,
            turns,
            ts,
            max_gap_s=3 * self.interval_s + self.timeout_s + 1.0,
            prev_start=self.prev_started,
            cur_start=started_at,
        )
        if rate is not None and not restarted:
            values[sig.TURNS_PER_S] = rate
        values = self.checker.signals(values)
        self.prev_turns, self.prev_ts = turns, ts
        if started_at is not None:
            self.prev_started = started_at
        duration = time.perf_counter() - started
        samples = [("", name, value) for name, value in values.items()]
        samples.append(("", sig.UP, 1.0))
        samples.append(("", sig.SCRAPE_DURATION_S, duration))
        return ScrapeOutcome(
            self.url,
            self.role,
            ts,
            True,
            duration,
            kind="sidecar",
            samples=samples,
            engine_labels=("",),
            restarted=restarted,
            state=state,
            sessions=sessions,
            subtrees=subtrees,
            decisions=decisions,
            audit=audit,
            warnings=tuple(str(w) for w in state.get("warnings") or () if isinstance(w, str)),
        )
