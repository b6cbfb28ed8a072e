"""Sidecar benchmark: added latency vs direct, requests/s at 50 clients, 2,000 parked sessions held at once.

Run from the repository root:

    .venv/bin/python bench/bench_sidecar.py            # 5 runs (medians reported)
    .venv/bin/python bench/bench_sidecar.py --runs 3 --duration 3 --parked 500   # quicker

Processes (all on 127.0.0.1): the minimal stub engine (``python -m tests.stubs.stub_engine``, a raw asyncio
HTTP server), the sidecar (``python -m sidecar``, one uvicorn worker) and this load generator (raw
asyncio keep-alive HTTP/1.1 connections, so the client costs as little CPU as possible on a shared
2-core machine). Each run measures the same requests direct to the engine and through the sidecar,
back to back, so the baseline is measured in the same run. Requests are non-streaming chat completions
(``max_tokens`` 8) with one ``X-Session-Id`` per client, so every request goes through the budgeter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
OPERATOR = "bench-operator-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


@contextmanager
def process(
    cmd: list[str], ready: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    log = tempfile.NamedTemporaryFile(prefix="bench-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        wait_http(ready)
        yield proc
    except BaseException:
        print(Path(log.name).read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# ----------------------------------------------------------------------------- raw client


class Conn:
    """One keep-alive HTTP/1.1 connection; just enough protocol for these servers."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        head = [f"{method} {path} HTTP/1.1", f"host: {self.host}:{self.port}", f"content-length: {len(body)}"]
        if body:
            head.append("content-type: application/json")
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}")
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        hdrs = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                hdrs[k.strip().lower()] = v.strip()
        if "content-length" in hdrs:
            data = await self.reader.readexactly(int(hdrs["content-length"]))
        elif hdrs.get("transfer-encoding") == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(chunk[:-2])
            data = b"".join(parts)
        else:
            data = await self.reader.read()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def chat_body(client: int) -> bytes:
    return json.dumps(
        {
            "model": "stub-model",
            "max_tokens": 8,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant. " * 8},
                {"role": "user", "content": f"client {client}: what is the status of the fleet?"},
            ],
        }
    ).encode()


async def load(
    port: int, clients: int, *, requests_per_client: int | None, duration: float | None, warmup: float = 0.3
) -> tuple[list[float], float, int]:
    """(latencies in s after warm-up, requests/s over the measured span, errors)."""
    latencies: list[float] = []
    errors = 0
    start_measure = time.perf_counter() + warmup
    stop_at = None if duration is None else start_measure + duration
    done_measured = 0
    warm_requests = 0 if requests_per_client is None else max(1, requests_per_client // 10)
    first_measured = [float("inf")]

    async def one(i: int) -> None:
        nonlocal errors, done_measured
        conn = Conn("127.0.0.1", port)
        await conn.open()
        body = chat_body(i)
        headers = {"x-session-id": f"bench-{clients}-{i}"}
        n = 0
        try:
            while True:
                t0 = time.perf_counter()
                if stop_at is not None and t0 >= stop_at:
                    break
                if requests_per_client is not None and n >= requests_per_client:
                    break
                status, _ = await conn.request("POST", "/v1/chat/completions", body, headers)
                t1 = time.perf_counter()
                n += 1
                if status != 200:
                    errors += 1
                measured = n > warm_requests if requests_per_client is not None else t0 >= start_measure
                if measured:
                    latencies.append(t1 - t0)
                    done_measured += 1
                    first_measured[0] = min(first_measured[0], t0)
        finally:
            conn.close()

    t_begin = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(clients)))
    t_end = time.perf_counter()
    span = (stop_at or t_end) - max(start_measure, t_begin)
    if duration is None:
        span = t_end - first_measured[0]
    return latencies, (done_measured / span if span > 0 else 0.0), errors


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---------------------------------------------------------------------------- parked sessions


