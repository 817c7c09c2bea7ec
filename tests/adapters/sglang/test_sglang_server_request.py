"""What a client of SGLang's own HTTP server (``python -m sglang.launch_server
--enable-custom-logit-processor``) sends to run dynlogits per request, and what that server trusts.

SGLang's server cannot start here (it needs a GPU), so the bodies go through SGLang's real request
classes, as its HTTP layer builds them: the OpenAI ``ChatCompletionRequest`` (top-level
``custom_logit_processor`` and ``custom_params``) down to SGLang's ``SamplingParams``, and the
native ``/generate`` body (``GenerateReqInput``: ``custom_logit_processor`` beside
``sampling_params.custom_params``); then the processor string through SGLang's own
``CustomLogitProcessor.from_str``, which the scheduler calls for every request naming one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest  # noqa: E402  (after the shim)
from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: E402
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from dynlogits.adapters.sglang import validate
from dynlogits.adapters.sglang.processor import DynamoSglangLogitProcessor, processor_string
from dynlogits.client import payload_text
from dynlogits.specs import WIRE_KEY, SpecError

FORCED = [{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 2}]
BAD = [{"kind": "forced_sequence", "token_ids": [5, -3], "eos_token_id": 2}]


def chat_body(custom_params: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "custom_logit_processor": processor_string(), "custom_params": custom_params}


def chat_sampling_params(body: dict[str, Any]) -> SamplingParams:
    request = ChatCompletionRequest.model_validate(body)
    return SamplingParams(**request.to_sampling_params(stop=[], model_generation_config={}))


@pytest.mark.parametrize("carried", [payload_text(FORCED), FORCED], ids=["json-text", "list"])
def test_an_openai_chat_body_carries_the_payload_into_sglangs_sampling_params(carried: Any) -> None:
    params = chat_sampling_params(chat_body({WIRE_KEY: carried}))
    assert params.custom_params == {WIRE_KEY: carried}
    validate(params.custom_params)


def test_a_bad_entry_sent_to_sglangs_server_is_named_by_its_field() -> None:
    params = chat_sampling_params(chat_body({WIRE_KEY: json.dumps(BAD)}))
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]\.token_ids\[1\]: must be >= 0"):
        validate(params.custom_params)


def test_a_native_generate_body_carries_both_fields() -> None:
    obj = GenerateReqInput(text="hi", custom_logit_processor=processor_string(),
                           sampling_params={"max_new_tokens": 8, "custom_params": {WIRE_KEY: payload_text(FORCED)}})
    obj.normalize_batch_and_arguments()
    validate(SamplingParams(**obj.sampling_params).custom_params)
    assert obj.custom_logit_processor == processor_string()


def test_sglang_loads_our_processor_by_reference() -> None:
    assert isinstance(CustomLogitProcessor.from_str(processor_string()), DynamoSglangLogitProcessor)


class _Touch:
    """A pickle that creates a file when loaded: a stand-in for any code a client could send."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


def test_sglangs_server_runs_whatever_processor_string_a_client_sends(tmp_path: Path) -> None:
    """Why such a server must not face untrusted clients: ``from_str`` unpickles the client's string."""
    import dill

    marker = tmp_path / "ran"
    client_string = json.dumps({"callable": dill.dumps(_Touch(marker)).hex()})
    with pytest.raises(TypeError):  # what it built is not a processor class; the code already ran
        CustomLogitProcessor.from_str(client_string)
    assert marker.exists()
