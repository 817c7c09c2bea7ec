"""vLLM's half of the engine-side spec source (``dynlogits.policy.engine_spec``): role, tokenizer, width.

* Engine role from ``kv_transfer_config.kv_role``: ``kv_producer`` is prefill (activates nothing
  unless the spec sets ``generation_only: false``), ``kv_consumer`` decode, anything else aggregated.
* A request with ``extra_args["kv_transfer_params"]["do_remote_decode"]`` true is a prefill for a
  remote decode worker (NVIDIA Dynamo's prefill handler) and activates nothing, whatever the role.
* A request's payload (a list or its JSON text, ``request.carried_payload``) is a client's here.
* The tokenizer is the engine's (``cached_tokenizer_from_config``), for text and the test hook.
* A model folder's default reasoning delimiters (``dynlogits.model_builder.model_reasoning``) apply
  where the operator's config sets none."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dynlogits.model_builder import REASONING_FILE, model_reasoning
from dynlogits.policy.config import parse_reasoning
from dynlogits.policy.engine_spec import EngineSpec, client_payload_config, resolve_engine_spec
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.policy.text import TextTokenizer
from dynlogits.specs import SpecLimits

from .request import carried_payload, read_payload, request_role

__all__ = ["VllmEngineSpec", "engine_role", "engine_spec_for", "request_role"]


def engine_role(vllm_config: Any) -> DisaggregationMode:
    """The engine's disaggregation role from ``kv_transfer_config`` (see the module doc)."""
    kv = getattr(vllm_config, "kv_transfer_config", None)
    kv_role = getattr(kv, "kv_role", None) if kv is not None and getattr(kv, "kv_connector", None) else None
    if kv_role == "kv_producer":
        return DisaggregationMode.PREFILL
    if kv_role == "kv_consumer":
        return DisaggregationMode.DECODE
    return DisaggregationMode.AGGREGATED


class VllmEngineSpec:
    """An ``EngineSpec`` reading its requests from vLLM ``SamplingParams``."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec

    @property
    def role(self) -> DisaggregationMode:
        return self.spec.role

    @property
    def limits(self) -> SpecLimits:
        """The operator's limits (``limits:`` of the config)."""
        return self.spec.policy.config.limits

    def payload_for(self, params: Any) -> list[dict[str, Any]] | None:
        """The wire payload this request runs (``SpecError`` naming the field if the client's is bad)."""
        payload = carried_payload(read_payload(params), self.spec.policy.config.limits)
        return self.spec.payload_for(payload, role=request_role(params, self.spec.role))

    def __repr__(self) -> str:
        deployment = self.spec.policy.deployment
        kinds = [e.kind for e in deployment.entries] if deployment is not None else []
        return f"VllmEngineSpec(role={self.role.value!r}, deployment={kinds}, allow_request_kinds={sorted(self.spec.policy.config.allow_request_kinds)})"


def engine_spec_for(vllm_config: Any, vocab_size: int, environ: Mapping[str, str] = os.environ) -> VllmEngineSpec | None:
    """Resolve the engine-side spec at engine start (``None`` unless ``DYN_LOGITS_SPEC_SOURCE=engine``);
    ``SpecError`` for a bad operator setting, so the engine does not start."""

    def tokenizer() -> TextTokenizer:
        from vllm.tokenizers.registry import cached_tokenizer_from_config

        return cached_tokenizer_from_config(vllm_config.model_config)

    client_payload_config(environ)  # a bad DYN_LOGITS_REQUEST_KINDS stops the engine here, not each request
    model = str(getattr(getattr(vllm_config, "model_config", None), "model", "") or "")
    declared = model_reasoning(model) if model else None
    default = parse_reasoning(declared, source=f"{model}/{REASONING_FILE}") if declared is not None else None
    spec = resolve_engine_spec(engine_role(vllm_config), tokenizer, vocab_size, environ, default_reasoning=default)
    return VllmEngineSpec(spec) if spec is not None else None
