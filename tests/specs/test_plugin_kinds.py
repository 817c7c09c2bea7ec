"""Third-party kinds in the spec layer: declaration rules, entry-point discovery, and validation,
encoding, decoding, limits, vocabulary checks and schemas that treat them like built-in kinds."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Annotated, Any, Literal

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
