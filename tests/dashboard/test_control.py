"""The sidecar control client over httpx.MockTransport: requests, headers, every error path."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from dashboard.control import SidecarControl, load_sidecar_tokens, token_for

TOKEN = "s3cret-token"


def client_with(handler) -> tuple[SidecarControl, list[httpx.Request]]:  # noqa: ANN001
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    http = httpx.Client(transport=httpx.MockTransport(record))
    return SidecarControl(http, "http://127.0.0.1:8100/", token=TOKEN, actor="alice", name="a-sidecar"), seen


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"ok": True})


@pytest.mark.parametrize(
    ("call", "method", "path", "body"),
    [
        (lambda c: c.park("s 1/x"), "POST", "/control/sessions/s%201%2Fx/park", None),
        (lambda c: c.unpark("s1"), "POST", "/control/sessions/s1/unpark", None),
        (lambda c: c.unpark("s1", pin=True), "POST", "/control/sessions/s1/unpark", {"pin": True}),
        (lambda c: c.set_budgeter(low=0.6), "PUT", "/control/budgeter", {"low": 0.6}),
        (
            lambda c: c.set_budgeter(mode="off", low=0.5, high=0.9),
            "PUT",
            "/control/budgeter",
            {"mode": "off", "low": 0.5, "high": 0.9},
        ),
        (lambda c: c.defer_compaction(minutes=30), "POST", "/control/compaction/defer", {"minutes": 30}),
        (
            lambda c: c.defer_compaction(until=2e9, reason="storm"),
            "POST",
            "/control/compaction/defer",
            {"until": 2e9, "reason": "storm"},
        ),
        (lambda c: c.allow_compaction(), "POST", "/control/compaction/allow", None),
    ],
)
def test_actions_send_the_documented_request_with_token_and_actor(call, method, path, body) -> None:  # noqa: ANN001
    control, seen = client_with(ok)
    result = call(control)
    assert result.ok
    (request,) = seen
    assert (request.method, request.url.raw_path.decode()) == (method, path)
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.headers["x-actor"] == "alice"
    assert (json.loads(request.content) if request.content else None) == body


def test_reads_do_not_send_the_token() -> None:
    control, seen = client_with(lambda r: httpx.Response(200, json={"reuse": {}}))
    assert control.state().ok
    assert "authorization" not in seen[0].headers


def test_down_sidecar_is_a_clear_message_not_an_exception() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    control, _ = client_with(refuse)
    result = control.park("s1")
    assert not result.ok and result.status is None
    assert (
        "not reachable at http://127.0.0.1:8100" in result.message and "Nothing was applied" in result.message
    )


def test_timeout_says_the_outcome_is_unknown() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    control, _ = client_with(slow)
    result = control.allow_compaction()
    assert not result.ok and "may or may not have been applied" in result.message


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            401,
            {"error": {"message": "operator token not accepted"}},
            "rejected the dashboard's operator token",
        ),
        (403, {"error": {"message": "read-only"}}, "rejected the dashboard's operator token"),
        (404, {"error": {"message": "unknown session 's9'"}}, "unknown session 's9'"),
        (
            422,
            {
                "error": {
                    "type": "invalid_value",
                    "message": "low band must be below high band, got 0.9 >= 0.8",
                    "field": "low",
                }
            },
            "low band must be below high band, got 0.9 >= 0.8",
        ),
        (
            422,
            {"detail": [{"loc": ["body", "low"], "msg": "Input should be a valid number"}]},
            "low: Input should be",
        ),
        (500, "Internal Server Error", "HTTP 500"),
    ],
)
def test_errors_carry_the_sidecars_message(status: int, body, expected: str) -> None:  # noqa: ANN001
    def answer(request: httpx.Request) -> httpx.Response:
        return (
            httpx.Response(status, json=body) if isinstance(body, dict) else httpx.Response(status, text=body)
        )

    control, _ = client_with(answer)
    result = control.set_budgeter(low=0.9)
    assert not result.ok and result.status == status
    assert expected in result.message
    assert TOKEN not in result.message and TOKEN not in repr(control)


def test_without_a_token_nothing_is_sent() -> None:
    seen: list[httpx.Request] = []
    http = httpx.Client(transport=httpx.MockTransport(lambda r: seen.append(r) or httpx.Response(200)))
    control = SidecarControl(http, "http://x:1", token=None, actor="alice")
    result = control.park("s1")
    assert not result.ok and "No operator token" in result.message and seen == []


def test_empty_budgeter_change_is_refused_locally() -> None:
    control, seen = client_with(ok)
    assert not control.set_budgeter().ok and seen == []


def test_tokens_from_the_collectors_config(tmp_path) -> None:  # noqa: ANN001
    config = tmp_path / "c.toml"
    config.write_text(
        '[[sidecars]]\nurl = "http://10.0.0.5:8100/"\nname = "gpu-a sidecar"\noperator_token = "t1"\n'
        '[[sidecars]]\nurl = "http://10.0.0.6:8100"\n'
    )
    tokens = load_sidecar_tokens(str(config))
    assert token_for("gpu-a sidecar", "http://elsewhere", tokens=tokens, default="d") == "t1"
    assert token_for("?", "http://10.0.0.5:8100", tokens=tokens, default="d") == "t1"
    assert token_for("other", "http://10.0.0.6:8100", tokens=tokens, default="d") == "d"
    assert load_sidecar_tokens(str(tmp_path / "missing.toml")) == {}
    (tmp_path / "bad.toml").write_text("not = [toml")
    assert load_sidecar_tokens(str(tmp_path / "bad.toml")) == {}


@pytest.mark.parametrize(
    "text",
    [
        '[[sidecar]]\nurl = "http://10.0.0.5:8100"\noperator_token = "t1"\n',
        '[sidecars.gpu-a]\nurl = "http://10.0.0.5:8100"\noperator_token = "t1"\n',
        '[[targets]]\nurl = "http://10.0.0.5:8100"\noperator_token = "t1"\n',
    ],
)
def test_tokens_only_from_the_grammar_the_collectors_accept(tmp_path, caplog, text) -> None:  # noqa: ANN001
    """One grammar: a form the collectors refuse gives no tokens, and the log says why (never the token)."""
    config = tmp_path / "c.toml"
    config.write_text(text)
    with caplog.at_level(logging.WARNING):
        assert load_sidecar_tokens(str(config)) == {}
    assert str(config) in caplog.text and "t1" not in caplog.text
