"""``DynamoVllmLogitsProcessor``: one class for both of vLLM's model runners.

vLLM picks the runner after the engine arguments are fixed (``VllmConfig.use_v2_model_runner``), so
the class subclasses both ABCs and vLLM's loader picks the interface; ``__init__`` and ``apply`` tell
the two apart by argument type. Payload reading, admission, realization and failure isolation are
shared; each runner's bookkeeping is a mixin (``v1``, ``v2``). On a vLLM without the V2 interface
the class is a plain V1 ``AdapterLogitsProcessor``."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from dynlogits.sdk import GuardedRequest

from .capabilities import check_vllm_config
from .engine_spec import engine_spec_for
from .native import refuse_conflicts
from .request import realize_request, validate
from .v1 import V1RunnerMixin
from .v2 import HAS_V2_INTERFACE, LogitsProcRequestState, V2RunnerMixin

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["MAX_RECORDED_FAILURES", "DynamoVllmLogitsProcessor"]

#: How many failure messages one processor instance keeps (oldest dropped first).
MAX_RECORDED_FAILURES = 64


def _is_v2_state(obj: object) -> bool:
    return HAS_V2_INTERFACE and isinstance(obj, LogitsProcRequestState)


class DynamoVllmLogitsProcessor(V1RunnerMixin, V2RunnerMixin):
    """Applies each request's ``extra_args["dynamo_logits"]`` processors in its sampler.

    * V1 runner: ``DynamoVllmLogitsProcessor(vllm_config, device, is_pin_memory)``,
      ``update_state(batch_update)``, ``apply(logits)``.
    * Model Runner V2: ``DynamoVllmLogitsProcessor(vllm_config, req_states)``,
      ``add_request(slot, params) -> bool``, ``apply(logits, ctx)``.
    * Both: ``validate_params(params)`` raises ``SpecError`` (a ``ValueError`` naming the field) at
      admission; ``new_req_logits_processor(params)`` realizes one request (``None`` without a
      payload); a run-time failure ends only its request and is recorded in ``failures``.

    ``vocab_size`` is the logits width (``model_config.get_vocab_size()``); every payload id must be below it."""

    runner: Literal["v1", "v2"]
    vocab_size: int
    failures: deque[str]

    def __init__(self, vllm_config: VllmConfig, device_or_req_states: Any, is_pin_memory: bool = False) -> None:
        check_vllm_config(vllm_config)
        self.failures = deque(maxlen=MAX_RECORDED_FAILURES)
        self.realized = 0  # payloads realized so far: one per request (the V1 runner's re-adds reuse them)
        if _is_v2_state(device_or_req_states):
            self.runner = "v2"
            self.vocab_size = int(device_or_req_states.vocab_size)
            self._init_v2_state(vllm_config, device_or_req_states)
        else:
            self.runner = "v1"
            V1RunnerMixin.__init__(self, vllm_config, device_or_req_states, is_pin_memory)
            self.vocab_size = int(vllm_config.model_config.get_vocab_size())
            self._init_v1_state(vllm_config, device_or_req_states)
        self.engine_spec = engine_spec_for(vllm_config, self.vocab_size)  # DYN_LOGITS_SPEC_SOURCE=engine

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Admission check for one request; raises ``SpecError`` naming the bad field (vLLM's own
        ``thinking_token_budget`` beside a ``thinking_budget`` entry included: ``native``)."""
        validate(sampling_params)
        refuse_conflicts(sampling_params)

    def new_req_logits_processor(self, params: Any, prompt_ids: Sequence[int] | None = None) -> GuardedRequest | None:
        """Fresh per-request callable ``(output_ids, row) -> row``, or ``None`` without a payload
        (``prompt_ids``: the request's prompt, where the runner gives it)."""
        request = realize_request(params, vocab_size=self.vocab_size, report=self.failures.append,
                                   engine_spec=self.engine_spec, prompt_ids=prompt_ids)
        if request is not None:
            self.realized += 1
        return request

    def held_requests(self) -> int:
        """How many requests this instance holds state for: V1, those in its batch plus those realized and
        not yet released by vLLM; V2, the occupied slots with a payload. Zero once nothing is in flight."""
        if self.runner == "v2":
            return int(self._active.sum())
        return max(len(self._entries), len(self._realized))

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        """Edit the rows of requests with a payload in place and return ``logits``."""
        if self.runner == "v2":
            if ctx is None:
                raise TypeError("Model Runner V2 calls apply(logits, ctx); ctx is missing")
            return self._apply_v2(logits, ctx)
        return self._apply_v1(logits)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(runner={self.runner!r}, vocab_size={self.vocab_size})"
