"""Third-party kinds in the spec layer: declaration rules, entry-point discovery, and validation,
encoding, decoding, limits, vocabulary checks and schemas that treat them like built-in kinds."""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib.metadata import EntryPoint
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from dynlogits.specs import (
    BannedTokensSpec,
    KindError,
    LogitsProcessorSpec,
    ProcessorKind,
    SpecError,
    SpecLimits,
    check_vocab,
    decode_wire_payload,
    encode_entries,
    kinds,
    parse_entries,
    parse_spec,
    register_kind,
)
from dynlogits.specs.entries import Text, TokenId, TokenIds, TokenKey, unresolved_text
from dynlogits.specs.schema import payload_schema, spec_schema
from dynlogits.specs.wire import decode_fast


class BanRangeSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["ban_range"] = "ban_range"
    start: Annotated[StrictInt, Field(ge=0)]
    stop: Annotated[StrictInt, Field(ge=0)]


class RepeatTokenSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["repeat_token"] = "repeat_token"
    token_id: StrictInt
    token_ids: tuple[StrictInt, ...] = ()
    text: int = 0  # a field named like a limited one, of another shape


BAN_RANGE = ProcessorKind("ban_range", BanRangeSpec, "acme.processors:make_ban_range")
REPEAT = ProcessorKind("repeat_token", RepeatTokenSpec, "acme.processors:make_repeat")


@pytest.fixture
def ban_range() -> ProcessorKind:
    register_kind(BAN_RANGE)  # undone by conftest's only_builtin_kinds
    return BAN_RANGE


