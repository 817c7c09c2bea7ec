"""``POST /v1/watermark/detect``: the body both the frontend and the worker accept, and the answer.

The frontend (``dynlogits.serve.frontend.watermark``) checks a client's body with
:func:`parse_detect_body` before any work, then asks a generation worker (``POST /watermark/detect``,
behind the worker secret), which tokenizes ``text`` with the served model's tokenizer, checks the ids
against the logits width and runs the watermark detector with the operator's key and context width
(``dynlogits.serve.worker.watermark``). Why a worker: the frontend has neither the tokenizer nor
torch, which the detector uses; the worker has both, and is where the key is used to generate.

Body: exactly one of ``{"text": "..."}`` (at most ``max_prompt_chars`` characters) and
``{"token_ids": [...]}`` (at most ``max_prompt_chars`` ids, and at most the detector's
``MAX_DETECT_TOKENS``, each an integer from 0 to
:data:`MAX_TOKEN_ID`); nothing else. Answer: :class:`DetectAnswer`. Imports neither torch nor an engine.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.limits import RequestLimits
from dynlogits.specs.builtin.watermark import MAX_DETECT_TOKENS

__all__ = ["DETECT_FIELDS", "MAX_TOKEN_ID", "NO_WATERMARK", "DetectAnswer", "DetectRequest", "no_watermark_error",
           "parse_detect_body"]

#: The body's fields: exactly one of them.
DETECT_FIELDS = ("text", "token_ids")
#: The largest id the frontend lets through (no vocabulary there); the worker checks the logits width.
MAX_TOKEN_ID = 2**31 - 1
#: ``code`` of the 409 answered where the deployment has no watermark.
NO_WATERMARK = "no_watermark_configured"


class DetectRequest(BaseModel):
    """A checked body: exactly one of ``text`` and ``token_ids``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    text: str | None = None
    token_ids: list[int] | None = None


class DetectAnswer(BaseModel):
    """What detection finds, as vLLM's ``GumbelWatermarkDetector`` reports it. ``score`` is ``None``
    where no token could be scored (text shorter than the context width)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    score: float | None
    p_value: float
    num_scored_tokens: int
    is_watermarked: bool

    @classmethod
    def of(cls, detection: Any) -> DetectAnswer:
        """From the detector's ``WatermarkDetection`` (score, p_value, num_scored_tokens, is_watermarked)."""
        score = float(detection.score)
        return cls(score=score if math.isfinite(score) else None, p_value=float(detection.p_value),
                   num_scored_tokens=int(detection.num_scored_tokens), is_watermarked=bool(detection.is_watermarked))


def _bad(param: str, rule: str) -> HTTPError:
    return HTTPError(400, f"{param}: {rule}", param=param)


def parse_detect_body(data: Any, limits: RequestLimits) -> DetectRequest:
    """``data`` (parsed JSON) as a :class:`DetectRequest`; ``HTTPError(400)`` naming the first bad
    field and its rule. Sizes are checked before anything is copied (``max_prompt_chars``)."""
    if not isinstance(data, dict):
        raise HTTPError(400, "the request body must be a JSON object with text or token_ids")
    for name in data:
        if name not in DETECT_FIELDS:
            raise _bad(str(name)[:64], f"unknown field (expected exactly one of {', '.join(DETECT_FIELDS)})")
    given = [name for name in DETECT_FIELDS if data.get(name) is not None]
    if len(given) != 1:
        raise HTTPError(400, f"give exactly one of text and token_ids (got {' and '.join(given) or 'neither'})",
                        param=given[1] if len(given) > 1 else "text")
    bound = limits.max_prompt_chars
    if given[0] == "text":
        text = data["text"]
        if not isinstance(text, str):
            raise _bad("text", "must be a string")
        if not text:
            raise _bad("text", "must not be empty")
        if len(text) > bound:
            raise _bad("text", f"is {len(text)} characters; the most allowed is {bound} (limit max_prompt_chars)")
        return DetectRequest(text=text)
    ids = data["token_ids"]
    if not isinstance(ids, list):
        raise _bad("token_ids", "must be a list of token ids")
    if not ids:
        raise _bad("token_ids", "must not be empty")
    if len(ids) > min(bound, MAX_DETECT_TOKENS):
        limit = "max_prompt_chars" if bound <= MAX_DETECT_TOKENS else "the detector's MAX_DETECT_TOKENS"
        raise _bad("token_ids", f"has {len(ids)} ids; the most allowed is {min(bound, MAX_DETECT_TOKENS)} (limit {limit})")
    for i, tid in enumerate(ids):
        if not isinstance(tid, int) or isinstance(tid, bool):
            raise _bad(f"token_ids[{i}]", "must be an integer")
        if not 0 <= tid <= MAX_TOKEN_ID:
            raise _bad(f"token_ids[{i}]", f"must be from 0 to {MAX_TOKEN_ID}")
    return DetectRequest(token_ids=ids)


def no_watermark_error() -> HTTPError:
    """The 409 of a deployment whose operator config has no ``watermark`` entry."""
    return HTTPError(409, "this deployment has no watermark configured: its operator's logits config has no watermark "
                          "entry, so there is no key to detect with", code=NO_WATERMARK)