async def parked_test(sidecar_port: int, sidecar_pid: int, n: int) -> dict[str, float]:
    """Two scenarios on a sidecar with a 1,000-token pool.

    A (manual): n sessions admitted (mode off), parked by the operator one by one, then each sends its
    next turn: n requests held at once; RSS before/after gives memory per held request. Then every
    session is unparked through the API (50 calls in flight) and every held request must answer 200.
    B (automatic): n more sessions admitted under mode off; switching to budgeter-park puts nearly all
    of them above the high band, so their next turns are parked at the turn boundary; switching back
    to off releases them all at once (one control call).
    """
    base = f"http://127.0.0.1:{sidecar_port}"
    auth = {"Authorization": f"Bearer {OPERATOR}"}
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:
        sem = asyncio.Semaphore(50)

        async def limited(coro: Any) -> Any:
            async with sem:
                return await coro

        async def first_turn(sid: str, i: int) -> None:
            r = await client.post(
                "/v1/chat/completions",
                content=chat_body(i),
                headers={"X-Session-Id": sid, "content-type": "application/json"},
            )
            assert r.status_code == 200, r.text

        async def held_count() -> int:
            return int((await client.get("/state")).json()["backlog"]["held_requests"])

        async def hold_all(ids: list[str]) -> tuple[list[Conn], list[asyncio.Future[Any]], float, int]:
            """Send every session's next turn; wait until each is either held or answered."""
            conns = [Conn("127.0.0.1", sidecar_port) for _ in ids]
            for c in conns:
                await c.open()
            t0 = time.perf_counter()
            tasks = [
                asyncio.ensure_future(
                    c.request("POST", "/v1/chat/completions", chat_body(i), {"x-session-id": sid})
                )
                for i, (c, sid) in enumerate(zip(conns, ids, strict=True))
            ]
            while True:
                held = await held_count()
                if held + sum(1 for t in tasks if t.done()) >= len(ids):
                    return conns, tasks, time.perf_counter() - t0, held
                await asyncio.sleep(0.1)

        assert (await client.put("/control/budgeter", headers=auth, json={"mode": "off"})).status_code == 200
        manual = [f"manual-{i}" for i in range(n)]
        await asyncio.gather(*(limited(first_turn(sid, i)) for i, sid in enumerate(manual)))
        for sid in manual:
            assert (
                await limited(client.post(f"/control/sessions/{sid}/park", headers=auth))
            ).status_code == 200
        await asyncio.sleep(1.5)
        rss_before = rss_kib(sidecar_pid)
        conns, tasks, t_held, _ = await hold_all(manual)
        await asyncio.sleep(1.0)
        rss_held = rss_kib(sidecar_pid)
        state_t0 = time.perf_counter()
        await client.get("/state")
        state_ms = (time.perf_counter() - state_t0) * 1000
        t1 = time.perf_counter()
        await asyncio.gather(
            *(limited(client.post(f"/control/sessions/{sid}/unpark", headers=auth)) for sid in manual)
        )
        results = await asyncio.gather(*tasks)
        t_unpark = time.perf_counter() - t1
        ok_manual = sum(1 for status, _ in results if status == 200)
        for c in conns:
            c.close()

        await asyncio.gather(*(limited(client.delete(f"/sessions/{sid}")) for sid in manual))
        auto = [f"auto-{i}" for i in range(n)]
        await asyncio.gather(*(limited(first_turn(sid, i)) for i, sid in enumerate(auto)))
        r = await client.put("/control/budgeter", headers=auth, json={"mode": "budgeter-park"})
        assert r.status_code == 200
        conns, tasks, t_auto_held, park_set = await hold_all(auto)
        t2 = time.perf_counter()
        assert (await client.put("/control/budgeter", headers=auth, json={"mode": "off"})).status_code == 200
        results = await asyncio.gather(*tasks)
        t_mass = time.perf_counter() - t2
        ok_auto = sum(1 for status, _ in results if status == 200)
        for c in conns:
            c.close()
    return {
        "held": n,
        "answered_200": ok_manual,
        "seconds_to_hold_all": t_held,
        "rss_before_mib": rss_before / 1024,
        "rss_held_mib": rss_held / 1024,
        "kib_per_held_request": (rss_held - rss_before) / n,
        "seconds_to_unpark_all": t_unpark,
        "state_ms_with_all_held": state_ms,
        "auto_parked": park_set,
        "auto_answered_200": ok_auto,
        "seconds_to_park_auto": t_auto_held,
        "seconds_mass_release": t_mass,
    }


