"""Reading an untrusted JSON request body (the frontend's every body, the worker's ``/generate``).

:func:`read_json_body` returns the parsed JSON or raises :class:`BodyError`: 413 beyond ``max_bytes``
(the rest never read), 408 when not received within ``timeout_s``, 400 for invalid UTF-8, not JSON,
``NaN``/``Infinity``/overflowing numbers/integers over 4300 digits, a key repeated in one object,
nesting deeper than :data:`MAX_DEPTH` or a lone surrogate (each naming its path). Imports neither
torch nor an engine.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from pydantic_core import ErrorDetails

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["DEFAULT_MAX_BODY_BYTES", "MAX_DEPTH", "MAX_MESSAGE_CHARS", "QUOTE_CHARS", "BodyError", "clip",
           "first_error", "loc_path", "parse_json_body", "quote", "read_body", "read_json_body"]

#: Default bound on a request body; a long chat prompt is far below it.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: Deepest nesting accepted (an OpenAI body needs fewer than 10 levels).
MAX_DEPTH = 64
#: Characters of client-sent text (a value, a key) an error message or path quotes.
QUOTE_CHARS = 64
#: Characters of an error message or ``param`` sent back to a client, whatever it quotes.
MAX_MESSAGE_CHARS = 1024


def clip(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def quote(text: str, limit: int = QUOTE_CHARS) -> str:
    """``repr(text)`` for an error message, of at most its first ``limit`` characters."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


class BodyError(ValueError):
    """A body refused before validation: ``status`` (400 or 413), ``message``, ``param`` (a path or ``None``)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

def _too_large(max_bytes: int) -> BodyError:
    return BodyError(413, f"the request body exceeds {max_bytes} bytes (limit max_body_bytes)",
                     code="request_too_large")


async def read_body(chunks: AsyncIterable[bytes], *, content_length: str | None, max_bytes: int) -> bytes:
    """The body's bytes; :class:`BodyError` 413 as soon as it is known to exceed ``max_bytes``."""
    if content_length is not None:
        try:
            announced = int(content_length)
        except ValueError:
            raise BodyError(400, "the Content-Length header is not an integer") from None
        if announced > max_bytes:
            raise _too_large(max_bytes)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        parts.append(chunk)
    return b"".join(parts)


class _DuplicateKeys(dict[str, Any]):
    """An object in which ``duplicate`` appeared more than once (reported with its path by the walk)."""

    duplicate: str = ""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            marked = _DuplicateKeys(out)
            marked.duplicate = key
            return marked
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise BodyError(400, f"the request body is not valid JSON: {name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BodyError(400, f"the request body is not valid JSON: number {text[:40]} is out of range")
    return value


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    key = clip(key)
    return f"{parent}.{key}" if parent else key


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BodyError(400, f"{path or 'body'}: must be valid Unicode text (found a lone surrogate escape)",
                        param=path or None) from None


#: A JSON escape of a UTF-16 surrogate (``\ud800``-``\udfff``): the only way a decoded string can hold one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_tree(document: Any, *, strings: bool = True) -> None:
    """Depth, duplicate keys and (when ``strings``) lone surrogates, without recursion (the depth is
    untrusted). Scalars are not visited when strings need no check, so a body of 100,000 short
    strings costs a pass over a list, not 100,000 path strings.

    A key is checked before anything below it, so no error message ever quotes an invalid key.
    """
    stack: list[tuple[Any, str, int]] = [(document, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, str):
            _check_text(node, path)
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth >= MAX_DEPTH:
            raise BodyError(400, f"{path or 'body'}: nested deeper than {MAX_DEPTH} levels", param=path or None)
        if isinstance(node, dict):
            if strings:
                for key in node:
                    _check_text(key, path)
            if isinstance(node, _DuplicateKeys):
                where = _path(path, node.duplicate)
                raise BodyError(400, f"{where}: duplicate key {quote(node.duplicate)} in one object", param=where)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((value, _path(path, key), depth + 1) for key, value in items
                     if isinstance(value, (dict, list)) or (strings and isinstance(value, str)))


def parse_json_body(raw: bytes) -> Any:
    """Strict JSON from UTF-8 bytes; :class:`BodyError` 400 saying what is wrong (and where, when known)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BodyError(400, f"the request body is not valid UTF-8 (byte {err.start})") from None
    try:
        document = json.loads(text, object_pairs_hook=_pairs, parse_constant=_reject_constant,
                              parse_float=_finite_float)
    except RecursionError:
        raise BodyError(400, f"the request body is nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as err:
        raise BodyError(400, f"the request body is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})") \
            from None
    except BodyError:
        raise
    except ValueError as err:  # e.g. an integer literal beyond Python's digit limit
        raise BodyError(400, f"the request body is not valid JSON: {err}") from None
    _check_tree(document, strings=_SURROGATE_ESCAPE.search(text) is not None)
    return document


async def read_json_body(request: Request, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES, timeout_s: float | None = None) -> Any:
    """Read and parse a Starlette ``request``'s body under all the rules above (``timeout_s``: the
    whole body's deadline, ``None`` for none)."""
    try:
        with anyio.fail_after(timeout_s):
            raw = await read_body(request.stream(), content_length=request.headers.get("content-length"),
                                  max_bytes=max_bytes)
    except TimeoutError:
        raise BodyError(408, f"the request body was not received within {timeout_s:g} s (limit body_timeout)",
                        code="request_timeout") from None
    return parse_json_body(raw)


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none", "dict", "list", "function-after", "function-plain",
                         "constrained-int", "constrained-float"})


def loc_path(loc: tuple[Any, ...]) -> str:
    """Pydantic's error location as ``a.b[0]``, without the tags it adds for union members."""
    out = ""
    for part in loc:
        if isinstance(part, str) and (part in _UNION_TAGS or "[" in part):
            continue
        part = part if isinstance(part, int) else clip(str(part))
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def first_error(errors: Sequence[ErrorDetails]) -> BodyError:
    """A 400 naming the first field of a pydantic ``ValidationError.errors()`` list and its rule."""
    first = errors[0]
    path = loc_path(tuple(first["loc"]))
    return BodyError(400, clip(f"{path}: {first['msg']}" if path else str(first["msg"]), MAX_MESSAGE_CHARS),
                     param=path or None)
