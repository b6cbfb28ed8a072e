"""PrefixOps sidecar: a session-aware OpenAI-compatible proxy in front of one engine.

It measures prefix-cache reuse per turn (core.reuse), runs the KV budgeter
(core.budgeter) by holding parked sessions' next turns, gates compaction
(core.compaction) and exposes /state, /sessions, /metrics and a control API.
Run it with ``python -m sidecar --engine http://127.0.0.1:8000 --port 8100``.
"""
