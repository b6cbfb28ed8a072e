"""core.engine_metrics.text: the one-regex-per-line reader gives prometheus_client's families and samples."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.engine_metrics import filter_page
from core.engine_metrics.text import _fast, read_families
from tests.support import ENGINE_METRICS

PAGES = sorted(ENGINE_METRICS.glob("*.prom"))


def samples(families: Any) -> list[tuple[str, dict[str, str], float | str]]:
    """(name, labels, value) in page order; NaN as a string, so that two NaNs compare equal."""
    out = []
    for family in families:
        for s in family.samples:
            value = float(s.value)
            out.append((s.name, dict(s.labels), "NaN" if math.isnan(value) else value))
    return out


def docs(families: Any) -> dict[str, str]:
    return {f.name: f.documentation for f in families if f.documentation}


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
@pytest.mark.parametrize("filtered", [False, True], ids=["whole page", "filtered"])
def test_every_captured_page_reads_as_prometheus_client_reads_it(path, filtered) -> None:
    text = path.read_text()
    if filtered:
        text = filter_page(text)
    fast = _fast(text)  # never falls back on a real page
    reference = list(text_string_to_metric_families(text))
    assert samples(fast) == samples(reference)
    # the documentation the parser reads ("blocks") is the same for each family name that has HELP
    reference_docs = docs(reference)
    for name, documentation in docs(fast).items():
        base = name.removesuffix("_total")
        assert reference_docs.get(name, reference_docs.get(base)) == documentation, name


def test_escapes_timestamps_and_special_values() -> None:
    text = (
        '# HELP x_total a "counter"\\nwith escapes\n'
        'x_total{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",} 3 1700000000000\n'
        'y NaN\nz{a="1"}\t+Inf\nw -2.5e-3\n'
    )
    fast = _fast(text)
    assert samples(fast) == samples(text_string_to_metric_families(text))
    assert fast[0].samples[0].labels == {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb"}


@pytest.mark.parametrize(
    "text",
    [
        'x{a = "1"} 2\n',  # spaces inside the label block: the full parser reads it
        "x 1_000\n",  # an underscore in the value: the full parser rejects it
        'x{a="1" 2\n',  # truncated label block: rejected
    ],
)
def test_a_line_outside_the_grammar_goes_to_the_full_parser(text: str) -> None:
    try:
        expected: Any = samples(text_string_to_metric_families(text))
    except ValueError as exc:
        expected = type(exc)
    try:
        got: Any = samples(read_families(text))
    except ValueError as exc:
        got = type(exc)
    assert got == expected
