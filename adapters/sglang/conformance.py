"""Conformance-kit drivers for the SGLang adapter (``dynlogits conformance sglang``).

Each driver runs ``DynamoSglangLogitProcessor`` inside SGLang's real scheduler-side classes through
``harness.SglangSchedulerHarness`` (no engine: it needs a GPU and ``sgl-kernel``):

* ``sglang-overlap``: the overlap scheduler with delayed sampling, as the worker configures SGLang;
* ``sglang-no-overlap``: ``--disable-overlap-schedule``;
* ``sglang-dynamo-list``: as ``sglang-overlap``, list payloads in NVIDIA Dynamo's form (the list of
  entry dicts) over SGLang's default pickle transport; the others send JSON text over msgpack.

Overlap without delayed sampling (``output_ids`` one behind) is covered by ``tests/adapters/sglang``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from dynlogits import sdk
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.specs import WIRE_KEY, LogitsProcessorSpec

from .compat import import_sglang_srt

import_sglang_srt()

from .activation import activate  # noqa: E402
from .compat import sglang_version  # noqa: E402
from .custom_params import carried_payload, encode_carried, validate  # noqa: E402
from .harness import Mode, SglangSchedulerHarness  # noqa: E402
from .processor import FAILURES, REQUEST_KEY, processor_string  # noqa: E402

__all__ = ["Encoding", "SglangDriver", "drivers"]

#: How a driver carries the payload in ``custom_params`` (see ``custom_params``).
Encoding = Literal["json-text", "dynamo-list"]


class SglangDriver:
    """The kit's requests and steps, played through ``SglangSchedulerHarness``."""

    releases_on_finish = True
    #: what the kit's requests sample at (SGLang's ``SamplingParams`` default), for the oracle (``watermark``)
    temperature = 1.0

    def __init__(self, vocab_size: int, *, mode: Mode, encoding: Encoding = "json-text") -> None:
        self.vocab_size = vocab_size
        self.encoding: Encoding = encoding
        if encoding == "dynamo-list":
            self.name = "sglang-dynamo-list"
        else:
            self.name = "sglang-overlap" if mode == "overlap-delay-sample" else f"sglang-{mode}"
        ipc: Literal["pickle", "msgpack"] = "pickle" if encoding == "dynamo-list" else "msgpack"
        self.exercised = (
            f"SGLang {sglang_version()}: real DynamoSglangLogitProcessor (a CustomLogitProcessor loaded by to_str) in real "
            "Req/ScheduleBatch/SamplingBatchInfo (from_schedule_batch, filter_batch, merge_batch) and "
            f"apply_custom_logit_processor; payload as {encoding} over {ipc} IPC; scheduler bookkeeping by a harness "
            f"({mode}); engine not started (needs a GPU)"
        )
        self._started = False
        self.harness = SglangSchedulerHarness(vocab_size, mode=mode, ipc=ipc)

    def _carried(self, payload: Any) -> Any:
        """``custom_params[WIRE_KEY]`` for ``payload`` in this driver's encoding."""
        if self.encoding == "dynamo-list" and isinstance(payload, list):
            return payload
        return encode_carried(payload)

    def activate(self, spec: LogitsProcessorSpec | None, role: DisaggregationMode) -> Any | None:
        params = {"custom_params": {WIRE_KEY: encode_carried([{"kind": "smuggled"}])}}
        activate(params, sdk.gate(spec, role))
        return carried_payload(params["custom_params"])

    def admit(self, payload: Any) -> None:
        validate({WIRE_KEY: self._carried(payload)})

    def add(self, req_id: str, payload: Any, *, prompt_ids: Sequence[int], output_ids: Sequence[int] = (),
            eos_token_id: int, stop_token_ids: Sequence[int] = (), arrival_time: float | None = None) -> None:
        if not self._started:  # the adapter's failure log is per process: start it afresh for this driver
            FAILURES.clear()
            self._started = True
        sampling_params: dict[str, Any] = {"max_new_tokens": 64}
        if stop_token_ids:
            sampling_params["stop_token_ids"] = list(stop_token_ids)
        if payload is not None:
            sampling_params["custom_params"] = {WIRE_KEY: self._carried(payload)}
            sdk.put_arrival(sampling_params["custom_params"], arrival_time)  # where activate() puts it
        self.harness.add(req_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                         custom_logit_processor=None if payload is None else processor_string(),
                         output_ids=output_ids, eos_token_ids={eos_token_id})

    def step(self, batch: Sequence[str], logits: torch.Tensor) -> torch.Tensor:
        return self.harness.step(batch, logits)

    def commit(self, req_id: str, token_id: int) -> None:
        self.harness.commit(req_id, token_id)

    def remove(self, req_id: str) -> None:
        self.harness.remove(req_id)

    def break_engine_reads(self, req_id: str) -> None:
        """The processor gets a ``Req`` with neither committed-length layout (``kv`` and
        ``kv_committed_len`` missing), as an SGLang version that moved the counter would hand over."""
        self.harness.present_req_as(req_id, hidden=("kv", "kv_committed_len"))

    def held_requests(self) -> int:
        held = 0
        for request in self.harness.requests.values():
            params = request.req.sampling_params.custom_params
            held += isinstance(params, dict) and params.get(REQUEST_KEY) is not None
        return held

    def failures(self) -> list[str]:
        return list(FAILURES)


def drivers(vocab_size: int) -> list[SglangDriver]:
    """The kit's factory: the overlap scheduler (delayed sampling, the worker's setting), no overlap,
    and the worker's setting with NVIDIA Dynamo's payload form."""
    return [SglangDriver(vocab_size, mode="overlap-delay-sample"), SglangDriver(vocab_size, mode="no-overlap"),
            SglangDriver(vocab_size, mode="overlap-delay-sample", encoding="dynamo-list")]
