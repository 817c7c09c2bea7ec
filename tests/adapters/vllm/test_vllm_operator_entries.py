"""Behind vLLM's own admission (``validate_params``) and realization, a client can neither switch
the deployment's entries off nor escape them, and the deployment's entries never count against a
client's ``max_entries`` (issue 47, items 3 and 6). Engine-free: vLLM's real ``SamplingParams``, the
adapter's ``validate`` and ``realize_request``; ``tests/deploy/test_operator_entries.py`` runs the
same through ``launch/agg.sh``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from dynlogits.adapters.vllm.engine_spec import VllmEngineSpec  # noqa: E402
from dynlogits.adapters.vllm.request import realize_request, validate  # noqa: E402
from dynlogits.policy.engine_spec import REQUEST_KINDS_ENV, SPEC_SOURCE_ENV, resolve_engine_spec  # noqa: E402
from dynlogits.policy.roles import DisaggregationMode  # noqa: E402
from dynlogits.specs import DEFAULT_LIMITS, WIRE_KEY, SpecError  # noqa: E402

VOCAB = 1024
BAN = {"kind": "banned_tokens", "token_ids": [735, 450]}
SCOPED_BAN = {"kind": "banned_tokens", "token_ids": [300], "scope": "answer"}
DEADLINE = {"kind": "deadline", "seconds": 30.0}
REASONING = {"kind": "reasoning", "start_token_ids": [8], "end_token_ids": [9]}


def _bans(n: int) -> list[dict[str, Any]]:
    return [{"kind": "banned_tokens", "token_ids": [10 + i]} for i in range(n)]


def _row(request: Any) -> torch.Tensor:
    row = torch.zeros(VOCAB)
    request([], row)
    return row


@pytest.fixture()
def worker_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SPEC_SOURCE_ENV, raising=False)
    monkeypatch.setenv(REQUEST_KINDS_ENV, "banned_tokens,deadline,reasoning")


@pytest.fixture()
def engine_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, embedded_tokenizer: Any) -> VllmEngineSpec:
    """``DYN_LOGITS_SPEC_SOURCE=engine`` with an operator config like ``tests/deploy/open_deployment.yaml``."""
    config = tmp_path / "logits.yaml"
    config.write_text(yaml.safe_dump({"entries": [BAN, SCOPED_BAN], "reasoning": {"start_token_ids": [5], "end_token_ids": [6]},
                                      "allow_request_kinds": ["banned_tokens", "deadline", "reasoning", "forced_sequence"]}))
    monkeypatch.setenv(SPEC_SOURCE_ENV, "engine")
    monkeypatch.setenv("DYN_LOGITS_SPEC", str(config))
    spec = resolve_engine_spec(DisaggregationMode.AGGREGATED, lambda: embedded_tokenizer, VOCAB)
    assert spec is not None
    return VllmEngineSpec(spec)


# -- the worker as the spec source: the payload it wrote, or a client's text --------------------------
def test_a_written_payload_needing_a_stop_token_is_refused_under_ignore_eos_naming_both(worker_source) -> None:
    payload = [BAN, DEADLINE]
    validate(SamplingParams(extra_args={WIRE_KEY: payload}))
    validate(SamplingParams(ignore_eos=True, stop_token_ids=[2], extra_args={WIRE_KEY: payload}))
    with pytest.raises(SpecError, match=r"^dynamo_logits\[1\]: deadline forces the request's stop token .*ignore_eos"):
        validate(SamplingParams(ignore_eos=True, extra_args={WIRE_KEY: payload}))
    with pytest.raises(SpecError, match=r"^extra_args\.dynamo_logits\[0\]: deadline .*ignore_eos"):
        validate(SamplingParams(ignore_eos=True, extra_args={WIRE_KEY: json.dumps([DEADLINE])}))


def test_a_written_payload_counts_the_deployments_entries_apart_from_the_clients(worker_source) -> None:
    """The worker writes the deployment's entries (2 and a reasoning entry here) beside a client's
    16: the engine admits and realizes them; a client's own text is held to its 16."""
    payload = [REASONING, BAN, SCOPED_BAN, *_bans(DEFAULT_LIMITS.max_entries)]
    params = SamplingParams(extra_args={WIRE_KEY: payload})
    validate(params)
    request = realize_request(params, vocab_size=VOCAB)
    assert request is not None and not request.failed and len(request.processor.processors) == len(payload) - 1
    with pytest.raises(SpecError, match=r"^extra_args\.dynamo_logits: must have at most 16 entries \(limit max_entries\)"):
        validate(SamplingParams(extra_args={WIRE_KEY: json.dumps(_bans(DEFAULT_LIMITS.max_entries + 1))}))


# -- the engine as the spec source (vllm serve, NVIDIA Dynamo) --------------------------------------
def test_the_engine_source_refuses_ignore_eos_where_an_entry_needs_a_stop_token(engine_source) -> None:
    with pytest.raises(SpecError, match=r"^extra_args\.dynamo_logits\[0\]: deadline .*ignore_eos"):
        validate(SamplingParams(ignore_eos=True, extra_args={WIRE_KEY: json.dumps([DEADLINE])}))
    validate(SamplingParams(ignore_eos=True, extra_args={WIRE_KEY: json.dumps([BAN])}))


def test_the_engine_source_refuses_a_clients_reasoning_entry_naming_the_operators_scoped_entry(engine_source) -> None:
    with pytest.raises(SpecError, match=r"^extra_args\.dynamo_logits\[0\]: a request's reasoning entry would replace "
                                        r"the deployment's reasoning delimiters, which deployment entries\[1\] "
                                        r"\(banned_tokens, scope answer\)"):
        validate(SamplingParams(extra_args={WIRE_KEY: json.dumps([REASONING])}))


def test_the_engine_source_realizes_a_clients_16_entries_beside_the_deployments(engine_source) -> None:
    params = SamplingParams(extra_args={WIRE_KEY: json.dumps(_bans(DEFAULT_LIMITS.max_entries))})
    validate(params)
    reports: list[str] = []
    request = realize_request(params, vocab_size=VOCAB, engine_spec=engine_source, report=reports.append)
    assert request is not None and not request.failed and not reports
    assert len(request.processor.processors) == DEFAULT_LIMITS.max_entries + 2


def test_a_clients_payload_refused_in_the_engine_leaves_the_deployments_entries_applying(engine_source) -> None:
    """Ids beyond the logits width are known only in the engine: the client's payload is refused
    there, and on a request without a stop token the operator's ban still holds."""
    reports: list[str] = []
    params = SamplingParams(ignore_eos=True, extra_args={WIRE_KEY: json.dumps([{"kind": "banned_tokens",
                                                                                 "token_ids": [VOCAB + 5]}])})
    validate(params)  # the width is not known at admission
    request = realize_request(params, vocab_size=VOCAB, engine_spec=engine_source, report=reports.append)
    assert request is not None and not request.failed
    row = _row(request)
    assert row[735] == -math.inf and row[450] == -math.inf
    assert len(reports) == 1 and "vocab size 1024" in reports[0] and "entries that were realized" in reports[0]
    stopped = realize_request(SamplingParams(stop_token_ids=[2], extra_args=params.extra_args), vocab_size=VOCAB,
                              engine_spec=engine_source)
    assert stopped is not None and stopped.failed and torch.isfinite(_row(stopped)).sum() == 1
