"""Pure ASGI middleware of the sidecar: the body-size limit."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, error_response


class BodyLimit:
    """413 for bodies over the limit (control paths get a smaller one)."""

    def __init__(self, app: ASGIApp, max_bytes: int, control_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.control_bytes = control_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        proxied = scope["path"].startswith("/v1/")
        limit = self.max_bytes if proxied else self.control_bytes
        if not proxied:
            # Control bodies are JSON whatever the header says (`curl -d` sends a form content type).
            scope = dict(scope, headers=[*(h for h in scope["headers"] if h[0] != b"content-type"),
                                         (b"content-type", b"application/json")])
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit or declared < 0:
                    response = error_response(413 if declared > limit else 400,
                                              "body_too_large" if declared > limit else "invalid_request",
                                              f"request body of {value.decode(errors='replace')} bytes; "
                                              f"the limit is {limit} bytes", field="body")
                    await response(scope, receive, send)
                    return
                break
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(413, "body_too_large", f"request body exceeds the limit of {limit} bytes",
                                   field="body")
            return message

        await self.app(scope, limited_receive, send)
