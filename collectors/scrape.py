"""One scrape of one target: HTTP in, a `ScrapeOutcome` (plain data for the writer) out.

Each target has one scraper object holding what rates need (the previous snapshot, its time,
the process start time, the sidecar's turn counter and its incremental cursors). Scrapers take
an ``httpx.Client`` so tests can hand them a ``MockTransport``.

Expected failures never raise: refused connections, timeouts, HTTP errors, oversized,
HTML/JSON/garbled pages, malformed sidecar JSON all give ``ok=False`` with a one-line
``error`` that names the URL and what to check.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from collectors import checks as check
from collectors import sidecar_docs as docs
from collectors import turn_trace
from collectors.config import EngineTarget, SidecarTarget
from core import engine_metrics as em
from core import rates
from core import signals as sig
from sidecar import wire


class ScrapeError(Exception):
    """An expected scrape failure; str() is the one-line reason."""


@dataclass
class ScrapeOutcome:
    url: str
    role: str  # engine | sidecar
    ts: float
    ok: bool
    duration_s: float
    error: str | None = None
    kind: str | None = None
    process_start_ts: float | None = None
    samples: list[tuple[str, str, float]] = field(default_factory=list)  # (engine label, signal, value)
    engine_labels: tuple[str, ...] = ()
    restarted: bool = False
    warnings: tuple[str, ...] = ()
    # Sidecars only
    state: dict[str, Any] | None = None
    sessions: list[dict[str, Any]] | None = None
    subtrees: list[dict[str, Any]] | None = None
    sessions_full: bool = True  # False: `sessions` holds only the sessions changed since the last read
    sessions_mark: float | None = None  # the newest `updated_at` read (the sessions cursor once committed)
    sessions_next: str | None = None  # where a read cut short resumes
    decisions: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)
    decision_epoch: int = 0  # which of the sidecar's logs (a wiped state db starts a new one)
    audit_epoch: int = 0
    turns: list[dict[str, Any]] = field(default_factory=list)  # the turn trace (collectors/turn_trace.py)
    turns_epoch: int = 0
    retried: bool = False  # written again after a failed write


@dataclass(frozen=True)
class LogCursor:
    """Where reading one of a sidecar's logs resumes: the newest stored entry (id, ts and its
    action or decision, to recognise it again) in the newest log epoch."""

    epoch: int = 0
    after_id: int = 0
    ts: float | None = None
    key: str | None = None


def _describe(exc: Exception, url: str, timeout_s: float) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timeout after {timeout_s:g} s fetching {url}"
    if isinstance(exc, httpx.ConnectError):
        reason = str(exc) or "connection failed"
        if "refused" in reason.lower() or "errno 111" in reason.lower():
            reason = "connection refused"
        return f"{reason} ({url}): is the process running and the port right?"
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__} fetching {url}: {exc}"
    return f"{type(exc).__name__}: {exc}"


def fetch_text(client: httpx.Client, url: str, *, timeout_s: float, max_bytes: int,
               headers: dict[str, str] | None = None) -> str:
    """GET `url` and return its body as text; raises ScrapeError with the reason."""
    deadline = time.monotonic() + 2 * timeout_s  # per-read timeouts alone let a trickling server hang a job
    try:
        with client.stream("GET", url, timeout=timeout_s, headers=headers) as response:
            if response.status_code != 200:
                body = response.read()[:200].decode("utf-8", "replace")
                hint = ""
                if response.status_code in (401, 403):
                    hint = " (set viewer_token for this sidecar in the collectors' config)"
                raise ScrapeError(f"HTTP {response.status_code} from {url}{hint}: {' '.join(body.split())[:120]!r}")
            chunks = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if time.monotonic() > deadline:
                    raise ScrapeError(f"{url} is sending its page too slowly (over {2 * timeout_s:g} s): not scraped")
                if size > max_bytes:
                    raise ScrapeError(f"page from {url} is larger than {max_bytes} bytes: not scraped "
                                      "(raise [collector] max_page_bytes if this is expected)")
                chunks.append(chunk)
            return b"".join(chunks).decode("utf-8", "replace")
    except ScrapeError:
        raise
    except (httpx.HTTPError, OSError) as exc:
        raise ScrapeError(_describe(exc, url, timeout_s)) from None


def fetch_json(client: httpx.Client, url: str, *, timeout_s: float, max_bytes: int,
               headers: dict[str, str] | None = None) -> Any:
    body = fetch_text(client, url, timeout_s=timeout_s, max_bytes=max_bytes, headers=headers)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ScrapeError(f"malformed JSON from {url}: {exc.args[0] if exc.args else exc} "
                          f"(starts with {body[:60]!r})") from None


class EngineScraper:
    """Scrapes one engine's /metrics and turns counters into rates across scrapes."""

    role = "engine"

    def __init__(self, target: EngineTarget, *, interval_s: float, timeout_s: float, max_page_bytes: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self.url = target.url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_page_bytes = max_page_bytes
        self.clock = clock
        self.prev: dict[str, em.EngineSnapshot] = {}
        self.prev_ts: float | None = None
        self.prev_start: float | None = None
        self.kind: str | None = None
        self.checker = check.Checker(self.url)

    @property
    def max_gap_s(self) -> float:
        # Longer than this since the last good scrape and a rate would average over a gap.
        return 3 * self.interval_s + self.timeout_s + 1.0

    def scrape(self, client: httpx.Client) -> ScrapeOutcome:
        started = time.perf_counter()
        ts = self.clock()
        try:
            text = fetch_text(client, self.url + "/metrics", timeout_s=self.timeout_s, max_bytes=self.max_page_bytes)
            page = em.parse_engine_metrics(text, self.target.kind)
            if not page.engines:
                hint = ""
                looks_like = em.detect_kind(text)
                if self.target.kind not in ("auto", looks_like) and looks_like != "unknown":
                    hint = f" (configured kind {self.target.kind!r}, but the page looks like {looks_like!r})"
                raise ScrapeError(f"{self.url}/metrics: {'; '.join(page.warnings) or 'no engine metrics'}{hint}")
        except (ScrapeError, em.MetricsPageError) as exc:
            message = str(exc)
            if isinstance(exc, em.MetricsPageError):
                message = f"{self.url}/metrics: {message}"
            return ScrapeOutcome(self.url, self.role, ts, False, time.perf_counter() - started, error=message,
                                 kind=self.kind)
        return self._outcome(page, ts, started)

    def ingest_text(self, text: str, ts: float) -> ScrapeOutcome:
        """Parse an already-fetched page (benchmarks and tests)."""
        started = time.perf_counter()
        try:
            page = em.parse_engine_metrics(text, self.target.kind)
        except em.MetricsPageError as exc:
            return ScrapeOutcome(self.url, self.role, ts, False, time.perf_counter() - started, error=str(exc))
        return self._outcome(page, ts, started)

    def ingest_page(self, page: em.ParsedPage, ts: float) -> ScrapeOutcome:
        """An engine page read elsewhere (the Prometheus source, `collectors.prom_source`)."""
        return self._outcome(page, ts, time.perf_counter())

    def _outcome(self, page: em.ParsedPage, ts: float, started: float) -> ScrapeOutcome:
        self.kind = page.kind
        restarted = (page.process_start_ts is not None and self.prev_start is not None
                     and page.process_start_ts != self.prev_start)
        samples: list[tuple[str, str, float]] = []
        any_reset = restarted
        for label, snap in page.engines.items():
            result = em.interval_signals(self.prev.get(label), self.prev_ts, snap, ts, restarted=restarted,
                                         max_gap_s=self.max_gap_s)
            any_reset = any_reset or result.reset
            samples.extend((label, name, value) for name, value in result.values.items())
        self.prev = dict(page.engines)
        self.prev_ts = ts
        if page.process_start_ts is not None:
            self.prev_start = page.process_start_ts
        samples = self.checker.samples(samples)
        duration = time.perf_counter() - started
        samples.append(("", sig.UP, 1.0))
        samples.append(("", sig.SCRAPE_DURATION_S, duration))
        return ScrapeOutcome(self.url, self.role, ts, True, duration, kind=page.kind,
                             process_start_ts=page.process_start_ts, samples=samples,
                             engine_labels=tuple(page.engines), restarted=any_reset, warnings=page.warnings)


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

    def __init__(self, target: SidecarTarget, *, interval_s: float, timeout_s: float, max_page_bytes: int,
                 cursors: dict[str, LogCursor] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self.url = target.url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_page_bytes = max_page_bytes
        self.clock = clock
        self.cursors: dict[str, LogCursor] = {"decisions": LogCursor(), "audit": LogCursor(), "turns": LogCursor(),
                                              **(cursors or {})}
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
        return fetch_json(client, self.url + path, timeout_s=self.timeout_s, max_bytes=self.max_page_bytes,
                          headers=self._headers())

    def _typed(self, model: type[wire.Wire], doc: Any, path: str) -> Any:
        """`doc` unchanged; one warning (per document kind) when it drifts from its wire contract."""
        if "contract:" + path not in self.checker.warned:
            problem = docs.contract_problem(model, doc)
            if problem is not None:
                self.checker.warn_once("contract:" + path, f"{self.url}{path}: does not match sidecar.wire."
                                       f"{model.__name__} ({problem}); read field by field")
        return doc

    def _read_log(self, client: httpx.Client, name: str, path: str,
                  parse: Callable[[Mapping[str, Any]], dict[str, Any] | None], key: str,
                  model: type[wire.Wire], pages: int = 1) -> tuple[int, list[dict[str, Any]]]:
        """(epoch, entries after the committed cursor) of one incremental log (up to ``pages`` pages)."""
        cur = self.cursors[name]

        def read(after: int) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for _ in range(pages):
                page = self._get(client, f"{path}?after_id={after}&limit={self.PAGE}")
                docs_ = docs.require_list(turn_trace.turns_items(page), f"{self.url}{path}")
                out += [r for r in (self.checker.row(parse(self._typed(model, d, path)), path) for d in docs_) if r]
                if len(docs_) < self.PAGE or not out:
                    break
                after = out[-1]["remote_id"]
            return out

        if cur.after_id <= 0:
            return cur.epoch, [r for r in read(0) if r["remote_id"] > 0]
        rows = read(cur.after_id - 1)
        anchor = rows[0] if rows else None
        same = anchor is not None and anchor["remote_id"] == cur.after_id and anchor.get(key) == cur.key and (
            cur.ts is None or anchor["ts"] is None or abs(anchor["ts"] - cur.ts) < 1e-3)
        if same:
            return cur.epoch, [r for r in rows if r["remote_id"] > cur.after_id]
        self.checker.warn_once(f"{name}-reset:{cur.epoch}",
                               f"{self.url}{path}: entry {cur.after_id}, the last one stored, is "
                               f"{'gone' if anchor is None or anchor['remote_id'] != cur.after_id else 'different'}: "
                               "the sidecar's log restarted (state db wiped?); reading its new entries from id 1")
        return cur.epoch + 1, [r for r in read(0) if r["remote_id"] > 0]

    def _read_sessions(self, client: httpx.Client,
                       ts: float) -> tuple[list[dict[str, Any]], bool, float | None, str | None]:
        """(session rows, whether they are the full list, newest updated_at seen, where to resume)."""
        mark, resume = self.sessions_mark, self.sessions_next
        full = resume is None and (self.last_full_ts is None or ts - self.last_full_ts >= self.FULL_EVERY_S
                                   or mark is None)
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
                row = self.checker.row(docs.session_row(self._typed(wire.SessionDoc, d, "/sessions")), "/sessions")
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
            state = dict(docs.require_object(self._typed(wire.StateDoc, self._get(client, "/state"), "/state"),
                                             f"{self.url}/state"))
            started_at = docs.started_at(state)
            if started_at is not None and self.prev_started is not None and started_at != self.prev_started:
                self.sessions_mark = None  # a restarted sidecar: list everything again
            sessions, full, mark, resume = self._read_sessions(client, ts)
            subtrees = [r for r in (self.checker.row(docs.subtree_row(d), "/subtrees") for d in
                                    docs.require_list(self._get(client, "/subtrees"), f"{self.url}/subtrees")) if r]
            decision_epoch, decisions = self._read_log(client, "decisions", "/compaction/decisions",
                                                       docs.decision_row, "decision", wire.DecisionDoc)
            audit_epoch, audit = self._read_log(client, "audit", "/audit", docs.audit_row, "action", wire.AuditEntry)
            turns_epoch, turns = self._read_turns(client)
        except (ScrapeError, docs.SidecarPayloadError) as exc:
            return ScrapeOutcome(self.url, self.role, ts, False, time.perf_counter() - started, error=str(exc),
                                 kind="sidecar")
        outcome = self.outcome(state, sessions, subtrees, decisions, audit, ts, started)
        outcome.sessions_full, outcome.sessions_mark, outcome.sessions_next = full, mark, resume
        outcome.decision_epoch, outcome.audit_epoch = decision_epoch, audit_epoch
        outcome.turns, outcome.turns_epoch = turns, turns_epoch
        return outcome

    def _read_turns(self, client: httpx.Client) -> tuple[int, list[dict[str, Any]]]:
        """The turn trace after the committed cursor; a sidecar without /turns (older) has none."""
        try:
            return self._read_log(client, "turns", "/turns", turn_trace.turn_row, "outcome", wire.TurnDoc,
                                  pages=self.MAX_PAGES)
        except ScrapeError as exc:
            if "HTTP 404" not in str(exc):
                raise
            return self.cursors["turns"].epoch, []

    def commit(self, outcome: ScrapeOutcome) -> None:
        """The writer stored `outcome`: reading resumes after what it held."""
        for name, rows, epoch, key in (("decisions", outcome.decisions, outcome.decision_epoch, "decision"),
                                       ("audit", outcome.audit, outcome.audit_epoch, "action"),
                                       ("turns", outcome.turns, outcome.turns_epoch, "outcome")):
            cur = self.cursors[name]
            if not rows or (epoch, max(r["remote_id"] for r in rows)) <= (cur.epoch, cur.after_id):
                continue
            last = max(rows, key=lambda r: r["remote_id"])
            self.cursors[name] = LogCursor(epoch, last["remote_id"], last["ts"], last.get(key))
        if outcome.sessions is not None:
            if outcome.sessions_full or (outcome.sessions_next is not None and self.sessions_next is None):
                self.last_full_ts = outcome.ts  # (a listing too long for one scrape is not restarted)
            self.sessions_next = outcome.sessions_next
            if outcome.sessions_mark is not None and (self.sessions_mark is None
                                                      or outcome.sessions_mark > self.sessions_mark):
                self.sessions_mark = outcome.sessions_mark

    def outcome(self, state: dict[str, Any], sessions: list[dict[str, Any]], subtrees: list[dict[str, Any]],
                decisions: list[dict[str, Any]], audit: list[dict[str, Any]], ts: float,
                started: float) -> ScrapeOutcome:
        values = docs.state_signals(state)
        turns = docs.turns_total(state)
        started_at = docs.started_at(state)
        restarted = started_at is not None and self.prev_started is not None and started_at != self.prev_started
        rate = rates.counter_rate(self.prev_turns, self.prev_ts, turns, ts,
                                  max_gap_s=3 * self.interval_s + self.timeout_s + 1.0,
                                  prev_start=self.prev_started, cur_start=started_at)
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
        return ScrapeOutcome(self.url, self.role, ts, True, duration, kind="sidecar", samples=samples,
                             engine_labels=("",), restarted=restarted, state=state, sessions=sessions,
                             subtrees=subtrees, decisions=decisions, audit=audit,
                             warnings=tuple(str(w) for w in state.get("warnings") or () if isinstance(w, str)))
