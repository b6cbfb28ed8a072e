"""Helpers for AppTests of the pages: start the app, sign in, read plotly figures."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np
from streamlit.testing.v1 import AppTest

from tests.dashboard.conftest import APP, PASSPHRASE


def app(page: str | None = None, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    if page is not None or query:
        for key, value in query.items():
            at.query_params[key] = value
        if page is not None:
            at.switch_page(f"pages/{page}.py")
        at.run()
        assert not at.exception, at.exception
    return at


def sign_in(at: AppTest, name: str = "alice", passphrase: str = PASSPHRASE) -> AppTest:
    """Sign in with an account of the filled database (alice: operator, vera: viewer, ada: admin)."""
    at.sidebar.text_input(key="sign_in_name").input(name)
    at.sidebar.text_input(key="sign_in_password").input(passphrase)
    at.sidebar.button[0].click()  # the form's submit button
    at.run()
    assert not at.exception, at.exception
    return at


def figures(at: AppTest) -> dict[str, dict[str, Any]]:
    """Every plotly chart on the page, by element key, as the figure's JSON."""
    out = {}
    for element in at.get("plotly_chart"):
        spec = json.loads(element.proto.spec)
        out[element.proto.id.split("-", 2)[-1]] = spec  # "$$ID-<hash>-<key>"
    return out


def decode(values: Any) -> list[Any]:
    """A trace's x or y as a list: plotly 6+ encodes numpy arrays as {"dtype", "bdata"} (base64)."""
    if isinstance(values, dict) and "bdata" in values:
        array = np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"]))
        return [None if isinstance(v, float) and math.isnan(v) else v for v in array.tolist()]
    return list(values or [])


def traces(fig: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Traces by name, with x and y decoded to lists."""
    out = {}
    for trace in fig["data"]:
        trace = dict(trace)
        for axis in ("x", "y"):
            if axis in trace:
                trace[axis] = decode(trace[axis])
        out[trace.get("name", "")] = trace
    return out


def texts(at: AppTest) -> str:
    """Everything rendered as text, markdown, caption, alerts: one string to search."""
    parts: list[str] = []
    for kind in ("markdown", "text", "caption", "error", "warning", "info", "success", "title", "subheader"):
        parts.extend(str(e.value) for e in at.get(kind))
    return "\n".join(parts)
