"""A synthetic vLLM fleet on one port, for the Prometheus-as-a-source bench and tests.

    python bench/fleet_exporter.py --port 9500 --engines 1000

- ``GET /metrics``: every engine's vLLM series on one page, each carrying its own
  ``instance="engine-<i>:8000"`` label (scrape it with ``honor_labels: true``: 1,000 engine label sets
  behind one Prometheus target).
- ``GET /engine/<i>/metrics``: engine i alone, as vLLM serves it (the direct-scrape baseline).

Counters grow linearly with wall time from the process start, so every reader sees the same rates:
engine i queries ``1000 * (1 + i % 5)`` prefix-cache tokens per second with hit ratio
``0.5 + (i % 10) / 20``, generates ``50 * (1 + i % 3)`` tokens per second; gauges are constant.
"""

from __future__ import annotations

import argparse
import asyncio
import time

START = time.time()


def hit_ratio(i: int) -> float:
    return 0.5 + (i % 10) / 20


def engine_lines(i: int, now: float, *, instance: bool) -> list[str]:
    t = now - START
    inst = f',instance="engine-{i}:8000"' if instance else ""
    lab = f'engine="0",model_name="m"{inst}'
    queries = 1000.0 * (1 + i % 5) * t
    hits = queries * hit_ratio(i)
    gen = 50.0 * (1 + i % 3) * t
    lines = [
        f"vllm:prefix_cache_queries_total{{{lab}}} {queries:.1f}",
        f"vllm:prefix_cache_hits_total{{{lab}}} {hits:.1f}",
        f"vllm:prompt_tokens_total{{{lab}}} {queries:.1f}",
        f"vllm:generation_tokens_total{{{lab}}} {gen:.1f}",
        f"vllm:num_preemptions_total{{{lab}}} 0",
        f"vllm:kv_cache_usage_perc{{{lab}}} {0.3 + (i % 7) / 10:.2f}",
        f"vllm:num_requests_running{{{lab}}} {4 + i % 3}",
        f"vllm:num_requests_waiting{{{lab}}} {i % 4}",
        f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{10000 + i}",{lab}}} 1',
    ]
    for le, share in (("0.1", 0.2), ("0.5", 0.7), ("1.0", 0.9), ("+Inf", 1.0)):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",{lab}}} {share * t:.1f}')
    process = f'{{instance="engine-{i}:8000"}}' if instance else ""
    lines.append(f"process_start_time_seconds{process} {START:.3f}")
    return lines


HEADER = [
    "# TYPE vllm:prefix_cache_queries counter",
    "# TYPE vllm:prefix_cache_hits counter",
    "# TYPE vllm:prompt_tokens counter",
    "# TYPE vllm:generation_tokens counter",
    "# TYPE vllm:num_preemptions counter",
    "# TYPE vllm:kv_cache_usage_perc gauge",
    "# TYPE vllm:num_requests_running gauge",
    "# TYPE vllm:num_requests_waiting gauge",
    "# TYPE vllm:cache_config_info gauge",
    "# TYPE vllm:time_to_first_token_seconds histogram",
    "# TYPE process_start_time_seconds gauge",
]


def fleet_page(n: int) -> bytes:
    now = time.time()
    lines = list(HEADER)
    for i in range(n):
        lines.extend(engine_lines(i, now, instance=True))
    return ("\n".join(lines) + "\n").encode()


def engine_page(i: int) -> bytes:
    return ("\n".join(HEADER + engine_lines(i, time.time(), instance=False)) + "\n").encode()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            if path == "/metrics":
                body, status = fleet_page(n), b"200 OK"
            elif (
                path.startswith("/engine/")
                and path.endswith("/metrics")
                and path.split("/")[2].isdigit()
                and int(path.split("/")[2]) < n
            ):
                body, status = engine_page(int(path.split("/")[2])), b"200 OK"
            else:
                body, status = b"not found\n", b"404 Not Found"
            writer.write(
                b"HTTP/1.1 "
                + status
                + b"\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(port: int, n: int) -> None:
    server = await asyncio.start_server(lambda r, w: handle(r, w, n), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--engines", type=int, default=1000)
    args = p.parse_args()
    asyncio.run(serve(args.port, args.engines))


if __name__ == "__main__":
    main()
