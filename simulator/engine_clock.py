"""The engine's own clock for a probe: its per-request phase times, read from its ``/metrics``.

vLLM (V1) records, for every finished request, the time it spent in the prefill phase (scheduled to
first token: ``vllm:request_prefill_time_seconds``) and in the decode phase (first token to last:
``vllm:request_decode_time_seconds``), as histograms whose ``_sum`` and ``_count`` grow by that
request's seconds and by one. Two readings of ``/metrics`` around a probe that nothing else runs
beside therefore give the probe's phase times as the engine measured them: no HTTP round trip, no
tokenisation, no wake-up of a client on a busy machine. ``simulator fit`` times its probes with it
where the engine has these histograms (the simulated engine has them too, in wall seconds at its
``speed``), and falls back to wall time where it has not (SGLang, or an older engine).

* ``phase_totals(text)``: ``{phase: (sum, count)}`` over every label of the family (a multi-rank
  engine's ranks added), for the phases of ``PHASES`` present on the page;
* ``phase_mean(before, after, phase, requests)``: the mean seconds per request of ``phase`` between
  two readings, when exactly ``requests`` requests finished in between; None otherwise (the family is
  missing, or another request finished beside the probe, or the engine has not recorded it yet).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

PHASES: dict[str, str] = {
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
}
Totals = dict[str, tuple[float, float]]  # phase -> (cumulative _sum, cumulative _count)


def phase_totals(text: str) -> Totals:
    """``{phase: (sum, count)}`` of the ``PHASES`` histograms on a ``/metrics`` page, over every label."""
    wanted = {name: phase for phase, name in PHASES.items()}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        phase = wanted.get(family.name)
        if phase is None or family.type != "histogram":
            continue
        for s in family.samples:
            if s.name == family.name + "_sum":
                sums[phase] = sums.get(phase, 0.0) + s.value
            elif s.name == family.name + "_count":
                counts[phase] = counts.get(phase, 0.0) + s.value
    return {p: (sums[p], counts[p]) for p in PHASES if p in sums and p in counts}


def phase_mean(
    before: Mapping[str, tuple[float, float]],
    after: Mapping[str, tuple[float, float]],
    phase: str,
    requests: int,
) -> float | None:
    """Mean seconds of ``phase`` per request between two ``phase_totals``; None unless exactly ``requests``
    requests finished in between (module doc)."""
    if phase not in before or phase not in after or requests < 1:
        return None
    (s0, n0), (s1, n1) = before[phase], after[phase]
    if round(n1 - n0) != requests:
        return None
    return max(0.0, (s1 - s0) / requests)
