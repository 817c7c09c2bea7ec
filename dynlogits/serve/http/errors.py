"""An error answer in OpenAI's shape (``{"error": {message, type, param, code}}``), raised by a step of a
handler and answered by the handler. Used by the frontend and the worker."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from .bodies import MAX_MESSAGE_CHARS, clip

__all__ = ["HTTPError"]


class HTTPError(Exception):
    """``status`` and the ``error`` object's fields; ``retry_after_s`` sets ``Retry-After``. The message
    and param are cut to ``MAX_MESSAGE_CHARS``, whatever they quote of the request."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None, retry_after_s: int | None = None) -> None:
        message, param = clip(message, MAX_MESSAGE_CHARS), clip(param, MAX_MESSAGE_CHARS) if param else param
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status, headers=headers)
