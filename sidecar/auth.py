"""Bearer tokens: operator (control), viewer (reads, when set) and client (traffic, when set).

Tokens are compared in constant time (``hmac.compare_digest``). The operator token also passes
every viewer and client check. See sidecar/README.md ("Trust model").
"""

from __future__ import annotations

import hmac
import re

from fastapi import Request

from .errors import ApiError
from .settings import Settings

ACTOR_RE = re.compile(r"^[\x20-\x7e]{1,200}$")


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def token_matches(token: str | None, expected: str | None) -> bool:
    if token is None or not expected:
        return False
    return hmac.compare_digest(token.encode(), expected.encode())


def actor_of(request: Request, role: str) -> str:
    actor = request.headers.get("x-actor")
    if actor is not None and not ACTOR_RE.match(actor):
        raise ApiError(
            400,
            "invalid_request",
            f"X-Actor must be 1-200 printable ASCII characters, got {actor[:50]!r}",
            field="X-Actor",
            value=actor[:200],
        )
    return actor or role


def _unauthorized(what: str, token: str | None) -> ApiError:
    return ApiError(
        401,
        "unauthorized",
        f"{what} token missing" if token is None else f"{what} token not accepted",
        headers={"WWW-Authenticate": "Bearer"},
    )


class Auth:
    """FastAPI dependencies built from the settings' tokens."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def is_operator(self, request: Request) -> bool:
        return bool(self.settings.operator_token) and token_matches(
            bearer(request), self.settings.operator_token
        )

    def operator(self, request: Request) -> tuple[str, str]:
        """(actor, role) of an operator request; 403 when read-only, 401 without the token."""
        if not self.settings.operator_token:
            raise ApiError(403, "read_only", "the sidecar is read-only: PREFIXOPS_OPERATOR_TOKEN is not set")
        token = bearer(request)
        if not token_matches(token, self.settings.operator_token):
            raise _unauthorized("operator", token)
        return actor_of(request, "operator"), "operator"

    def viewer(self, request: Request) -> None:
        if not self.settings.viewer_token:
            return
        token = bearer(request)
        if not (
            token_matches(token, self.settings.viewer_token)
            or token_matches(token, self.settings.operator_token)
        ):
            raise _unauthorized("viewer", token)

    def client(self, request: Request) -> None:
        """Traffic, session end and compaction requests: the client token when one is set."""
        if not self.settings.client_token:
            return
        token = bearer(request)
        if not (
            token_matches(token, self.settings.client_token)
            or token_matches(token, self.settings.operator_token)
        ):
            raise _unauthorized("client", token)

    def requester(self, request: Request) -> None:
        """Compaction requests: any configured viewer, client or operator token, when a viewer or client
        token is set."""
        s = self.settings
        if not s.viewer_token and not s.client_token:
            return
        token = bearer(request)
        if not any(token_matches(token, t) for t in (s.viewer_token, s.client_token, s.operator_token)):
            raise _unauthorized("client" if s.client_token else "viewer", token)

    def session_ender(self, request: Request) -> tuple[str, str]:
        """DELETE /sessions/{id}: the operator token, or the client token (a client ending its own
        session); without either, 401. With no client token configured, only the operator may; with no
        token configured at all (an open sidecar), anyone may, as X-Session-End on a turn does."""
        if not self.settings.operator_token and not self.settings.client_token:
            return "client", "client"
        if self.is_operator(request):
            return actor_of(request, "operator"), "operator"
        token = bearer(request)
        if self.settings.client_token and token_matches(token, self.settings.client_token):
            return "client", "client"
        what = "operator or client" if self.settings.client_token else "operator"
        raise _unauthorized(what, token)
