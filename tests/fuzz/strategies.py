"""Hypothesis strategies for hostile input: odd JSON values, entry-shaped garbage, request bodies as bytes.

Every layer that reads client data is fuzzed from these (``test_fuzz_decoders.py`` in-process,
``test_fuzz_http.py`` over HTTP). Values are mostly *almost* right, so the checks past the first
one are reached too: a valid kind with one odd field, a valid body with one odd value.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from dynlogits.specs.entries import ENTRY_KINDS

MODEL = "dynlogits-tiny"

# --- odd values -----------------------------------------------------------------------------

#: Numbers at and past every bound a layer might have (int32, int64, float64, Python's digit limit).
huge_ints = st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, -(10**30)])
odd_floats = st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 5e-324, -0.0, 1e-400])
odd_strings = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "\x00", "\ud800", "a\udfffb", "\u202e", "🙂" * 3, "python", "PYTHON", "Python",
                     " forced_text", "forced_text ", "dynamo_logits", "DYNAMO_LOGITS", "os:system", "__import__"]),
    st.integers(0, 200_000).map(lambda n: "x" * n),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), huge_ints, odd_floats,
                    st.floats(allow_nan=False, allow_infinity=False), odd_strings)


def nested(depth: int) -> Any:
    """``[[[...]]]`` ``depth`` levels deep (built without recursion)."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


deep = st.sampled_from([8, 63, 64, 65, 200, 500]).map(nested)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(odd_strings, inner, max_size=4)), max_leaves=10)
odd_values = st.one_of(scalars, json_values, deep)

# --- logits-processor entries ----------------------------------------------------------------

token_ids = st.one_of(st.lists(st.integers(0, 1023), min_size=1, max_size=6),
                      st.lists(st.one_of(st.integers(-2, 2**31 + 2), st.booleans(), odd_floats, odd_strings),
                               max_size=4),
                      st.integers(0, 20_000).map(lambda n: list(range(n))))
_FIELD_VALUES = {
    "token_ids": token_ids, "start_token_ids": token_ids, "end_token_ids": token_ids, "stop_token_ids": token_ids,
    "eos_token_id": st.one_of(st.integers(0, 1023), huge_ints, odd_values),
    "bias": st.one_of(st.dictionaries(st.sampled_from(["1", "5", "0", "-1", "007", "x", "1e3", "2147483648"]),
                                      st.one_of(st.floats(-200, 200), odd_floats, odd_values), max_size=3),
                      odd_values),
    "min_tokens": st.one_of(st.integers(-1, 5), huge_ints, odd_values),
    "budget": st.one_of(st.integers(-1, 5), huge_ints, odd_values),
    "text": st.one_of(st.text(min_size=1, max_size=8), odd_strings, odd_values),
    "factory": st.one_of(st.sampled_from(["os:system", "custom_processor:TokenCycle", "a.b:C", "builtins:eval"]),
                         odd_values),
    "kwargs": st.one_of(st.dictionaries(st.text(max_size=4), scalars, max_size=3), odd_values),
}
kinds = st.one_of(st.sampled_from(sorted(ENTRY_KINDS)),
                  st.sampled_from(["PYTHON", "Python", "python ", "Forced_Text", "FORCED_SEQUENCE", "nope", ""]),
                  odd_values)


