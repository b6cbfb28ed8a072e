"""Scrapers through httpx.MockTransport: every expected failure is a failed scrape with a reason."""

from __future__ import annotations

import json

import httpx
import pytest

from collectors import sidecar_docs as docs
from collectors.config import EngineTarget, SidecarTarget
from collectors.scrape import EngineScraper
from collectors.scrape_sidecar import SidecarScraper
from core import signals as sig
from tests.support import ENGINE_METRICS, FakeClock

VLLM = (ENGINE_METRICS / "vllm-0.33.0-statlogger.prom").read_text()


def engine_scraper(clock=None, kind="auto") -> EngineScraper:
    return EngineScraper(
        EngineTarget("http://engine:8000", kind=kind),
        interval_s=1.0,
        timeout_s=0.5,
        max_page_bytes=1_000_000,
        clock=clock or FakeClock(1000.0),
    )


def client_for(handler) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def test_engine_scrape_of_the_vllm_fixture():
    out = engine_scraper().scrape(client_for(lambda r: httpx.Response(200, text=VLLM)))
    assert out.ok and out.kind == "vllm" and out.engine_labels == ("0",)
    values = {(label, name): v for label, name, v in out.samples}
    assert values[("0", sig.KV_USAGE)] == pytest.approx(0.6013157894736842)
    assert values[("0", sig.REQUESTS_RUNNING)] == 7 and values[("0", sig.POOL_TOKENS)] == 12160
    assert values[("0", sig.BLOCK_SIZE)] == 16  # cache_config_info block_size, for core.attribution
    assert values[("", sig.UP)] == 1.0 and ("", sig.SCRAPE_DURATION_S) in values
    assert ("0", sig.ENGINE_HIT_RATIO) not in values  # one scrape: no rate yet
    assert out.process_start_ts == 1.79593527806e09


def test_an_engine_sample_is_stamped_when_the_engine_answered():
    """Not when the request left: an engine that reads its counters late (a simulated one waits for its
    step, up to ~75 ms) would have its interval paired with turns recorded that much earlier."""
    clock = FakeClock(1000.0)

    def slow(request):
        clock.advance(0.075)  # the engine reads its counters, and answers
        return httpx.Response(200, text=VLLM)

    out = engine_scraper(clock).scrape(client_for(slow))
    assert out.ok and out.ts == 1000.075
    clock.advance(1.0)

    def refused(request):
        clock.advance(0.5)
        raise httpx.ConnectError("[Errno 111] Connection refused")

    failed = engine_scraper(clock).scrape(client_for(refused))
    assert not failed.ok and failed.ts == 1001.075  # no answer: the time the scrape began


def _raise(exc):
    def handler(request):
        raise exc

    return handler


@pytest.mark.parametrize(
    ("handler", "reason"),
    [
        (_raise(httpx.ConnectError("[Errno 111] Connection refused")), "connection refused"),
        (_raise(httpx.ReadTimeout("timed out")), "timeout after 0.5 s"),
        (lambda r: httpx.Response(500, text="Internal Server Error"), "HTTP 500"),
        (lambda r: httpx.Response(200, text="<html><body>Bad Gateway</body></html>"), "HTML page"),
        (
            lambda r: httpx.Response(200, text=VLLM[:5000] + '\nvllm:kv_cache_usage_perc{engine="0",mo'),
            "malformed",
        ),
        (lambda r: httpx.Response(200, text="x" * 2_000_000), "larger than 1000000 bytes"),
        (lambda r: httpx.Response(200, text=""), "empty page"),
        (lambda r: httpx.Response(200, text="# only comments\n"), "no vLLM or SGLang"),
    ],
)
def test_engine_failures_are_one_line_reasons(handler, reason):
    out = engine_scraper().scrape(client_for(handler))
    assert not out.ok and reason in out.error and "\n" not in out.error
    assert "http://engine:8000" in out.error


