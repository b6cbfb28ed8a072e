"""collectors.checks: exact values of the range checks, and one warning per field."""

from __future__ import annotations

import logging

from collectors.checks import Checker, in_range
from core import signals as sig


def test_ranges_exact() -> None:
    assert in_range(sig.KV_USAGE, 0.0) and in_range(sig.KV_USAGE, 1.0)
    assert (
        not in_range(sig.KV_USAGE, -0.5)
        and not in_range(sig.KV_USAGE, 7.5)
        and not in_range(sig.KV_USAGE, 1e300)
    )
    assert in_range(sig.DIVERGENCE, -0.3) and not in_range(sig.DIVERGENCE, -1.5)
    assert in_range(sig.DEMAND_FRACTION, 3.0)  # demand may exceed the pool
    assert not in_range(sig.REQUESTS_WAITING, -1.0) and in_range(sig.REQUESTS_WAITING, 2.0**53)
    assert not in_range(sig.PROMPT_TOKENS_PER_S, 1e30) and not in_range(sig.TTFT_P50, float("nan"))
    assert in_range("not_a_known_signal", -5.0) and not in_range("not_a_known_signal", float("inf"))


def test_signals_hits_above_queries_and_one_warning_per_field(caplog) -> None:  # noqa: ANN001
    caplog.set_level(logging.WARNING)
    checker = Checker("http://e:1")
    values = {
        sig.KV_USAGE: 1.5,
        sig.PREFIX_CACHE_HITS_PER_S: 120.0,
        sig.PREFIX_CACHE_QUERIES_PER_S: 100.0,
        sig.ENGINE_HIT_RATIO: 1.0,
        sig.REQUESTS_RUNNING: 3.0,
    }
    for _ in range(3):
        assert checker.signals(dict(values), "0") == {
            sig.PREFIX_CACHE_QUERIES_PER_S: 100.0,
            sig.REQUESTS_RUNNING: 3.0,
        }
    assert [r.getMessage() for r in caplog.records] == [
        "http://e:1: kv_usage (engine 0) = 1.5 is outside [0, 1]: stored as null (warned once; later values "
        "out of range are dropped silently)",
        "http://e:1: prefix_cache_hits_per_s (engine 0) = 120.0 is above prefix_cache_queries_per_s = 100.0: "
        "stored as null (warned once; later values out of range are dropped silently)",
    ]
    assert checker.dropped == 6
    assert checker.signals({sig.PREFIX_CACHE_HITS_PER_S: 100.0, sig.PREFIX_CACHE_QUERIES_PER_S: 100.0}) == {
        sig.PREFIX_CACHE_HITS_PER_S: 100.0,
        sig.PREFIX_CACHE_QUERIES_PER_S: 100.0,
    }


def test_rows_null_fields_and_refuse_unstorable_ids() -> None:
    checker = Checker("http://s:1")
    row = {
        "session_id": "a",
        "context_tokens": 10**30,
        "turns": -1,
        "last_cached_fraction": 1e300,
        "manual": True,
        "data": {"context_tokens": 1e30},
    }
    assert checker.row(row, "/sessions") == {
        "session_id": "a",
        "context_tokens": None,
        "turns": None,
        "last_cached_fraction": None,
        "manual": True,
        "data": {"context_tokens": 1e30},
    }
    assert checker.row({"remote_id": 2**60, "action": "x"}, "/audit") is None
    assert checker.row({"remote_id": 7, "ts": 1.5}, "/audit") == {"remote_id": 7, "ts": 1.5}
    assert checker.row(None, "/audit") is None