@st.composite
def entries(draw: st.DrawFn) -> Any:
    """One entry-shaped value: a kind and some fields (right or wrong), or anything at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(odd_values)
    entry: dict[str, Any] = {} if draw(st.integers(0, 19)) == 0 else {"kind": draw(kinds)}
    for name in draw(st.lists(st.sampled_from([*_FIELD_VALUES, "extra"]), max_size=4, unique=True)):
        entry[name] = draw(_FIELD_VALUES.get(name, odd_values))
    return entry


entry_lists = st.one_of(st.lists(entries(), max_size=4), st.lists(entries(), min_size=15, max_size=20), odd_values)

# --- request bodies --------------------------------------------------------------------------

_MESSAGES = [{"role": "user", "content": "Fuzz me."}]
#: Valid values for the fields a body may carry; the generator sometimes swaps one for an odd value.
_BODY_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.one_of(st.just(MODEL), odd_strings),
    # Always bounded when valid: an accepted request must end in a few tokens.
    "max_tokens": st.one_of(st.integers(1, 3), st.integers(-2, 0), huge_ints, odd_floats, odd_strings),
    "n": st.one_of(st.integers(1, 2), st.integers(-1, 0), st.integers(17, 20), huge_ints),
    "temperature": st.one_of(st.floats(0, 2), odd_floats, odd_strings),
    "top_p": st.one_of(st.floats(0.01, 1), odd_floats),
    "top_k": st.one_of(st.integers(-1, 50), huge_ints),
    "seed": st.one_of(st.integers(0, 2**32), huge_ints),
    "stop": st.one_of(st.lists(st.text(min_size=1, max_size=3), max_size=2), odd_strings, odd_values),
    "presence_penalty": st.one_of(st.floats(-2, 2), odd_floats),
    "stream": st.one_of(st.booleans(), odd_values),
    "stream_options": st.one_of(st.just({"include_usage": True}), odd_values),
    "ignore_eos": st.one_of(st.booleans(), odd_values),
    "logits_processors": entry_lists,
    "vllm_xargs": st.one_of(st.dictionaries(odd_strings, scalars, max_size=3),
                            st.just({"dynamo_logits": [{"kind": "python", "factory": "os:system"}]}), odd_values),
    "extra_args": st.one_of(st.dictionaries(odd_strings, scalars, max_size=3), odd_values),
    "nvext": st.one_of(st.just({"logits_processors": [{"kind": "python", "factory": "os:system"}]}), odd_values),
    "custom_params": st.one_of(st.just({"dynamo_logits": [{"kind": "banned_tokens", "token_ids": [1]}]}), odd_values),
    "custom_logit_processor": odd_strings,
}
_CHAT_PROMPT = st.one_of(
    st.just(_MESSAGES),
    st.lists(st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), odd_values)},
                                   optional={"content": st.one_of(st.text(max_size=20), odd_strings, odd_values,
                                                                  st.just([{"type": "text", "text": "hi"}]))}),
             max_size=3),
    odd_values,
)
_COMPLETION_PROMPT = st.one_of(st.text(max_size=20), odd_strings, st.lists(st.integers(-2, 1100), max_size=5),
                               st.lists(huge_ints, min_size=1, max_size=2), odd_values)


@st.composite
def body_objects(draw: st.DrawFn, endpoint: str) -> dict[str, Any]:
    """A request body object for ``endpoint`` ("chat" or "completion"): a valid base plus some
    fields drawn from :data:`_BODY_FIELDS`, and now and then a field set to any odd value."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": draw(st.integers(1, 3))}
    if endpoint == "chat":
        body["messages"] = draw(_CHAT_PROMPT) if draw(st.booleans()) else _MESSAGES
    else:
        body["prompt"] = draw(_COMPLETION_PROMPT) if draw(st.booleans()) else "Fuzz:"
    for name in draw(st.lists(st.sampled_from(sorted(_BODY_FIELDS)), max_size=5, unique=True)):
        body[name] = draw(_BODY_FIELDS[name])
    if draw(st.integers(0, 4)) == 0:
        body[draw(odd_strings)] = draw(odd_values)
    return body


def _dumps(value: Any) -> bytes:
    # ensure_ascii keeps lone surrogates as \\u escapes (valid JSON text, invalid Unicode);
    # allow_nan writes NaN/Infinity literals, which JSON does not have.
    return json.dumps(value, ensure_ascii=True, allow_nan=True).encode()


_RAW_BODIES = st.sampled_from([
    b"", b"{", b"[]", b"null", b"1", b'"text"', b"{}", b"\xff\xfe{}", b'{"model": "\xc3\x28"}',
    b'{"model": "dynlogits-tiny", "model": "x", "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "dynlogits-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,'
    b' "logits_processors": [{"kind": "banned_tokens", "kind": "python", "token_ids": [1]}]}',
    b'{"model": "dynlogits-tiny", "messages": [], "temperature": NaN}',
    b'{"model": "dynlogits-tiny", "max_tokens": 1e999, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "dynlogits-tiny", "max_tokens": ' + b"9" * 5000 + b"}",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a": ' + b'{"b": ' * 5000 + b"1" + b"}" * 5001,
    "{\"model\": \"dynlogits-tiny\"}".encode("utf-16"),
])


@st.composite
def raw_bodies(draw: st.DrawFn, endpoint: str) -> bytes:
    """Bytes on the wire: a body object serialized (sometimes truncated or with a byte flipped),
    or one of the structurally odd documents above."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(_RAW_BODIES)
    if choice == 1:
        return draw(st.binary(max_size=64))
    raw = _dumps(draw(body_objects(endpoint)))
    if choice == 2 and raw:
        cut = draw(st.integers(0, len(raw) - 1))
        return raw[:cut]
    if choice == 3 and raw:
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + bytes([draw(st.integers(0x80, 0xFF))]) + raw[at + 1:]
    return raw


@st.composite
def worker_bodies(draw: st.DrawFn) -> bytes:
    """Bodies for a worker's internal ``POST /generate`` (a caller that bypasses the frontend)."""
    body: dict[str, Any] = {"request_id": draw(st.one_of(st.just("fuzz"), odd_strings)),
                            "sampling": {"max_tokens": draw(st.integers(1, 3))}}
    prompt = draw(st.sampled_from(["prompt", "messages", "prompt_token_ids", "none", "two"]))
    if prompt in ("prompt", "two"):
        body["prompt"] = draw(st.one_of(st.text(max_size=20), odd_strings, odd_values))
    if prompt in ("messages", "two"):
        body["messages"] = draw(_CHAT_PROMPT)
    if prompt == "prompt_token_ids":
        body["prompt_token_ids"] = draw(_COMPLETION_PROMPT)
    fields = {"logits_processors": entry_lists, "extra_args": _BODY_FIELDS["vllm_xargs"],
              "sampling": st.dictionaries(st.sampled_from(["max_tokens", "temperature", "top_k", "seed", "n", "stop",
                                                           "ignore_eos", "top_p", "extra"]), scalars, max_size=4)
              .map(lambda d: {**d, "max_tokens": 2}), "custom_params": _BODY_FIELDS["custom_params"]}
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=3, unique=True)):
        body[name] = draw(fields[name])
    if draw(st.integers(0, 9)) == 0:
        return draw(_RAW_BODIES)
    return _dumps(body)
