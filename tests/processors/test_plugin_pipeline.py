"""A plug-in kind through the whole worker path, in one process (no engine): operator config and
request -> policy (validation, role gate, vocabulary) -> activation (the wire payload) -> realization
through the kind's import-string factory -> its effect on logits rows."""

from __future__ import annotations

from typing import Any, Literal

import pytest
import torch
from pydantic import BaseModel, ConfigDict, StrictInt

from dynlogits.sdk import activate_logits_processors
from dynlogits.policy.config import parse_config
from dynlogits.processors import RealizeContext
from dynlogits.sdk.realization import build_request_processor
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.specs import WIRE_KEY, ProcessorKind, SpecError, kinds, register_kind
from dynlogits.policy.request import build_policy

VOCAB, EOS = 32, 1


class RepeatTokenSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["repeat_token"] = "repeat_token"
    token_id: StrictInt
    count: StrictInt
    eos_token_id: StrictInt


class BanRangeSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["ban_range"] = "ban_range"
    start: StrictInt
    stop: StrictInt


def make_repeat(entry: RepeatTokenSpec, ctx: RealizeContext) -> Any:
    def force(generated: Any, row: torch.Tensor) -> None:
        row.fill_(float("-inf"))
        row[entry.token_id if len(generated) < entry.count else entry.eos_token_id] = 0.0
    return force


def make_ban_range(entry: BanRangeSpec, ctx: RealizeContext) -> Any:
    def ban(generated: Any, row: torch.Tensor) -> None:
        row[entry.start:entry.stop] = float("-inf")
    return ban


class _Tokenizer:
    eos_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [2 + ord(c) % 20 for c in text]


@pytest.fixture
def policy(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setattr(kinds, "_registered", {})
    register_kind(ProcessorKind("repeat_token", RepeatTokenSpec, f"{__name__}:make_repeat"))
    register_kind(ProcessorKind("ban_range", BanRangeSpec, f"{__name__}:make_ban_range"))
    config = parse_config({"entries": [{"kind": "ban_range", "start": 3, "stop": 5}],
                           "allow_request_kinds": ["repeat_token", "forced_text"]})

    def build(role: DisaggregationMode) -> Any:
        return build_policy(role, config, _Tokenizer, VOCAB)
    return build


def _generate(payload: Any, steps: int) -> list[int]:
    proc = build_request_processor(payload, vocab_size=VOCAB)
    generated: list[int] = []
    for _ in range(steps):
        row = torch.zeros(VOCAB)
        proc(generated, row)
        generated.append(int(row.argmax()))
    return generated


def test_request_and_deployment_plugin_entries_reach_the_engine_and_act(policy: Any) -> None:
    entries = policy(DisaggregationMode.AGGREGATED).entries_for(
        [{"kind": "repeat_token", "token_id": 7, "count": 2, "eos_token_id": EOS}])
    extra: dict[str, Any] = {}
    activate_logits_processors(extra, entries)
    assert extra[WIRE_KEY] == [{"kind": "ban_range", "start": 3, "stop": 5},
                               {"kind": "repeat_token", "token_id": 7, "count": 2, "eos_token_id": EOS}]
    assert _generate(extra[WIRE_KEY], 3) == [7, 7, EOS]
    # the deployment entry alone: ids 3 and 4 can never win
    proc = build_request_processor(extra[WIRE_KEY][:1], vocab_size=VOCAB)
    row = torch.zeros(VOCAB)
    row[3] = row[4] = 10.0
    proc([], row)
    assert int(row.argmax()) not in (3, 4)


def test_prefill_workers_activate_nothing(policy: Any) -> None:
    entries = policy(DisaggregationMode.PREFILL).entries_for(
        [{"kind": "repeat_token", "token_id": 7, "count": 2, "eos_token_id": EOS}])
    assert entries == []


def test_the_worker_checks_plugin_ids_against_the_logits_width(policy: Any) -> None:
    with pytest.raises(SpecError) as info:
        policy(DisaggregationMode.AGGREGATED).entries_for(
            [{"kind": "repeat_token", "token_id": 40, "count": 2, "eos_token_id": 99}])
    assert [str(p) for p in info.value.problems] == ["logits_processors[0].token_id: must be < vocab size 32",
                                                    "logits_processors[0].eos_token_id: must be < vocab size 32"]


def test_a_plugin_kind_outside_the_allow_list_is_refused(policy: Any) -> None:
    with pytest.raises(SpecError, match=r"logits_processors\[0\]\.kind: kind 'ban_range' is not allowed"):
        policy(DisaggregationMode.AGGREGATED).entries_for([{"kind": "ban_range", "start": 0, "stop": 1}])
