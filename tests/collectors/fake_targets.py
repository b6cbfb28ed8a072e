"""Fake engine and sidecar HTTP targets for collector tests, with fault injection.

`FakeEngine` serves vLLM-style /metrics whose counters advance on every scrape
(``queries_step`` tokens queried, ``hits_step`` of them hits), or a fixed text
(``static_text``). Faults: ``mode`` = "ok" | "garbage" | "html" | "truncated" | "nan" |
"slow" | "error500" | "huge"; `stop()` / `start()` make it refuse connections and come back
on the same port; `restart()` resets counters and changes process_start_time_seconds.

`FakeSidecar` serves /state, /sessions, /subtrees, /compaction/decisions and /audit
(ascending ids, ``after_id``), optionally requiring a viewer token; ``mode="badjson"``
serves malformed JSON. /sessions follows the sidecar's contract: the whole list, or with
``updated_after`` / ``limit`` / ``cursor`` one page ``{"sessions": [...], "next": CURSOR or
null}`` in ascending ``(updated_at, id)`` order (``paged=False`` serves the old list form
only). `wipe()` is a sidecar whose state db was deleted: its logs number from 1 again.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class _Server:
    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.requests = 0
        self.bytes_sent = 0
        self.paths: list[str] = []
        self.mode = "ok"
        self.slow_s = 5.0
        self._conns: set[Any] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handle(
        self, path: str, query: dict[str, list[str]], headers: Any, mode: str
    ) -> tuple[int, str, bytes]:
        raise NotImplementedError

    def start(self) -> _Server:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                owner._conns.add(self.connection)

            def finish(self) -> None:
                owner._conns.discard(self.connection)
                super().finish()

            def do_GET(self) -> None:  # noqa: N802
                owner.requests += 1
                parts = urlsplit(self.path)
                mode = owner.mode  # as it was when the request arrived
                if mode == "slow":
                    time.sleep(owner.slow_s)
                try:
                    status, ctype, body = owner.handle(parts.path, parse_qs(parts.query), self.headers, mode)
                except Exception as exc:  # pragma: no cover - shows up as a 500 in the collector
                    status, ctype, body = 500, "text/plain", repr(exc).encode()
                owner.bytes_sent += len(body)
                owner.paths.append(self.path)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop kept-alive connections: clients now get 'connection refused'."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        for conn in list(self._conns):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()
        self._conns.clear()

    def __enter__(self) -> _Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FakeEngine(_Server):
    def __init__(
        self,
        port: int = 0,
        *,
        queries_step: float = 1000.0,
        hits_step: float = 800.0,
        engines: tuple[str, ...] = ("0",),
        static_text: str | None = None,
    ) -> None:
        super().__init__(port)
        self.queries_step = queries_step
        self.hits_step = hits_step
        self.engines = engines
        self.static_text = static_text
        self.process_start = 1_700_000_000.0
        self.queries = 0.0
        self.hits = 0.0
        self.generation = 0.0
        self.running = 3.0
        self.waiting = 1.0
        self.kv_usage = 0.42
        self.lock = threading.Lock()

    def restart(self) -> None:
        with self.lock:
            self.queries = self.hits = self.generation = 0.0
            self.process_start += 100.0

    def page(self) -> str:
        with self.lock:
            self.queries += self.queries_step
            self.hits += self.hits_step
            self.generation += 100.0
            q, h, g = self.queries, self.hits, self.generation
        lines = [
            "# HELP process_start_time_seconds Start time.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.process_start}",
        ]
        families = [
            ("vllm:num_requests_running", "gauge", self.running),
            ("vllm:num_requests_waiting", "gauge", self.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", self.kv_usage),
            ("vllm:prefix_cache_queries_total", "counter", q),
            ("vllm:prefix_cache_hits_total", "counter", h),
            ("vllm:prompt_tokens_total", "counter", q),
            ("vllm:generation_tokens_total", "counter", g),
            ("vllm:num_preemptions_total", "counter", 0.0),
        ]
        for name, kind, value in families:
            lines += [f"# HELP {name} x", f"# TYPE {name} {kind}"]
            for e in self.engines:
                lines.append(f'{name}{{engine="{e}",model_name="m"}} {value}')
                if kind == "counter":
                    created = name.removesuffix("_total") + "_created"
                    lines.append(f'{created}{{engine="{e}",model_name="m"}} {self.process_start}')
        lines += ["# HELP vllm:cache_config_info x", "# TYPE vllm:cache_config_info gauge"]
        for e in self.engines:
            lines.append(
                f'vllm:cache_config_info{{block_size="16",engine="{e}",kv_cache_size_tokens="400000",'
                f'num_gpu_blocks="25000"}} 1.0'
            )
        return "\n".join(lines) + "\n"

    def handle(
        self, path: str, query: dict[str, list[str]], headers: Any, mode: str
    ) -> tuple[int, str, bytes]:
        if not path.endswith("/metrics"):  # any prefix: one server can stand in for many targets
            return 404, "text/plain", b"not found"
        if mode == "slow":
            return 200, "text/plain", b"# too late\n"  # the client has given up; counters do not advance
        if mode == "error500":
            return 500, "text/plain", b"Internal Server Error"
        if mode == "html":
            return 200, "text/html", b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>"
        if mode == "garbage":
            return 200, "text/plain", b'vllm:num_requests_running{engine="0" 7 7 7 oops\n\x00\x01garbage'
        if mode == "truncated":
            text = self.static_text or self.page()
            return (
                200,
                "text/plain",
                text[: len(text) // 2].rsplit("\n", 1)[0].encode()
                + b'\nvllm:kv_cache_usage_perc{engine="0",mod',
            )
        if mode == "huge":
            return 200, "text/plain", b"# comment\n" * 3_000_000
        text = self.static_text if self.static_text is not None else self.page()
        if mode == "nan":
            text = text.replace(
                'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42',
                'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN',
            )
        return 200, "text/plain; version=0.0.4", text.encode()


def session_doc(sid: str, state: str, context_tokens: int, **extra: Any) -> dict[str, Any]:
    """A /sessions document with every field sidecar.wire.SessionDoc requires."""
    now = time.time()
    doc: dict[str, Any] = {
        "id": sid,
        "state": state,
        "context_tokens": context_tokens,
        "turns": 1,
        "manual": False,
        "pinned": False,
        "held": 0,
        "in_flight": 0,
        "demand_tokens": context_tokens,
        "output_budget": 1024,
        "last_cached_fraction": 0.5,
        "prompt_tokens": context_tokens,
        "cached_tokens": 0,
        "failed_turns": 0,
        "arrived_at": now,
        "last_activity": now,
        "updated_at": now,
    }
    doc.update(extra)
    return doc


class FakeSidecar(_Server):
    def __init__(
        self, port: int = 0, *, engine_url: str = "http://127.0.0.1:1", viewer_token: str | None = None
    ) -> None:
        super().__init__(port)
        self.engine_url = engine_url
        self.viewer_token = viewer_token
        self.started_at = time.time()
        self.turns_total = 0
        self.turns_step = 2
        self.state_overrides: dict[str, Any] = {}
        self.sessions: list[dict[str, Any]] = [
            session_doc("s1", "admitted", 12000, turns=4, last_cached_fraction=0.9),
            session_doc("s2", "parked", 30000, turns=9, manual=True, last_cached_fraction=0.1),
        ]
        self.subtrees: list[dict[str, Any]] = [
            {
                "id": "sys-a",
                "recent_hits": 12,
                "warm": True,
                "pinned_under_pressure": True,
                "last_seen": time.time(),
            }
        ]
        self.decisions: list[dict[str, Any]] = []
        self.audit: list[dict[str, Any]] = []
        self.divergence = 0.1
        self.paged = True
        now = time.time()
        for s in self.sessions:
            s.setdefault("updated_at", now)

    def set_sessions(self, n: int, *, state: str = "admitted", prefix: str = "agent") -> None:
        """Replace the sessions by `n` fresh ones (updated now)."""
        now = time.time()
        self.sessions = [session_doc(f"{prefix}-{i}", state, 1000 + i, updated_at=now) for i in range(n)]

    def wipe(self) -> None:
        """The sidecar restarted with its state db deleted: empty logs whose ids start at 1 again."""
        self.decisions, self.audit = [], []
        self.started_at = time.time()

    def add_decision(self, decision: str, regime: str = "normal", subtree: str = "sys-a") -> None:
        self.decisions.append(
            {
                "id": len(self.decisions) + 1,
                "ts": time.time(),
                "request_id": "r",
                "subtree_id": subtree,
                "decision": decision,
                "reason": "test",
                "urgency": "normal",
                "regime": regime,
                "request_reason": "",
                "warm": False,
                "recent_hits": 0,
                "recent_cached_tokens": 0,
            }
        )

    def add_audit(self, action: str) -> None:
        self.audit.append(
            {
                "id": len(self.audit) + 1,
                "ts": time.time(),
                "actor": "op",
                "role": "operator",
                "action": action,
                "params": {"x": 1},
                "before": {},
                "after": {"y": 2},
            }
        )

    def state(self) -> dict[str, Any]:
        self.turns_total += self.turns_step
        rt = 0.8 - self.divergence / 2
        # Every field sidecar.wire.StateDoc requires (tests/collectors/test_sessions_incremental.py checks).
        doc: dict[str, Any] = {
            "ts": time.time(),
            "started_at": self.started_at,
            "engine": self.engine_url,
            "read_only": False,
            "restored": False,
            "reuse": {
                "token_weighted": rt,
                "request_weighted": rt + self.divergence,
                "divergence": self.divergence,
                "regime": "thin-reuse" if self.divergence >= 0.5 else "normal",
                "window_s": 60.0,
                "low_cached_fraction": 0.25,
                "known_turns": 50,
                "regime_enter": 0.5,
                "regime_exit": 0.4,
                "regime_min_turns": 20,
            },
            "reuse_last_turns": {"n": 100},
            "budgeter": {
                "mode": "budgeter-park",
                "low": 0.75,
                "high": 0.95,
                "pool_tokens": 400000,
                "demand_tokens": 200000,
                "demand_fraction": 0.5,
                "acting": False,
                "session_cap": 0,
                "latency_limit_s": 30.0,
                "default_output_budget": 1024,
                "park_set": 1,
            },
            "backlog": {"admitted": 5, "parked": 1, "waiting": 2, "total": 8, "held_requests": 0},
            "traffic": {
                "turns_total": self.turns_total,
                "in_flight": 0,
                "unknown_turns_total": 0,
                "engine_errors_total": 0,
                "unsessioned_in_flight": 0,
                "unsessioned_requests_total": 0,
                "unsessioned_turns_in_window": 0,
            },
            "compaction": {
                "deferred_until": None,
                "granted_total": 0,
                "deferred_total": 0,
                "top_k_pinned": 8,
                "warmth_floor": 2,
                "warmth_window_s": 600.0,
            },
            "warnings": [],
        }
        for dotted, value in self.state_overrides.items():
            node = doc
            *parents, leaf = dotted.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        return doc

    def sessions_body(self, query: dict[str, list[str]]) -> Any:
        if not self.paged or not ({"updated_after", "limit", "cursor"} & set(query)):
            return self.sessions
        items = sorted(self.sessions, key=lambda s: (s["updated_at"], s["id"]))
        if "updated_after" in query:
            bound = float(query["updated_after"][0])
            items = [s for s in items if s["updated_at"] > bound]
        if "cursor" in query:
            ts_text, _, sid = query["cursor"][0].partition(":")
            after = (float(ts_text), sid)
            items = [s for s in items if (s["updated_at"], s["id"]) > after]
        limit = int(query.get("limit", ["1000"])[0])
        page = items[:limit]
        more = len(items) > limit
        return {"sessions": page, "next": f"{page[-1]['updated_at']!r}:{page[-1]['id']}" if more else None}

    def handle(
        self, path: str, query: dict[str, list[str]], headers: Any, mode: str
    ) -> tuple[int, str, bytes]:
        if self.viewer_token and headers.get("Authorization") != f"Bearer {self.viewer_token}":
            return 401, "application/json", b'{"error": "viewer token required"}'
        if mode == "badjson":
            return 200, "application/json", b'{"reuse": {"token_weighted": 0.5,'
        if mode == "wrongshape" and path == "/state":
            return 200, "application/json", b"[1, 2, 3]"
        after = int(query.get("after_id", ["0"])[0])
        if path == "/state":
            body: Any = self.state()
        elif path == "/sessions":
            body = self.sessions_body(query)
        elif path == "/subtrees":
            body = self.subtrees
        elif path == "/compaction/decisions":
            body = [d for d in self.decisions if d["id"] > after]
        elif path == "/audit":
            body = [a for a in self.audit if a["id"] > after]
        else:
            return 404, "application/json", b'{"error": "not found"}'
        return 200, "application/json", json.dumps(body).encode()
