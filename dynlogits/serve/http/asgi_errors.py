"""``JsonErrors``: an unexpected exception becomes a JSON 500 in OpenAI's error shape, inside the app,
so the answer is complete and the connection stays open (``docs/reliability.md`` says why this is
not an exception handler). A client gone mid-body (``ClientDisconnect``) is answered nothing and
logged nothing. Used by the frontend and the worker.
"""

from __future__ import annotations

import json
import logging

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["JsonErrors"]


class JsonErrors:
    """Pure ASGI middleware: ``app.add_middleware(JsonErrors, server="worker", log=log)``."""

    def __init__(self, app: ASGIApp, *, server: str, log: logging.Logger) -> None:
        self.app, self.server, self.log = app, server, log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            return
        except Exception as err:
            self.log.error("unexpected error on %s %s", scope.get("method"), scope.get("path"), exc_info=err)
            if started:  # part of an answer is out: nothing well-formed can follow
                raise
            body = json.dumps({"error": {"message": f"internal error in the {self.server}: {type(err).__name__}",
                                         "type": "internal_error", "param": None, "code": None}}).encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