def test_rates_across_scrapes_reset_and_restart():
    clock = FakeClock(1000.0)
    scraper = engine_scraper(clock)
    pages = iter(
        [
            'process_start_time_seconds 1\nvllm:prefix_cache_queries_total{engine="0"} 1000\nvllm:prefix_cache_hits_total{engine="0"} 500\n',
            'process_start_time_seconds 1\nvllm:prefix_cache_queries_total{engine="0"} 3000\nvllm:prefix_cache_hits_total{engine="0"} 2100\n',
            # counters went down: no rate for this interval
            'process_start_time_seconds 1\nvllm:prefix_cache_queries_total{engine="0"} 10\nvllm:prefix_cache_hits_total{engine="0"} 5\n',
            'process_start_time_seconds 1\nvllm:prefix_cache_queries_total{engine="0"} 1010\nvllm:prefix_cache_hits_total{engine="0"} 905\n',
            # restarted (start time changed) and already counted past the old value: still no rate
            'process_start_time_seconds 2\nvllm:prefix_cache_queries_total{engine="0"} 5000\nvllm:prefix_cache_hits_total{engine="0"} 1000\n',
        ]
    )
    client = client_for(lambda r: httpx.Response(200, text=next(pages)))
    results = []
    for _ in range(5):
        out = scraper.scrape(client)
        results.append(({name: v for label, name, v in out.samples if label == "0"}, out.restarted))
        clock.t += 1.0
    assert sig.ENGINE_HIT_RATIO not in results[0][0]
    assert results[1][0][sig.ENGINE_HIT_RATIO] == pytest.approx(0.8)
    assert results[1][0][sig.PREFIX_CACHE_QUERIES_PER_S] == pytest.approx(2000)
    assert sig.ENGINE_HIT_RATIO not in results[2][0] and results[2][1]
    assert results[3][0][sig.ENGINE_HIT_RATIO] == pytest.approx(0.9)
    assert sig.PREFIX_CACHE_QUERIES_PER_S not in results[4][0] and results[4][1]


def test_gap_after_downtime_gives_no_averaged_rate():
    clock = FakeClock(1000.0)
    scraper = engine_scraper(clock)
    page = iter(
        [
            'vllm:prefix_cache_queries_total{engine="0"} 100\n',
            'vllm:prefix_cache_queries_total{engine="0"} 900\n',
        ]
    )
    client = client_for(lambda r: httpx.Response(200, text=next(page)))
    scraper.scrape(client)
    clock.t += 60.0
    out = scraper.scrape(client)
    assert sig.PREFIX_CACHE_QUERIES_PER_S not in {name for _, name, _ in out.samples}


# ------------------------------------------------------------------ sidecar


def sidecar_handler(state, *, sessions=None, status=200, token=None, decisions=(), audit=(), turns=()):
    def handler(request: httpx.Request) -> httpx.Response:
        if token and request.headers.get("Authorization") != f"Bearer {token}":
            return httpx.Response(401, json={"error": "viewer token required"})
        path = request.url.path
        after = int(request.url.params.get("after_id", "0"))
        body = {
            "/state": state,
            "/sessions": sessions if sessions is not None else [],
            "/subtrees": [],
            "/compaction/decisions": [d for d in decisions if d["id"] > after],
            "/audit": [a for a in audit if a["id"] > after],
            "/turns": turns_page(turns, after, int(request.url.params.get("limit", "1000"))),
        }[path]
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    return handler


def turns_page(turns, after: int, limit: int) -> dict:
    page = [t for t in turns if t["id"] > after][:limit]
    return {"turns": page, "next_after_id": page[-1]["id"] if page else after}


def sidecar_scraper(clock=None, token=None) -> SidecarScraper:
    return SidecarScraper(
        SidecarTarget("http://sidecar:8100", viewer_token=token),
        interval_s=1.0,
        timeout_s=0.5,
        max_page_bytes=1_000_000,
        clock=clock or FakeClock(1000.0),
    )


FULL_STATE = {
    "started_at": 5.0,
    "reuse": {
        "token_weighted": 0.12,
        "request_weighted": 0.9,
        "divergence": 0.78,
        "regime": "thin-reuse",
        "window_s": 60,
        "low_cached_fraction": 0.8,
    },
    "budgeter": {
        "mode": "budgeter-park",
        "low": 0.75,
        "high": 0.95,
        "pool_tokens": 400000,
        "demand_tokens": 300000,
    },
    "backlog": {"admitted": 10, "parked": 3, "waiting": 4},
    "traffic": {"turns_total": 100},
    "compaction": {"deferred_until": 123.0},
    "warnings": ["PREFIXOPS_OPERATOR_TOKEN is not set"],
}


