"""How a payload travels in SGLang's ``custom_params``, and the admission check.

SGLang types ``SamplingParams.custom_params`` as ``Dict[str, CustomParamValue]`` with
``CustomParamValue = JSON scalar | List[JSON scalar] | Dict[str, JSON scalar]``
(``sglang/srt/sampling/sampling_params.py``) and decodes every request with msgspec on its way
from the tokenizer manager to the scheduler (``sglang/srt/managers/io_struct.py``:
``msgpack_decode``). The wire payload is a list of entry *objects*, which that decoder rejects.

Encoding (chosen here): the payload as **one JSON text** under the key ``WIRE_KEY``
(``"dynamo_logits"``) of ``custom_params``; a string is a JSON scalar, so it survives SGLang's
typed decoding unchanged (``tests/sglang`` proves it with SGLang's own decoder). SGLang writes its
own keys into the same dict (``thinking_budget``, ``__sglang_*``, ``__req__``); ours is namespaced.

The text is parsed exactly once, here, into the list that ``dynlogits.sdk`` validates; a payload
that is itself JSON text inside the text is refused like any other non-list payload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any

from dynlogits import sdk
from dynlogits.specs import WIRE_KEY, SpecError

__all__ = ["CARRIER_PATH", "WIRE_KEY", "carried_payload", "encode_carried", "put_carried", "validate"]

#: Where the payload sits, for error messages.
CARRIER_PATH = f"custom_params.{WIRE_KEY}"


def encode_carried(payload: list[dict[str, Any]]) -> str:
    """The JSON text carried in ``custom_params[WIRE_KEY]`` for a wire payload."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False)


def carried_payload(custom_params: Mapping[str, Any] | None) -> Any | None:
    """The payload carried in ``custom_params`` (``None`` when absent), parsed from its JSON text.

    ``SpecError`` naming ``custom_params.dynamo_logits`` when the value is not JSON text. The
    parsed value is not validated here (see ``validate`` and ``sdk.realize``).
    """
    if not custom_params:
        return None
    text = custom_params.get(WIRE_KEY)
    if text is None:
        return None
    if not isinstance(text, str):
        raise SpecError.single(CARRIER_PATH, f"must be the payload as JSON text, got {type(text).__name__}")
    try:
        return json.loads(text)
    except ValueError as err:
        raise SpecError.single(CARRIER_PATH, f"is not valid JSON: {err}") from None


def put_carried(custom_params: MutableMapping[str, Any], payload: list[dict[str, Any]] | None) -> None:
    """Set (or, with ``None``, remove) the carried payload in ``custom_params``."""
    if payload is None:
        custom_params.pop(WIRE_KEY, None)
    else:
        custom_params[WIRE_KEY] = encode_carried(payload)


def validate(custom_params: Mapping[str, Any] | None, *, vocab_size: int | None = None) -> None:
    """Admission: raise ``SpecError`` (a ``ValueError`` naming the field) unless the carried payload
    would realize. Paths of entry problems are the SDK's (``dynamo_logits[0].token_ids[3]``)."""
    sdk.validate(carried_payload(custom_params), vocab_size=vocab_size)
