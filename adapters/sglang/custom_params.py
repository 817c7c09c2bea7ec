"""How a payload travels in SGLang's ``custom_params``, and the admission check.

Two encodings are read under the key ``WIRE_KEY`` (``"dynamo_logits"``), with the same checks and
limits (both end in ``dynlogits.sdk``'s validation):

* **JSON text** (what this adapter's ``activation`` sends): the wire payload as one string.
  SGLang types ``SamplingParams.custom_params`` as ``Dict[str, CustomParamValue]`` with
  ``CustomParamValue = JSON scalar | List[JSON scalar] | Dict[str, JSON scalar]``
  (``sglang/srt/sampling/sampling_params.py``, 0.5.21 and 0.5.23); a string is a scalar, so it
  survives both of SGLang's tokenizer-to-scheduler transports: pickle (``SGLANG_USE_PICKLE_IPC``,
  default on in ``srt/environ.py``) and the typed msgpack codec (``managers/io_struct.py``:
  ``sock_send``/``sock_recv``, ``msgpack_decode``), which rejects a list of objects.
* **The payload itself** (NVIDIA Dynamo's form: its SGLang adapter sends
  ``custom_params={"dynamo_logits": [ {kind: ...}, ... ], "dynamo_uid": ...}``, a list of entry
  dicts from ``dynamo.common.backend.engine.serialize_logits_processor_entries``). It reaches the
  scheduler only over SGLang's default pickle transport. ``dynamo_uid`` is Dynamo's own key and is
  ignored here (this adapter keeps per-request state on the request, not in a uid-keyed map).

Only a string is parsed, exactly once; any other value *is* the payload, so a dict or a number is
refused by the SDK's own rule (``dynamo_logits: must be a list``), and JSON text that decodes to
text again is refused the same way. SGLang writes its own keys into the same dict
(``thinking_budget``, ``__sglang_*``, ``__req__``); ours is namespaced.
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


def encode_carried(payload: Any) -> str:
    """The JSON text carried in ``custom_params[WIRE_KEY]`` for a wire payload."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False)


def carried_payload(custom_params: Mapping[str, Any] | None) -> Any | None:
    """The payload carried in ``custom_params`` (``None`` when absent): JSON text parsed, any other
    value as it is (Dynamo's list of entry dicts). Not validated here (``validate``, ``sdk.realize``).

    ``SpecError`` naming ``custom_params.dynamo_logits`` when the text is not JSON (or nests too
    deeply to parse); nothing else is raised.
    """
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
