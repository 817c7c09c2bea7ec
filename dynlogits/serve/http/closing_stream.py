"""``ClosingStreamingResponse``: a streaming response that closes its body iterator (shielded from
cancellation) however the response ends. Starlette's ``StreamingResponse`` leaves the body suspended
when the client disconnects during a send, so its ``finally`` (closing an upstream stream, aborting
an engine request) ran only once the generator was garbage collected.
"""

from __future__ import annotations

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["ClosingStreamingResponse"]


class ClosingStreamingResponse(StreamingResponse):
    """``StreamingResponse`` whose async-generator body is closed when the response ends, whether
    it ran to its end, failed, or the client went away."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
