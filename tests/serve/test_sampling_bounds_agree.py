"""The frontend and the worker accept and refuse the same sampling values: both declare each sampling
field with the one type in ``dynlogits.serve.sampling_fields``, and each refusal names the field (the
frontend as the client sent it, the worker under ``sampling.``) and the same rule."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dynlogits.policy.config import parse_config
from dynlogits.serve.frontend.openai_models import ChatCompletionRequest, CompletionRequest, RequestBody
from dynlogits.serve.frontend.validation import validate_request
from dynlogits.serve.http.bodies import first_error
from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.limits import RequestLimits
from dynlogits.serve.protocol import GenerateRequest, SamplingOptions

CONFIG = parse_config({})
#: Loose enough that no per-request limit refuses a value before its bounds are checked.
LOOSE = RequestLimits(max_request_tokens=2**62)
INT32, INT64 = 2**31, 2**63

VALUES: dict[str, list[Any]] = {
    "max_tokens": [-1, 0, 1, 64, INT32 - 1, INT32, 1.5, "8"],
    "temperature": [-0.01, 0, 0.7, 2, 2.01, 5, "hot"],
    "top_p": [-0.5, 0, 0.01, 1, 1.01],
    "top_k": [-INT32 - 1, -INT32, -1, 0, 50, INT32 - 1, INT32],
    "seed": [-INT64 - 1, -INT64, 0, INT64 - 1, INT64],
    "n": [0, 1, 16, 17],
    "presence_penalty": [-2.01, -2, 0, 1.5, 2, 2.01],
    "frequency_penalty": [-2.01, -2, 0, 1.5, 2, 2.01],
}
CASES = [(name, value) for name, values in VALUES.items() for value in values]


def _frontend(field: str, value: Any, model: type[RequestBody] = ChatCompletionRequest) -> tuple[str, str] | None:
    """``(param, rule)`` of the frontend's 400, or ``None`` when it accepts the value."""
    prompt = {"messages": [{"role": "user", "content": "hi"}]} if model is ChatCompletionRequest else {"prompt": "hi"}
    try:
        validate_request(model, {"model": "m", **prompt, field: value}, CONFIG, LOOSE)
    except HTTPError as err:
        assert err.status == 400 and err.param is not None
        return err.param, err.message.removeprefix(f"{err.param}: ")
    return None


def _worker(field: str, value: Any) -> tuple[str, str] | None:
    """``(param, rule)`` of the worker's 400 for its ``/generate`` body, or ``None`` when it accepts it."""
    try:
        GenerateRequest.model_validate({"request_id": "r", "prompt": "hi", "sampling": {field: value}})
    except ValidationError as err:
        bad = first_error(err.errors())
        assert bad.param is not None
        return bad.param, bad.message.removeprefix(f"{bad.param}: ")
    return None


def test_every_sampling_field_of_the_worker_is_checked_here() -> None:
    assert set(VALUES) == set(SamplingOptions.model_fields) - {"stop", "ignore_eos"}


@pytest.mark.parametrize(("field", "value"), CASES, ids=[f"{f}={v!r}" for f, v in CASES])
def test_the_frontend_and_the_worker_accept_and_refuse_the_same_values(field: str, value: Any) -> None:
    frontend, worker = _frontend(field, value), _worker(field, value)
    assert (frontend is None) == (worker is None), (frontend, worker)
    assert _frontend(field, value, CompletionRequest) == frontend
    if frontend is not None and worker is not None:
        assert frontend[0] == field and worker[0] == f"sampling.{field}"
        assert frontend[1] == worker[1] and frontend[1]  # the same rule, stated


def test_a_temperature_over_2_is_refused_by_the_worker_too() -> None:
    assert _worker("temperature", 2.5) == ("sampling.temperature", "Input should be less than or equal to 2")
    assert _frontend("temperature", 2.5) == ("temperature", "Input should be less than or equal to 2")


def test_chats_max_completion_tokens_has_the_bounds_of_max_tokens() -> None:
    for value in VALUES["max_tokens"]:
        chat = _frontend("max_completion_tokens", value)
        worker = _worker("max_tokens", value)
        assert (chat is None) == (worker is None) and (chat is None or chat[1] == worker[1]), (value, chat, worker)