def _problems(fn: Any, *args: Any, **kwargs: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        fn(*args, **kwargs)
    return [str(p) for p in info.value.problems]


# --- declaring a kind -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["forced_sequence", "forced_text", "python", "banned_tokens"])
def test_a_plugin_cannot_take_a_builtin_name(name: str) -> None:
    with pytest.raises(KindError, match=f"kind '{name}' is built in"):
        ProcessorKind(name, BanRangeSpec, "acme.processors:make")


def test_the_model_must_carry_the_kind_as_a_literal_and_forbid_unknown_fields() -> None:
    with pytest.raises(KindError, match=r"must declare kind: Literal\['other'\]"):
        ProcessorKind("other", BanRangeSpec, "acme.processors:make")

    class Loose(BaseModel):
        kind: Literal["loose"] = "loose"

    with pytest.raises(KindError, match="must forbid unknown fields"):
        ProcessorKind("loose", Loose, "acme.processors:make")


@pytest.mark.parametrize("factory", ["not an import", 42])
def test_the_factory_is_callable_or_an_import_string(factory: Any) -> None:
    with pytest.raises(KindError, match="factory must be callable or an import string"):
        ProcessorKind("ban_range", BanRangeSpec, factory)


def test_kind_names_are_lower_case_words() -> None:
    with pytest.raises(KindError, match="kind must match"):
        ProcessorKind("Ban Range", BanRangeSpec, "acme.processors:make")


# --- discovery through entry points -----------------------------------------------------------


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Replace the installed entry points with the given ones for one test."""

    def publish(*eps: tuple[str, str]) -> None:
        found = [EntryPoint(name, value, kinds.ENTRY_POINT_GROUP) for name, value in eps]
        monkeypatch.setattr(kinds, "entry_points", lambda group: found if group == kinds.ENTRY_POINT_GROUP else [])
        kinds.installed_kinds.cache_clear()

    yield publish
    kinds.installed_kinds.cache_clear()


def test_entry_points_publish_kinds(published: Any) -> None:
    published(("ban_range", f"{__name__}:BAN_RANGE"), ("repeat_token", f"{__name__}:REPEAT"))
    assert dict(kinds.installed_kinds()) == {"ban_range": BAN_RANGE, "repeat_token": REPEAT}
    assert parse_entries([{"kind": "repeat_token", "token_id": 3}])[0] == RepeatTokenSpec(token_id=3)


NOT_A_KIND = {"kind": "ban_range"}


@pytest.mark.parametrize(("eps", "rule"), [
    ([("ban_range", f"{__name__}:NOT_A_KIND")], "must name a dynlogits.specs.kinds.ProcessorKind, got dict"),
    ([("banrange", f"{__name__}:BAN_RANGE")], "must be named after its kind 'ban_range'"),
    ([("ban_range", "no_such_module_xyz:BAN_RANGE")], "cannot be loaded: ModuleNotFoundError"),
    ([("ban_range", f"{__name__}:BAN_RANGE"), ("ban_range", f"{__name__}:COPY")], "is already published by entry point"),
])
def test_a_broken_entry_point_is_named_with_the_rule_it_broke(published: Any, eps: list[tuple[str, str]],
                                                              rule: str) -> None:
    published(*eps)
    with pytest.raises(KindError) as info:
        kinds.installed_kinds()
    problem = info.value.problems[0]
    assert problem.path.startswith(f"entry point {eps[-1][0]} = '{eps[-1][1]}' (group dynlogits.processors")
    assert rule in problem.rule


COPY = ProcessorKind("ban_range", BanRangeSpec, "acme.processors:other")


def test_a_kind_that_takes_a_builtin_name_is_reported_with_its_entry_point(published: Any, tmp_path: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shadow_kind_mod.py").write_text(
        "from typing import Literal\nfrom pydantic import BaseModel, ConfigDict\n"
        "from dynlogits.specs.kinds import ProcessorKind\n"
        "class M(BaseModel):\n    model_config = ConfigDict(extra='forbid')\n    kind: Literal['python'] = 'python'\n"
        "KIND = ProcessorKind('python', M, 'shadow_kind_mod:make')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    published(("python", "shadow_kind_mod:KIND"))
    with pytest.raises(KindError) as info:
        kinds.installed_kinds()
    assert str(info.value) == ("entry point python = 'shadow_kind_mod:KIND' (group dynlogits.processors): "
                               "kind 'python' is built in and cannot be re-registered by a plug-in")


# --- validation: the same paths and rules as for built-in kinds --------------------------------


def test_request_entries_accept_an_allowed_plugin_kind(ban_range: ProcessorKind) -> None:
    entries = parse_entries([{"kind": "banned_tokens", "token_ids": [1]}, {"kind": "ban_range", "start": 3, "stop": 5}],
                            allowed_kinds=["banned_tokens", "ban_range"])
    assert entries == (BannedTokensSpec(token_ids=(1,)), BanRangeSpec(start=3, stop=5))
    assert _problems(parse_entries, [{"kind": "ban_range", "start": 3, "stop": 5}], allowed_kinds=["banned_tokens"]) == [
        "logits_processors[0].kind: kind 'ban_range' is not allowed by this deployment (allowed: ['banned_tokens'])"]


def test_a_plugin_entrys_bad_fields_are_named_like_builtin_ones(ban_range: ProcessorKind) -> None:
    bad = [{"kind": "banned_tokens", "token_ids": [-1]}, {"kind": "ban_range", "start": "3", "stop": -1, "step": 2}, {"kind": "ban_range"}]
    assert _problems(parse_entries, bad) == [
        "logits_processors[0].token_ids[0]: must be >= 0",
        "logits_processors[1].start: must be an integer",
        "logits_processors[1].stop: must be >= 0",
        "logits_processors[1].step: unknown field",
        "logits_processors[2].start: is required",
        "logits_processors[2].stop: is required",
    ]


def test_unknown_kinds_list_the_plugin_kinds_too(ban_range: ProcessorKind) -> None:
    [problem] = _problems(parse_entries, [{"kind": "warp"}])
    assert problem.startswith("logits_processors[0]: unknown kind 'warp' (expected one of 'forced_sequence',")
    assert problem.endswith("'python', 'ban_range')")


def test_specs_hold_plugin_entries(ban_range: ProcessorKind) -> None:
    spec = parse_spec({"entries": [{"kind": "ban_range", "start": 1, "stop": 2}], "generation_only": False})
    assert isinstance(spec, LogitsProcessorSpec) and spec.entries == (BanRangeSpec(start=1, stop=2),)
    assert LogitsProcessorSpec(entries=(BanRangeSpec(start=1, stop=2),)).entries[0].kind == "ban_range"
    assert _problems(parse_spec, {"entries": [{"kind": "ban_range", "start": 1, "stop": 2.5}]}) == [
        "entries[0].stop: must be an integer"]
    assert _problems(parse_spec, {"entries": []}) == ["entries: must have at least 1 item"]


def test_without_the_plugin_its_kind_is_unknown() -> None:
    [problem] = _problems(parse_spec, {"entries": [{"kind": "ban_range", "start": 1, "stop": 2}]})
    assert problem.startswith("entries[0]: unknown kind 'ban_range'")


# --- the wire ---------------------------------------------------------------------------------


def test_plugin_entries_cross_the_wire_and_come_back(ban_range: ProcessorKind) -> None:
    entries = (BannedTokensSpec(token_ids=(7,)), BanRangeSpec(start=3, stop=9))
    payload = encode_entries(entries)
    assert payload[1] == {"kind": "ban_range", "start": 3, "stop": 9}
    assert decode_wire_payload(payload) == entries
    assert decode_fast(payload[:1]) == entries[:1]  # built-in-only payloads keep the msgspec path
    assert _problems(decode_wire_payload, [{"kind": "ban_range", "start": 3}]) == ["dynamo_logits[0].stop: is required"]


def test_an_entry_of_no_kind_in_force_cannot_be_encoded() -> None:
    assert _problems(encode_entries, [BanRangeSpec(start=1, stop=2)]) == [
        "dynamo_logits[0].kind: kind 'ban_range' cannot cross the wire: it is neither built in nor a plug-in kind in force"]


def test_limits_and_vocabulary_apply_to_plugin_fields_by_name() -> None:
    register_kind(REPEAT)
    entries = parse_entries([{"kind": "repeat_token", "token_id": 40, "token_ids": [1, 50, 2], "text": 12345}],
                            limits=SpecLimits(max_text_chars=2))  # an integer ``text`` is not bounded as text
    assert _problems(check_vocab, entries, 32, root="r") == ["r[0].token_ids[1]: must be < vocab size 32",
                                                             "r[0].token_id: must be < vocab size 32"]
    assert _problems(parse_entries, [{"kind": "repeat_token", "token_id": 1, "token_ids": [1, 2, 3]}],
                     limits=SpecLimits(max_token_ids=2)) == [
        "logits_processors[0].token_ids: must have at most 2 items (limit max_token_ids)"]


def test_vocabulary_check_skips_fields_that_are_not_ids() -> None:
    class Odd(BaseModel):
        token_id: str = "x"
        token_ids: str = "abc"
        eos_token_id: bool = True
        bias: dict[str, float] = {"x": 1.0, "40": 1.0}

    assert _problems(check_vocab, [Odd()], 32, root="r") == ['r[0].bias["40"]: must be < vocab size 32']


# --- schemas ----------------------------------------------------------------------------------


def test_schemas_include_the_given_plugin_kinds() -> None:
    payload = payload_schema({"ban_range": BAN_RANGE})
    assert "BanRangeSpec" in payload["$defs"]
    assert payload["items"]["discriminator"]["mapping"]["ban_range"] == "#/$defs/BanRangeSpec"
    spec = spec_schema({"ban_range": BAN_RANGE})
    assert spec["title"] == "LogitsProcessorSpec" and "BanRangeSpec" in spec["$defs"]
    assert spec["properties"]["entries"]["minItems"] == 1
    assert "BanRangeSpec" not in payload_schema()["$defs"]  # default: installed kinds only (none here)


# --- a plug-in's own ids, however nested, and its own text fields --------------------------------


class ChoiceStep(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    ids: TokenIds
    bonus: dict[TokenKey, float] = {}


class RouteSpec(BaseModel):
    """Ids nested two models deep under names the built-ins do not use, and text the worker resolves."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["acme.route"] = "acme.route"
    steps: tuple[tuple[ChoiceStep, ...], ...] = ()
    fallback: TokenId | None = None
    closing_text: Text | None = None
    closing_token_ids: TokenIds | None = None
    avoid_texts: tuple[Text, ...] = ()
    avoid: tuple[TokenIds, ...] = ()

    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({"closing_text": "closing_token_ids",
                                                                  "avoid_texts": "avoid"})


ROUTE = ProcessorKind("acme.route", RouteSpec, "acme.processors:make_route")


def test_a_plugins_ids_are_width_checked_however_nested() -> None:
    register_kind(ROUTE)
    [entry] = parse_entries([{"kind": "acme.route", "fallback": 40, "steps": [
        [{"ids": [1, 2]}], [{"ids": [3]}, {"ids": [33, 4], "bonus": {"50": 1.0, "5": 2.0}}]]}])
    assert _problems(check_vocab, [entry], 32, root="r") == [
        "r[0].steps[1][1].ids[0]: must be < vocab size 32",
        'r[0].steps[1][1].bonus["50"]: must be < vocab size 32',
        "r[0].fallback: must be < vocab size 32"]
    payload = encode_entries([entry])
    assert _problems(decode_wire_payload, payload, vocab_size=32) == [
        "dynamo_logits[0].steps[1][1].ids[0]: must be < vocab size 32",
        'dynamo_logits[0].steps[1][1].bonus["50"]: must be < vocab size 32',
        "dynamo_logits[0].fallback: must be < vocab size 32"]
    assert decode_wire_payload(payload, vocab_size=64) == (entry,)


def test_a_plugin_entry_still_holding_text_never_crosses_the_wire() -> None:
    register_kind(ROUTE)
    [entry] = parse_entries([{"kind": "acme.route", "closing_text": "Bye.", "avoid_texts": ["no"]}])
    assert unresolved_text(entry) == ["closing_text", "avoid_texts"]
    assert _problems(encode_entries, [entry]) == [
        "dynamo_logits[0].closing_text: text is resolved to token ids by the worker's tokenizer and never crosses the wire"]
    assert _problems(decode_wire_payload, [{"kind": "acme.route", "closing_text": "Bye.", "avoid_texts": ["no"]}]) == [
        "dynamo_logits[0].closing_text: text is resolved to token ids by the worker's tokenizer and never crosses the wire",
        "dynamo_logits[0].avoid_texts: text is resolved to token ids by the worker's tokenizer and never crosses the wire"]
    resolved = RouteSpec(closing_token_ids=(7, 8), avoid=((9,),))
    assert unresolved_text(resolved) == [] and encode_entries([resolved]) == [
        {"kind": "acme.route", "steps": [], "fallback": None, "closing_token_ids": [7, 8], "avoid": [[9]]}]


def test_a_plugins_declared_text_fields_are_bounded_as_texts() -> None:
    register_kind(ROUTE)
    assert _problems(parse_entries, [{"kind": "acme.route", "closing_text": "x" * 9, "avoid_texts": ["ab", "y" * 9, "c"]}],
                     limits=SpecLimits(max_text_chars=8, max_phrases=2)) == [
        "logits_processors[0].closing_text: must have at most 8 characters (limit max_text_chars)",
        "logits_processors[0].avoid_texts: must have at most 2 items (limit max_phrases)",
        "logits_processors[0].avoid_texts[1]: must have at most 8 characters (limit max_text_chars)"]


class _LooseText(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["acme.loose"] = "acme.loose"
    words: tuple[Text, ...] = ()
    word_ids: TokenIds | None = None
    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({"words": "word_ids"})


class _UnknownTarget(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["acme.unknown"] = "acme.unknown"
    words: Text | None = None
    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({"words": "word_ids"})


@pytest.mark.parametrize(("model", "rule"), [
    (_LooseText, "text field 'words' and id field 'word_ids' must both default to None (one text) or both to ()"),
    (_UnknownTarget, "text_fields maps 'words' -> 'word_ids': each must name a field of the model"),
])
def test_a_plugins_text_fields_must_name_its_fields_optional_alike(model: type[BaseModel], rule: str) -> None:
    kind = model.model_fields["kind"].default
    with pytest.raises(KindError, match=re.escape(rule)):
        ProcessorKind(kind, model, "acme.processors:make")
