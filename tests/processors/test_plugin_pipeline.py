"""A plug-in kind through the whole worker path, in one process (no engine): operator config and
request -> policy (validation, role gate, vocabulary) -> activation (the wire payload) -> realization
through the kind's import-string factory -> its effect on logits rows."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Literal

import pytest
import torch
from pydantic import BaseModel, ConfigDict, StrictInt

from dynlogits.policy.config import parse_config
from dynlogits.policy.request import build_policy
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.processors import RealizeContext
from dynlogits.sdk import activate_logits_processors
from dynlogits.sdk.realization import RequestFacts, build_request_processor
from dynlogits.specs import WIRE_KEY, ProcessorKind, SpecError, kinds, register_kind
from dynlogits.specs.entries import Text, TokenIds

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


class _Step(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    ids: TokenIds


class CloseWithSpec(BaseModel):
    """A plug-in with text the worker resolves (``closing_text`` -> ``closing_token_ids``, ``avoid_texts``
    -> ``avoid``) and ids nested under names of its own."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["acme.close_with"] = "acme.close_with"
    closing_text: Text | None = None
    closing_token_ids: TokenIds | None = None
    avoid_texts: tuple[Text, ...] = ()
    avoid: tuple[TokenIds, ...] = ()
    steps: tuple[_Step, ...] = ()

    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({"closing_text": "closing_token_ids",
                                                                  "avoid_texts": "avoid"})


def make_close_with(entry: CloseWithSpec, ctx: RealizeContext) -> Any:
    def close(generated: Any, row: torch.Tensor) -> None:
        closing = entry.closing_token_ids or ()
        row.fill_(float("-inf"))
        row[closing[len(generated)] if len(generated) < len(closing) else ctx.stop_token_ids[0]] = 0.0
    return close


@pytest.fixture
def text_policy(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setattr(kinds, "_registered", {})
    register_kind(ProcessorKind("acme.close_with", CloseWithSpec, f"{__name__}:make_close_with"))
    config = parse_config({"entries": [{"kind": "acme.close_with", "closing_text": "ok"}],
                           "allow_request_kinds": ["acme.close_with"]})
    return build_policy(DisaggregationMode.AGGREGATED, config, _Tokenizer, VOCAB)


def test_the_worker_resolves_a_plugins_text_before_the_wire_and_the_engine_acts_on_the_ids(text_policy: Any) -> None:
    tok = _Tokenizer()
    entries = text_policy.entries_for([{"kind": "acme.close_with", "closing_text": "hi!", "avoid_texts": ["no", "x"]}])
    extra: dict[str, Any] = {}
    activate_logits_processors(extra, entries)
    assert extra[WIRE_KEY] == [
        {"kind": "acme.close_with", "closing_token_ids": tok.encode("ok"), "avoid": [], "steps": []},
        {"kind": "acme.close_with", "closing_token_ids": tok.encode("hi!"), "avoid": [tok.encode("no"), tok.encode("x")],
         "steps": []}]
    proc = build_request_processor(extra[WIRE_KEY][1:], vocab_size=VOCAB,
                                   facts=RequestFacts(stop_token_ids=(EOS,)))
    generated: list[int] = []
    for _ in range(4):
        row = torch.zeros(VOCAB)
        proc(generated, row)
        generated.append(int(row.argmax()))
    assert generated == [*tok.encode("hi!"), EOS]


def test_the_worker_names_a_plugins_nested_id_beyond_the_width(text_policy: Any) -> None:
    with pytest.raises(SpecError) as info:
        text_policy.entries_for([{"kind": "acme.close_with", "steps": [{"ids": [3]}, {"ids": [4, 40]}]}])
    assert [str(p) for p in info.value.problems] == ["logits_processors[0].steps[1].ids[1]: must be < vocab size 32"]
