"""Per-request work bounds (``dynlogits.serve.limits``): each factor is refused with its field and
its limit's setting, on raw JSON, before any model or tokenizer sees the request."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from dynlogits.serve.limits import (
    RequestLimits,
    add_limit_flags,
    body_limit_problem,
    generate_limit_problem,
    limits_from_flags,
)
from dynlogits.serve.protocol import ChatMessage

LIMITS = RequestLimits()
BASE: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("fields", "param", "limit"), [
    ({"stop": [f"s{i}" for i in range(100_000)]}, "stop", "max_stop_sequences"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "max_stop_sequences"),
    ({"stop": ["ok", "x" * 257]}, "stop[1]", "max_stop_chars"),
    ({"stop": "x" * 257}, "stop", "max_stop_chars"),
    ({"messages": [{"role": "user", "content": "ab " * 1_300_000}]}, "messages", "max_prompt_chars"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 131_073}]}]}, "messages",
     "max_prompt_chars"),
    ({"messages": [{"role": "user"}] * 2049}, "messages", "max_messages"),
    ({"messages": [{"role": "user", "content": "hi", "name": "x" * 131_072}]}, "messages", "max_prompt_chars"),
    ({"n": 16, "max_tokens": 2049}, "max_tokens", "max_request_tokens"),
    ({"n": 16, "max_completion_tokens": 4000}, "max_completion_tokens", "max_request_tokens"),
    ({"vllm_xargs": {f"k{i}": i for i in range(65)}}, "vllm_xargs", "max_extra_args"),
    ({"extra_args": {"k": list(range(64))}}, "extra_args", "max_extra_args"),
])
def test_each_work_factor_over_its_limit_is_named_with_the_limit(fields: dict[str, Any], param: str,
                                                                  limit: str) -> None:
    problem = body_limit_problem({**BASE, **fields}, LIMITS)
    assert problem is not None and problem.param == param, problem
    assert problem.message.startswith(f"{param}: ") and f"(limit {limit})" in problem.message, problem


@pytest.mark.parametrize(("prompt", "what"), [("x" * 131_073, "characters"), (["x" * 131_073], "characters"),
                                              (list(range(131_073)), "token ids")])
def test_a_completion_prompt_is_bounded_before_tokenization(prompt: Any, what: str) -> None:
    problem = body_limit_problem({"model": "m", "prompt": prompt}, LIMITS)
    assert problem is not None and problem.param == "prompt" and what in problem.message, problem


@pytest.mark.parametrize("fields", [
    {"stop": ["a", "b", "c", "d"]}, {"stop": "x" * 256}, {"n": 16, "max_tokens": 2048}, {"n": 16},
    {"messages": [{"role": "user", "content": "x" * 131_068}]},  # 131,072 characters with the role
    {"vllm_xargs": {f"k{i}": i for i in range(64)}},
    # the wrong types are the body model's to report, not a limit's
    {"stop": 7}, {"n": "many", "max_tokens": 100}, {"messages": "hi"}, {"max_tokens": -1},
])
def test_requests_within_the_limits_or_of_the_wrong_type_pass(fields: dict[str, Any]) -> None:
    assert body_limit_problem({**BASE, **fields}, LIMITS) is None


def test_the_default_max_tokens_counts_towards_n_times_max_tokens() -> None:
    limits = RequestLimits(max_request_tokens=100)
    problem = body_limit_problem({**BASE, "n": 7}, limits)  # 7 * 16 tokens
    assert problem is not None and problem.param == "n" and "7 * 16 = 112" in problem.message


def test_the_worker_checks_its_own_protocol_with_its_own_paths() -> None:
    common: dict[str, Any] = {"prompt": None, "prompt_token_ids": None, "messages": None, "n": 1,
                              "max_tokens": None, "stop": [], "extra_args": {}, "limits": LIMITS}
    cases = [({"stop": ["s"] * 5}, "sampling.stop"), ({"prompt": "x" * 131_073}, "prompt"),
             ({"prompt_token_ids": [1] * 131_073}, "prompt_token_ids"),
             ({"messages": [ChatMessage(role="user", content="x" * 131_073)]}, "messages"),
             ({"n": 16, "max_tokens": 4096}, "sampling.max_tokens"),
             ({"extra_args": {"k": list(range(100))}}, "extra_args")]
    for fields, param in cases:
        problem = generate_limit_problem(**{**common, **fields})
        assert problem is not None and problem.param == param, (fields.keys(), problem)
    assert generate_limit_problem(**{**common, "prompt": "hi"}) is None


def test_limits_come_from_the_environment_and_flags_override_them() -> None:
    env = {"DYN_MAX_STOP_SEQUENCES": "8", "DYN_MAX_PROMPT_CHARS": "1000"}
    assert RequestLimits.from_env(env) == RequestLimits(max_stop_sequences=8, max_prompt_chars=1000)
    p = argparse.ArgumentParser()
    add_limit_flags(p, env)
    assert limits_from_flags(p.parse_args(["--max-stop-sequences", "2"])).max_stop_sequences == 2
    assert limits_from_flags(p.parse_args([])).max_prompt_chars == 1000


@pytest.mark.parametrize("value", ["x", "0", "-3", "1.5"])
def test_a_bad_setting_is_refused_naming_its_variable(value: str) -> None:
    with pytest.raises(ValueError, match="DYN_MAX_MESSAGES: must be an integer >= 1"):
        RequestLimits.from_env({"DYN_MAX_MESSAGES": value})
    p = argparse.ArgumentParser()
    with pytest.raises(SystemExit):
        add_limit_flags(p, {"DYN_MAX_MESSAGES": value})


def test_the_worker_server_limits_come_from_the_environment_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynlogits.serve.worker.args import parse_worker_args

    monkeypatch.setenv("DYN_HEADER_TIMEOUT", "3")
    monkeypatch.setenv("DYN_WORKER_MAX_CONNECTIONS", "12")
    args = parse_worker_args([])
    assert (args.header_timeout_s, args.max_connections) == (3.0, 12)
    assert parse_worker_args(["--max-connections", "7"]).max_connections == 7
    monkeypatch.setenv("DYN_WORKER_MAX_CONNECTIONS", "0")
    with pytest.raises(SystemExit):
        parse_worker_args([])