def test_sidecar_signals_and_incremental_entries():
    clock = FakeClock(1000.0)
    state = json.loads(json.dumps(FULL_STATE))
    decisions = [{"id": 1, "ts": 1.0, "subtree_id": "a", "decision": "granted", "regime": "thin-reuse"}]
    audit = [{"id": 1, "ts": 1.0, "actor": "op", "action": "park", "params": {"session": "s1"}, "after": {}}]
    scraper = sidecar_scraper(clock, token="tok")
    client = client_for(
        sidecar_handler(
            state,
            sessions=[{"id": "s1", "state": "parked", "context_tokens": "many"}],
            token="tok",
            decisions=decisions,
            audit=audit,
        )
    )
    first = scraper.scrape(client)
    assert first.ok, first.error
    values = {name: v for _, name, v in first.samples}
    assert values[sig.DIVERGENCE] == 0.78 and values[sig.THIN_REUSE] == 1.0
    assert values[sig.DEMAND_FRACTION] == pytest.approx(0.75) and values[sig.SESSIONS_IN_SYSTEM] == 17
    assert values[sig.LOW_HALF_CACHED_FRACTION] == 0.8 and sig.TURNS_PER_S not in values
    assert first.sessions[0]["context_tokens"] is None  # mistyped field: None, not a crash
    assert [d["remote_id"] for d in first.decisions] == [1] and first.decisions[0]["granted"]
    state["traffic"]["turns_total"] = 103
    clock.t += 2.0
    second = scraper.scrape(client)
    assert {name: v for _, name, v in second.samples}[sig.TURNS_PER_S] == pytest.approx(1.5)
    # Not committed yet (the writer has not stored `first`): the same entries are read again.
    assert [d["remote_id"] for d in second.decisions] == [1] and [a["remote_id"] for a in second.audit] == [1]
    scraper.commit(first)
    third = scraper.scrape(client)
    assert third.decisions == [] and third.audit == []  # nothing new: no duplicates


def test_sidecar_missing_fields_are_none_not_a_crash():
    out = sidecar_scraper().scrape(client_for(sidecar_handler({"reuse": {"token_weighted": "n/a"}})))
    assert out.ok
    assert {name for _, name, _ in out.samples} == {sig.UP, sig.SCRAPE_DURATION_S}


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ('{"reuse": {"token_weighted": 0.5,', "malformed JSON"),
        ([1, 2, 3], "expected a JSON object"),
    ],
)
def test_sidecar_malformed_json_is_a_failed_scrape(state, reason):
    out = sidecar_scraper().scrape(client_for(sidecar_handler(state)))
    assert not out.ok and reason in out.error and "http://sidecar:8100/state" in out.error


def test_sidecar_without_token_says_what_to_set():
    out = sidecar_scraper().scrape(client_for(sidecar_handler(FULL_STATE, token="secret")))
    assert not out.ok and "HTTP 401" in out.error and "viewer_token" in out.error


def test_state_meta_and_rows_are_defensive():
    assert docs.state_meta({}) == {
        "regime": None,
        "budgeter_mode": None,
        "compaction_deferred_until": None,
        "warnings": None,
    }
    assert docs.session_row({"state": "admitted"}) is None
    assert docs.decision_row({"id": "x"}) is None
    assert docs.audit_row({"id": 3, "params": 7})["params"] == {"value": 7}
    assert docs.num(float("nan")) is None and docs.num(True) is None and docs.num(3) == 3.0


def test_a_trickling_page_is_cut_off():
    class Trickle(httpx.SyncByteStream):
        def __iter__(self):
            import time as _time

            for _ in range(50):
                _time.sleep(0.05)
                yield b"# x\n"

    out = engine_scraper().scrape(client_for(lambda r: httpx.Response(200, stream=Trickle())))
    assert not out.ok and "too slowly" in out.error


def test_forced_kind_that_does_not_match_the_page_says_so():
    sglang = (ENGINE_METRICS / "sglang-0.5.23-collectors.prom").read_text()
    out = engine_scraper(kind="vllm").scrape(client_for(lambda r: httpx.Response(200, text=sglang)))
    assert not out.ok and "configured kind 'vllm', but the page looks like 'sglang'" in out.error
