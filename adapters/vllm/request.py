"""One request's processors inside a vLLM sampler, isolated from every other request.

Contract shared by both model runners:

* ``read_payload(params)`` is the only place that reads ``extra_args["dynamo_logits"]``.
* ``validate(params)`` is the admission check (front-end process, before the
  request is queued): it raises ``SpecError`` (a ``ValueError`` naming the field) for anything
  malformed, so vLLM fails that request alone (HTTP 400 through ``vllm serve``). With the engine as
  the spec source (``DYN_LOGITS_SPEC_SOURCE=engine``, ``dynlogits.engine_spec``) the payload is a
  client's: only the operator's ``allow_request_kinds`` pass, within its limits.
* ``realize_request(params, vocab_size, ...)`` runs in the engine process when the request enters
  the batch and returns a fresh ``GuardedRequest`` (or ``None`` when the request carries no
  payload). It never raises: a payload that only fails here (a token id beyond the logits width,
  which admission cannot know) yields a request that is already failed. Given the engine's resolved
  ``engine_spec``, the request runs the deployment's entries plus its own allowed ones, gated by role.

Failure policy: the SDK's (``dynlogits.sdk.guard``). vLLM gives a custom logits processor no way
to fail one request, and an exception escaping the sampler kills the whole engine, so a failing
request is fail-stopped to its EOS (unset under ``ignore_eos``), else its lowest explicit stop id.
"""

from __future__ import annotations

from typing import Any, Protocol

from dynlogits import sdk
from dynlogits.engine_spec import admission_config, check_request_payload
from dynlogits.sdk import FailureReport, GuardedRequest
from dynlogits.specs import WIRE_KEY, SpecError

__all__ = ["PayloadSource", "read_payload", "realize_request", "validate"]


class PayloadSource(Protocol):
    """Where a request's payload comes from when the engine is the spec source
    (``dynlogits.adapters.vllm.engine_spec.VllmEngineSpec``)."""

    def payload_for(self, params: Any) -> list[dict[str, Any]] | None:
        """The wire payload this request runs; ``SpecError`` naming the field if the client's is bad."""


def read_payload(params: Any) -> Any | None:
    """The raw ``dynamo_logits`` payload of a ``SamplingParams``, or ``None`` when absent."""
    extra = getattr(params, "extra_args", None)
    if not extra:
        return None
    return extra.get(WIRE_KEY)


def validate(params: Any) -> None:
    """Admission check: raise ``SpecError`` (``ValueError``) naming the bad field.

    The logits width is unknown in the front-end process, so ids are checked against it only
    when the request is realized in the engine (see the module's failure policy).
    """
    engine_config = admission_config()
    if engine_config is not None:
        check_request_payload(read_payload(params), engine_config)
    else:
        sdk.validate(read_payload(params))


def realize_request(params: Any, *, vocab_size: int, report: FailureReport | None = None,
                    engine_spec: PayloadSource | None = None) -> GuardedRequest | None:
    """Fresh processors for one request entering the batch; ``None`` without a payload. Never raises."""
    stop = sdk.pick_stop_token(getattr(params, "eos_token_id", None), getattr(params, "stop_token_ids", None), vocab_size)
    if engine_spec is None:
        return sdk.realize(read_payload(params), vocab_size=vocab_size, stop_token_id=stop, report=report)
    try:
        payload = engine_spec.payload_for(params)
    except SpecError as err:
        return GuardedRequest.failed_at_realization(f"payload rejected in the engine: {err}", stop_token_id=stop, report=report)
    return sdk.realize(payload, vocab_size=vocab_size, stop_token_id=stop, report=report)
