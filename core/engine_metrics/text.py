"""Prometheus text exposition lines to sample families, with one regular expression per line. Pure.

`read_families(text)` gives the same families and samples as prometheus_client's
``text_string_to_metric_families`` for the pages engines serve, about five times faster: that parser
walks every label block a character at a time, and a vLLM page is mostly histogram ``_bucket``
lines with three labels each (measured with ``bench/bench_collectors.py``; parsing was ~80% of
`core.engine_metrics.parse_engine_metrics`).

The grammar read here, per line (no spaces inside the label block, ``#`` lines other than ``HELP``
skipped, blank lines skipped)::

    name [ "{" label="value" { "," label="value" } [ "," ] "}" ] value [ timestamp ]

with ``name`` a legacy Prometheus metric name, label values holding the escapes ``\\\\``, ``\\"``
and ``\\n``, and ``value`` anything ``float`` reads without an underscore (``NaN``, ``+Inf``).
A line outside it hands the *whole* text to prometheus_client's parser, which reads it (it is
lenient about spacing) or raises the ``ValueError`` the caller turns into its error, so nothing the
full parser would read is lost. ``TYPE`` lines are not checked (the samples do not depend on them).

Each ``# HELP`` line starts a family (its name and documentation, which
`core.engine_metrics` reads to tell block-counted prefix caches apart); samples before the first
``HELP`` line go to a family named ``""``. Sample names are kept as written (``_total``,
``_bucket``, ``_created``, ...), as prometheus_client keeps them.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
_SAMPLE = re.compile(
    rf"({_NAME})(?:\{{((?:{_LABEL}(?:,{_LABEL})*,?)?)\}})?[ \t]+([^ \t]+)(?:[ \t]+-?[0-9]+)?[ \t]*"
)
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


class Family(NamedTuple):
    name: str
    documentation: str
    samples: list[Sample]


class _Unread(ValueError):
    """A line outside the grammar: the full parser reads the page instead."""


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _UNESCAPED.get(m[1], m[0]), value) if "\\" in value else value


def _value(raw: str) -> float:
    if "_" in raw:
        raise _Unread(raw)
    try:
        return float(raw)
    except ValueError:
        raise _Unread(raw) from None


def _fast(text: str) -> list[Family]:
    families: list[Family] = []
    current = Family("", "", [])
    for line in text.split("\n"):
        if not line or line.isspace():
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] == "HELP":
                if current.samples or current.name:
                    families.append(current)
                current = Family(parts[2], _unescape(parts[3]) if len(parts) > 3 else "", [])
            continue
        match = _SAMPLE.fullmatch(line)
        if match is None:
            raise _Unread(line)
        name, block, raw = match.groups()
        labels = {k: _unescape(v) for k, v in _LABEL_PAIR.findall(block)} if block else {}
        current.samples.append(Sample(name, labels, _value(raw)))
    if current.samples or current.name:
        families.append(current)
    return families


def read_families(text: str) -> list[Any]:
    """The families of a Prometheus text page (objects with ``name``, ``documentation`` and
    ``samples`` of ``name``, ``labels``, ``value``). Raises ValueError (and the other errors
    prometheus_client's parser raises) for text that parser rejects."""
    try:
        return _fast(text)
    except _Unread:
        return list(text_string_to_metric_families(text))
