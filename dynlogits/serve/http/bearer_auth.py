"""``Authorization: Bearer`` credentials: reading them from a request, matching them in constant time,
and the 401 answer when they are missing or wrong (OpenAI's error shape, as ``vllm serve --api-key``
answers). Used for the frontend's API keys and for the worker secret."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from starlette.types import Send

__all__ = ["BearerKeys", "bearer_token", "read_key_file", "send_unauthorized"]


def bearer_token(scope: Mapping[str, Any]) -> str | None:
    """The token of the request's ``Authorization: Bearer <token>`` header, else ``None``."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() or None if scheme.lower() == "bearer" else None
    return None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class BearerKeys:
    """A set of accepted tokens, each known by its position (1-based) in the order given. Tokens are
    kept only as SHA-256 digests and compared in constant time."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests: list[bytes] = []
        for key in keys:
            if not key or key != key.strip():
                raise ValueError("a key must be non-empty, without surrounding whitespace")
            digest = _digest(key)
            if digest not in self._digests:
                self._digests.append(digest)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def match(self, token: str | None) -> int | None:
        """The position of ``token`` among the keys, else ``None``."""
        if token is None:
            return None
        digest = _digest(token)
        found = None
        for i, known in enumerate(self._digests, 1):
            if hmac.compare_digest(digest, known):
                found = i
        return found


def read_key_file(path: str) -> list[str]:
    """The keys in ``path``: one per line; blank lines and lines starting with ``#`` are skipped.
    ``ValueError`` naming the file when it cannot be read or holds no key."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot be read ({type(err).__name__})") from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ValueError(f"{path}: holds no key (one per line; blank and '#' lines are skipped)")
    return keys


async def send_unauthorized(send: Send, message: str, *, code: str = "invalid_api_key") -> None:
    """A complete 401 answer in OpenAI's error shape, with ``WWW-Authenticate: Bearer``."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})
