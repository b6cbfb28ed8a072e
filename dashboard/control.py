"""Client for a sidecar's control API, used by the pages' control actions.

Every call returns a `ControlResult`; none raises for an expected failure, so a
page can always show what happened. Failures, in the order they are checked:

- no operator token configured for that sidecar (nothing is sent);
- the sidecar cannot be reached (connection refused, DNS, timeout);
- HTTP 401/403: the sidecar rejected the dashboard's operator token;
- HTTP 404: unknown session (or endpoint);
- other 4xx/5xx: the sidecar's own message (it names the offending field).

The operator token goes only into the Authorization header; it never appears
in a result message, a log line or a URL. The signed-in person goes into
`X-Actor` so the sidecar's audit names them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControlResult:
    ok: bool
    message: str
    status: int | None = None
    body: Any = None


def _error_text(response: httpx.Response) -> str:
    """The sidecar's message from an error response, as plain text."""
    try:
        payload = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(payload, dict):
        for key in ("detail", "error", "message"):
            value = payload.get(key)
            if isinstance(value, str):
                return value[:500]
            if isinstance(value, list):  # FastAPI validation errors
                parts = []
                for item in value:
                    if isinstance(item, dict):
                        loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                        parts.append(f"{loc}: {item.get('msg', '')}".strip(": "))
                    else:
                        parts.append(str(item))
                return "; ".join(parts)[:500]
            if isinstance(value, dict):
                return str(value.get("message") or value)[:500]
    return str(payload)[:500]


class SidecarControl:
    """One sidecar's control API, on behalf of one signed-in person."""

    def __init__(
        self,
        client: httpx.Client,
        base_url: str,
        *,
        token: str | None,
        actor: str,
        name: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        self._client = client
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.actor = actor
        self.name = name or self.base_url
        self._timeout = timeout

    def __repr__(self) -> str:  # never show the token
        return f"SidecarControl({self.name!r}, actor={self.actor!r})"

    def _send(
        self, method: str, path: str, json: Mapping[str, Any] | None = None, *, needs_token: bool = True
    ) -> ControlResult:
        headers = {"X-Actor": self.actor}
        if needs_token:
            if not self._token:
                return ControlResult(
                    False,
                    f"No operator token is configured for sidecar {self.name}; "
                    "set PREFIXOPS_OPERATOR_TOKEN or its operator_token in "
                    "PREFIXOPS_CONFIG on the dashboard server. Nothing was sent.",
                )
            headers["Authorization"] = f"Bearer {self._token}"
        url = self.base_url + path
        try:
            response = self._client.request(method, url, json=json, headers=headers, timeout=self._timeout)
        except httpx.TimeoutException:
            logger.warning("sidecar %s: %s %s timed out", self.name, method, path)
            return ControlResult(
                False,
                f"Sidecar {self.name} did not answer within {self._timeout:g} s; "
                "the action may or may not have been applied; check its state.",
            )
        except httpx.HTTPError as exc:
            logger.warning("sidecar %s: %s %s failed: %s", self.name, method, path, type(exc).__name__)
            return ControlResult(
                False,
                f"Sidecar {self.name} is not reachable at {self.base_url} "
                f"({type(exc).__name__}); is it running? Nothing was applied.",
            )
        if response.status_code in (401, 403):
            return ControlResult(
                False,
                f"Sidecar {self.name} rejected the dashboard's operator token "
                f"(HTTP {response.status_code}); the token configured on the "
                "dashboard server does not match the sidecar's.",
                response.status_code,
            )
        if response.status_code == 404:
            return ControlResult(
                False, f"Sidecar {self.name}: not found (HTTP 404): {_error_text(response)}", 404
            )
        if response.status_code >= 400:
            return ControlResult(
                False,
                f"Sidecar {self.name} refused (HTTP {response.status_code}): {_error_text(response)}",
                response.status_code,
            )
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        return ControlResult(True, "ok", response.status_code, body)

    # Reads (open endpoints; the token is not needed).
    def state(self) -> ControlResult:
        return self._send("GET", "/state", needs_token=False)

    def sessions(self) -> ControlResult:
        return self._send("GET", "/sessions", needs_token=False)

    # Actions.
    def set_budgeter(
        self, *, mode: str | None = None, low: float | None = None, high: float | None = None
    ) -> ControlResult:
        payload = {k: v for k, v in (("mode", mode), ("low", low), ("high", high)) if v is not None}
        if not payload:
            return ControlResult(False, "Nothing to change: give a mode, a low band or a high band.")
        return self._send("PUT", "/control/budgeter", payload)

    def park(self, session_id: str) -> ControlResult:
        return self._send("POST", f"/control/sessions/{quote(session_id, safe='')}/park")

    def unpark(self, session_id: str, *, pin: bool = False) -> ControlResult:
        return self._send(
            "POST", f"/control/sessions/{quote(session_id, safe='')}/unpark", {"pin": True} if pin else None
        )

    def defer_compaction(
        self, *, minutes: float | None = None, until: float | None = None, reason: str | None = None
    ) -> ControlResult:
        if (minutes is None) == (until is None):
            return ControlResult(False, "Give exactly one of minutes or until to defer compaction.")
        payload: dict[str, Any] = {"minutes": minutes} if minutes is not None else {"until": until}
        if reason:
            payload["reason"] = reason
        return self._send("POST", "/control/compaction/defer", payload)

    def allow_compaction(self) -> ControlResult:
        return self._send("POST", "/control/compaction/allow")


def _norm_url(url: str) -> str:
    return url.strip().rstrip("/")


def load_sidecar_tokens(config_path: str | None) -> dict[str, str]:
    """Operator tokens per sidecar (keyed by both name and URL) from the fleet TOML, read through
    `collectors.config` (the one grammar: ``[[sidecars]]`` entries with ``operator_token``).

    A missing or invalid file gives no tokens and one log line naming the problem (the default
    token may still apply); the tokens themselves are never logged.
    """
    if not config_path:
        return {}
    from collectors.config import ConfigError, load_config

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        logger.warning("no sidecar operator tokens from the fleet config: %s", exc)
        return {}
    tokens: dict[str, str] = {}
    for sidecar in config.sidecars:
        if sidecar.operator_token:
            if sidecar.name:
                tokens[sidecar.name] = sidecar.operator_token
            tokens[_norm_url(sidecar.url)] = sidecar.operator_token
    return tokens


def token_for(name: str, url: str, *, tokens: Mapping[str, str], default: str | None) -> str | None:
    """The operator token for one sidecar: its own entry in the config, else the default."""
    return tokens.get(name) or tokens.get(_norm_url(url)) or default
