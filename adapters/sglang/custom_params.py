"""How a payload travels in SGLang's ``custom_params``, and the admission check.

Under ``WIRE_KEY`` (``"dynamo_logits"``) two encodings are read, with the same checks and limits:

* JSON text (what ``activation`` sends): a string is a ``CustomParamValue`` scalar
  (``sglang/srt/sampling/sampling_params.py``), so it passes both tokenizer-to-scheduler transports,
  pickle (the default, ``srt/environ.py``) and msgpack (``managers/io_struct.py``), which rejects a
  list of objects;
* the entry list itself (NVIDIA Dynamo's form, pickle transport only); Dynamo's ``dynamo_uid`` is ignored.

Only a string is parsed, once; any other value is the payload and is validated as such."""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any

from dynlogits import sdk
from dynlogits.specs import WIRE_KEY, SpecError

__all__ = ["CARRIER_PATH", "WIRE_KEY", "carried_payload", "encode_carried", "put_carried", "validate"]

#: Where the payload sits, for error messages.
CARRIER_PATH = f"custom_params.{WIRE_KEY}"


def encode_carried(payload: Any) -> str:
    """The JSON text carried in ``custom_params[WIRE_KEY]`` for a wire payload."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False)


def carried_payload(custom_params: Mapping[str, Any] | None) -> Any | None:
    """The payload carried in ``custom_params`` (``None`` when absent): JSON text parsed, any other
    value as it is. Not validated here. Raises only ``SpecError`` naming
    ``custom_params.dynamo_logits`` (text that is not JSON, or nests too deeply)."""
    if not custom_params:
        return None
    value = custom_params.get(WIRE_KEY)
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as err:
        raise SpecError.single(CARRIER_PATH, f"is not valid JSON: {err}") from None
    except RecursionError:  # json raises it for deep nesting; it must not escape into the sampler
        raise SpecError.single(CARRIER_PATH, "is JSON nested too deeply to parse") from None


def put_carried(custom_params: MutableMapping[str, Any], payload: list[dict[str, Any]] | None) -> None:
    """Set (or, with ``None``, remove) the carried payload in ``custom_params``, as JSON text."""
    if payload is None:
        custom_params.pop(WIRE_KEY, None)
    else:
        custom_params[WIRE_KEY] = encode_carried(payload)


def validate(custom_params: Mapping[str, Any] | None, *, vocab_size: int | None = None) -> None:
    """Admission: raise ``SpecError`` (a ``ValueError`` naming the field) unless the carried payload,
    in either encoding, would realize. Paths of entry problems are the SDK's
    (``dynamo_logits[0].token_ids[3]``)."""
    sdk.validate(carried_payload(custom_params), vocab_size=vocab_size)
