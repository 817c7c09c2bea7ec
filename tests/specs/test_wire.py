"""The wire payload: decoding rules, the vocabulary bound, and the msgspec/pydantic agreement."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynlogits.specs import (
    WIRE_KEY,
    BannedTokensSpec,
    ForcedTextSpec,
    ForcedTokenSequenceSpec,
    LogitBiasSpec,
    SpecError,
    decode_wire_payload,
    encode_entries,
    fast,
)
from dynlogits.specs.entries import WIRE_KINDS
from dynlogits.specs.wire import _FAST_TO_MODEL, decode_fast, decode_strict


def test_wire_key_is_dynamo_logits():
    assert WIRE_KEY == "dynamo_logits"


def test_encode_then_decode_is_identity():
    entries = (ForcedTokenSequenceSpec(token_ids=(4, 5), eos_token_id=1), LogitBiasSpec(bias={"3": 2.5}), BannedTokensSpec(token_ids=(9,)))
    payload = encode_entries(entries)
    assert json.loads(json.dumps(payload)) == payload
    assert decode_wire_payload(payload) == entries


def test_forced_text_cannot_be_encoded_unresolved():
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]\.kind: kind 'forced_text' cannot cross the wire"):
        encode_entries([ForcedTextSpec(text="hi")])


def test_vocab_bound_uses_logits_width():
    payload = [{"kind": "forced_sequence", "token_ids": [0, 99], "eos_token_id": 100}, {"kind": "logit_bias", "bias": {"101": 1.0}}]
    decode_wire_payload(payload, vocab_size=102)
    with pytest.raises(SpecError) as info:
        decode_wire_payload(payload, vocab_size=100)
    assert str(info.value) == (
        "dynamo_logits[0].eos_token_id: must be < vocab size 100; "
        'dynamo_logits[1].bias["101"]: must be < vocab size 100'
    )


def test_msgspec_mirror_has_the_same_fields_as_the_models():
    for struct, model in _FAST_TO_MODEL.items():
        # the engine never sees text: the fast path has no text fields
        assert set(struct.__struct_fields__) == set(model.model_fields) - {"kind"} - set(model.text_fields), model.__name__
        assert struct.__struct_config__.tag == model.model_fields["kind"].default
    assert {s.__struct_config__.tag for s in fast.FAST_MODELS} == WIRE_KINDS


# --- property test: the fast path and the canonical path agree on everything ---

_ids = st.lists(st.one_of(st.integers(-3, 2**31 + 3), st.booleans(), st.floats(allow_nan=True), st.text(max_size=2)), max_size=4)
_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**65), 2**65), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4))
_json = st.recursive(_json_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=8)
_field_values = st.one_of(_ids, _json, st.integers(-2, 10), st.dictionaries(st.sampled_from(["0", "1", "42", "-1", "x", "007", "00", "\u0663", "+4", "12345678901", "4294967295"]), st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.booleans(), st.text(max_size=1)), max_size=3))
_field_names = st.sampled_from(
    ["token_ids", "eos_token_id", "bias", "min_tokens", "stop_token_ids", "start_token_ids", "end_token_ids", "budget", "factory", "kwargs", "text", "extra"]
)
_entryish = st.one_of(
    st.fixed_dictionaries({"kind": st.sampled_from(sorted(WIRE_KINDS) + ["forced_text", "nope"])}, optional={}).flatmap(
        lambda base: st.dictionaries(_field_names, _field_values, max_size=4).map(lambda d: {**base, **d})
    ),
    st.builds(lambda f: {"kind": "python", "factory": f}, st.sampled_from(["a.b:C", "a:b.C", "a b:C", ":C", "a:"])),
    _json,
)
_payloads = st.one_of(st.lists(_entryish, max_size=3), _json)


def _canonical_accepts(payload) -> bool:
    try:
        decode_strict(payload)
    except SpecError:
        return False
    return True


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_payloads)
def test_fast_and_canonical_paths_accept_and_reject_the_same_payloads(payload):
    fast_result = decode_fast(payload)
    assert (fast_result is not None) == _canonical_accepts(payload), payload
    if fast_result is not None:
        assert fast_result == decode_strict(payload)


@settings(max_examples=300, deadline=None)
@given(_payloads)
def test_decoding_garbage_raises_only_spec_error(payload):
    try:
        decode_wire_payload(payload, vocab_size=1000)
    except SpecError as err:
        assert err.problems and all(p.rule for p in err.problems)


def _golden_entries() -> list[dict]:
    from pathlib import Path

    import dynlogits.specs as specs_pkg

    folder = Path(specs_pkg.__file__).parent / "golden" / "valid"
    return [entry for path in sorted(folder.glob("*.json")) for entry in json.loads(path.read_text())["payload"]]


def test_fast_path_models_are_what_model_construct_makes():
    entries = _golden_entries()
    entries.append({"kind": "python", "factory": "pkg.mod:make", "kwargs": {"a": [1]}})
    assert {e["kind"] for e in entries} == WIRE_KINDS
    for item in entries:
        struct = fast.convert_entry(item)
        made = decode_fast([item])[0]
        model = _FAST_TO_MODEL[type(struct)]
        want = model.model_construct(**{f: getattr(struct, f) for f in struct.__struct_fields__})
        assert type(made) is model
        assert list(made.__dict__.items()) == list(want.__dict__.items()), item  # same values, same order
        assert made.__pydantic_fields_set__ == want.__pydantic_fields_set__
        assert (made.__pydantic_extra__, made.__pydantic_private__) == (want.__pydantic_extra__, want.__pydantic_private__)
        assert repr(made) == repr(want) and made == decode_strict([item])[0]
        assert made.model_dump(mode="json", exclude_unset=True) == want.model_dump(mode="json", exclude_unset=True)


def test_a_model_with_more_than_plain_fields_is_made_by_model_construct_itself():
    import msgspec
    from pydantic import BaseModel, Field

    from dynlogits.specs.wire import _constructor

    class Struct(msgspec.Struct):
        ids: tuple[int, ...]

    class Aliased(BaseModel):
        ids: tuple[int, ...] = Field(alias="token_ids")
        note: list[int] = []  # a mutable default: never shared through a template

    made = _constructor(Struct, Aliased)(Struct(ids=(1, 2)))
    assert made.ids == (1, 2) and made.note == [] and made.__pydantic_fields_set__ == {"ids"}
    assert made.note is not _constructor(Struct, Aliased)(Struct(ids=(3,))).note
