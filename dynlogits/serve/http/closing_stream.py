"""A streaming response that always closes its body iterator.

Starlette's ``StreamingResponse`` (ASGI spec 2.3 servers such as uvicorn) cancels the response when
the client disconnects. If that cancellation lands while the response is awaiting ``send``, the
body's async generator is left suspended at its ``yield``: its ``finally`` (closing an upstream
stream, aborting an engine request) then runs only when the generator is garbage collected, which
can be seconds later, while the upstream keeps producing. :class:`ClosingStreamingResponse`
closes the body (shielded from the cancellation) however the response ends.
"""

from __future__ import annotations

from typing import Any

import anyio
from starlette.responses import StreamingResponse

__all__ = ["ClosingStreamingResponse"]


class ClosingStreamingResponse(StreamingResponse):
    """``StreamingResponse`` whose async-generator body is closed when the response ends, whether
    it ran to its end, failed, or the client went away."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