# ------------------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--single-requests", type=int, default=1000, help="requests per run at 1 client")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per run at 50 clients")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--parked", type=int, default=2000)
    p.add_argument(
        "--engine-transport",
        default="fast",
        choices=["fast", "httpcore"],
        help="the sidecar's transport to the engine (httpcore: httpx's default, for comparison)",
    )
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    engine_port, sidecar_port = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sidecar-"))
    engine_cmd = [PYTHON, "-m", "tests.stubs.stub_engine", "--port", str(engine_port)]
    sidecar_cmd = [
        PYTHON,
        "-m",
        "sidecar",
        "--engine",
        f"http://127.0.0.1:{engine_port}",
        "--port",
        str(sidecar_port),
        "--state-db",
        str(tmp / "sidecar.db"),
        "--pool-tokens",
        "100000000",
        "--log-level",
        "warning",
        "--engine-transport",
        args.engine_transport,
    ]
    results: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    with (
        process(engine_cmd, f"http://127.0.0.1:{engine_port}/v1/models"),
        process(
            sidecar_cmd,
            f"http://127.0.0.1:{sidecar_port}/healthz",
            env={"PREFIXOPS_OPERATOR_TOKEN": OPERATOR},
        ) as sidecar,
    ):
        asyncio.run(load(sidecar_port, args.clients, requests_per_client=20, duration=None, warmup=0))
        for run in range(args.runs):
            for target, port in (("direct", engine_port), ("sidecar", sidecar_port)):
                lat, _, err = asyncio.run(
                    load(port, 1, requests_per_client=args.single_requests, duration=None, warmup=0.2)
                )
                add(f"{target}_1_p50_ms", pct(lat, 0.5) * 1000)
                add(f"{target}_1_p99_ms", pct(lat, 0.99) * 1000)
                cpu0 = cpu_seconds(sidecar.pid)
                lat, rps, err50 = asyncio.run(
                    load(port, args.clients, requests_per_client=None, duration=args.duration)
                )
                if target == "sidecar":
                    # CPU of the sidecar process per request (warm-up included in both numbers)
                    add(
                        "sidecar_cpu_ms_per_request",
                        (cpu_seconds(sidecar.pid) - cpu0) * 1000 / max(1, len(lat) + int(rps * 0.3)),
                    )
                add(f"{target}_50_p50_ms", pct(lat, 0.5) * 1000)
                add(f"{target}_50_p99_ms", pct(lat, 0.99) * 1000)
                add(f"{target}_50_rps", rps)
                add(f"{target}_errors", err + err50)
            print(
                f"run {run + 1}/{args.runs}: "
                + ", ".join(f"{k}={v[-1]:.2f}" for k, v in sorted(results.items())),
                flush=True,
            )
        sidecar_rss_mib = rss_kib(sidecar.pid) / 1024
        parked: dict[str, float] = {}
        if args.parked:
            park_port = free_port()
            park_cmd = [
                PYTHON,
                "-m",
                "sidecar",
                "--engine",
                f"http://127.0.0.1:{engine_port}",
                "--port",
                str(park_port),
                "--state-db",
                str(tmp / "parked.db"),
                "--pool-tokens",
                "1000",
                "--log-level",
                "warning",
            ]
            with process(
                park_cmd, f"http://127.0.0.1:{park_port}/healthz", env={"PREFIXOPS_OPERATOR_TOKEN": OPERATOR}
            ) as park_sidecar:
                parked = asyncio.run(parked_test(park_port, park_sidecar.pid, args.parked))

    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print(
        f"sidecar benchmark (engine transport: {args.engine_transport}): {args.runs} runs, medians (1 client: {args.single_requests} requests/run; "
        f"{args.clients} clients: {args.duration:g} s/run); one uvicorn worker; {os.cpu_count()} CPUs"
    )
    print(f"{'':28}{'direct':>10}{'sidecar':>10}{'added':>10}{'ratio':>8}")
    for key, label in (
        ("1_p50_ms", "1 client p50 (ms)"),
        ("1_p99_ms", "1 client p99 (ms)"),
        ("50_p50_ms", f"{args.clients} clients p50 (ms)"),
        ("50_p99_ms", f"{args.clients} clients p99 (ms)"),
    ):
        d, s = med[f"direct_{key}"], med[f"sidecar_{key}"]
        print(f"{label:28}{d:10.3f}{s:10.3f}{s - d:10.3f}{s / d:8.2f}")
    d, s = med["direct_50_rps"], med["sidecar_50_rps"]
    print(f"{f'{args.clients} clients requests/s':28}{d:10.0f}{s:10.0f}{'':10}{s / d:8.2f}")
    print(f"errors: direct {med['direct_errors']:.0f}, sidecar {med['sidecar_errors']:.0f} (median per run)")
    print(
        f"sidecar CPU per proxied request at {args.clients} clients: {med['sidecar_cpu_ms_per_request']:.2f} ms "
        f"(capacity of one worker on one free core: ~{1000 / med['sidecar_cpu_ms_per_request']:.0f} requests/s)"
    )
    print(
        f"targets: added p50 at 1 client <= 1 ms: {med['sidecar_1_p50_ms'] - med['direct_1_p50_ms']:.3f} ms; "
        f">= 300 requests/s at 50 clients: {med['sidecar_50_rps']:.0f}"
    )
    print(
        "reference (issue 4, same kind of machine and stub): LiteLLM proxy 1 worker ~13 ms added, ~90 req/s; "
        "bare Starlette + httpx ~1.2 ms added, ~270 req/s"
    )
    print(
        f"ratio to references: {med['sidecar_50_rps'] / 90:.1f}x LiteLLM's req/s, "
        f"{med['sidecar_50_rps'] / 270:.2f}x bare Starlette+httpx req/s"
    )
    if parked:
        print()
        print(
            f"parked sessions held at once: {parked['held']:.0f} (all answered 200 after unpark: "
            f"{parked['answered_200']:.0f})"
        )
        print(
            f"  sidecar RSS {parked['rss_before_mib']:.1f} MiB before the holds, {parked['rss_held_mib']:.1f} MiB "
            f"with all held: {parked['kib_per_held_request']:.1f} KiB per held request"
        )
        print(
            f"  {parked['seconds_to_hold_all']:.2f} s until all were held; {parked['seconds_to_unpark_all']:.2f} s "
            f"to unpark all through the API (50 calls in flight) and answer them; GET /state with all held: "
            f"{parked['state_ms_with_all_held']:.1f} ms"
        )
        print(
            f"automatic parking: {parked['auto_parked']:.0f} sessions parked at their turn boundary "
            f"({parked['seconds_to_park_auto']:.2f} s until all held); one mode switch released them all in "
            f"{parked['seconds_mass_release']:.2f} s, {parked['auto_answered_200']:.0f} answered 200"
        )
    print(f"sidecar RSS at the end: {sidecar_rss_mib:.1f} MiB")
    print(json.dumps({"medians": med, "parked": parked}, sort_keys=True))


if __name__ == "__main__":
    main()
