"""OpenAI's ``logit_bias`` and vLLM's ``allowed_token_ids`` / ``bad_words`` as dynlogits kinds
(``dynlogits.serve.openai_controls``): mapped exactly, refused by name where the deployment does not allow
the kind or the kind cannot express the request, never accepted and ignored. ``bad_words`` is checked
against vLLM's own ``SamplingParams.update_from_tokenizer`` with the embedded model's tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.policy.config import parse_config
from dynlogits.serve.openai_controls import rename_control_paths, with_controls
from dynlogits.specs import SpecError, parse_entries

ALL = parse_config({"allow_request_kinds": ["logit_bias", "allowed_tokens", "banned_tokens", "forced_text"]})


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The embedded model's tokenizer as vLLM's engine holds it (the worker's ``engine.tokenizer``)."""
    from vllm.tokenizers import get_tokenizer

    from dynlogits.model_builder import default_model_dir

    return get_tokenizer(str(default_model_dir()))


def _encode(tokenizer: Any) -> Any:
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def _vllm_bad_words(tokenizer: Any, words: list[str]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(bad_words=words)
    params.update_from_tokenizer(tokenizer)
    return params.bad_words_token_ids or []


def test_logit_bias_and_allowed_token_ids_map_onto_their_kinds_after_the_clients_entries() -> None:
    own = [{"kind": "forced_text", "text": "hi"}]
    controls = with_controls(own, {"logit_bias": {"42": 100, "7": -2.5}, "allowed_token_ids": [42, 43],
                                   "bad_words": None}, ALL, encode=None)
    assert controls.entries == [own[0], {"kind": "logit_bias", "bias": {"42": 100, "7": -2.5}},
                                {"kind": "allowed_tokens", "token_ids": [42, 43]}]
    assert controls.origins == [None, "logit_bias", "allowed_token_ids"]
    entries = parse_entries(controls.entries, allowed_kinds=sorted(ALL.allow_request_kinds))
    assert entries[2].eos_token_id is None  # as vLLM: only the listed ids, EOS too only when listed


def test_neutral_values_add_nothing() -> None:
    controls = with_controls(None, {"logit_bias": {}, "bad_words": [], "allowed_token_ids": None}, ALL, encode=None)
    assert controls.entries == [] and controls.unresolved == []


def test_single_token_bad_words_ban_exactly_what_vllm_bans(tokenizer: Any) -> None:
    words = ["hello", "Hello", "a"]
    vllm = _vllm_bad_words(tokenizer, words)
    assert all(len(seq) == 1 for seq in vllm), vllm  # the premise: single-token words here
    controls = with_controls(None, {"bad_words": words}, ALL, encode=_encode(tokenizer))
    assert controls.entries == [{"kind": "banned_tokens", "token_ids": [seq[0] for seq in vllm]}]
    assert controls.origins == ["bad_words"]


@pytest.mark.parametrize("word", ["the", "world", "xyzzyq"])
def test_a_multi_token_bad_word_is_refused_not_approximated(tokenizer: Any, word: str) -> None:
    assert any(len(seq) > 1 for seq in _vllm_bad_words(tokenizer, [word]))  # vLLM bans a sequence here
    with pytest.raises(SpecError) as err:
        with_controls(None, {"bad_words": ["hello", word]}, ALL, encode=_encode(tokenizer))
    problem = err.value.problems[0]
    assert problem.path == "bad_words[1]" and "tokens" in problem.rule and "one token" in problem.rule, problem


@pytest.mark.parametrize(("field", "value"), [("logit_bias", {"1": 5}), ("allowed_token_ids", [1]),
                                              ("bad_words", ["hello"])])
def test_a_field_whose_kind_is_not_allowed_is_refused_by_its_own_name(field: str, value: Any) -> None:
    narrow = parse_config({"allow_request_kinds": ["forced_text"]})
    with pytest.raises(SpecError) as err:
        with_controls(None, {field: value}, narrow, encode=None)
    problem = err.value.problems[0]
    assert problem.path == field and "does not allow" in problem.rule, problem


@pytest.mark.parametrize(("value", "path"), [("hello", "bad_words"), (["hello", 3], "bad_words[1]"),
                                             (["  "], "bad_words[0]"), (["x" * 4097], "bad_words[0]")])
def test_bad_words_of_the_wrong_shape_are_refused_before_tokenizing(value: Any, path: str) -> None:
    def never(text: str) -> list[int]:
        raise AssertionError("tokenized")

    with pytest.raises(SpecError) as err:
        with_controls(None, {"bad_words": value}, ALL, encode=never)
    assert err.value.problems[0].path == path


@pytest.mark.parametrize(("controls", "path", "rule"), [
    ({"logit_bias": {"abc": 1}}, 'logit_bias["abc"]', "decimal token id"),
    ({"logit_bias": {"5": 101}}, 'logit_bias["5"]', "<= 100"),
    ({"logit_bias": {str(i): 1.0 for i in range(2049)}}, "logit_bias", "max_bias_entries"),
    ({"allowed_token_ids": [1, -2]}, "allowed_token_ids[1]", ">= 0"),
    ({"allowed_token_ids": []}, "allowed_token_ids", "at least 1"),
])
def test_errors_inside_a_mapped_entry_name_the_field_not_logits_processors(controls: dict[str, Any], path: str,
                                                                          rule: str) -> None:
    mapped = with_controls([{"kind": "banned_tokens", "token_ids": [1]}], controls, ALL, encode=None)
    with pytest.raises(SpecError) as err:
        parse_entries(mapped.entries, allowed_kinds=sorted(ALL.allow_request_kinds), limits=ALL.limits)
    problem = rename_control_paths(err.value, mapped.origins).problems[0]
    assert problem.path == path and rule in problem.rule, problem


def test_the_clients_own_entries_keep_their_paths() -> None:
    mapped = with_controls([{"kind": "banned_tokens", "token_ids": [-1]}], {"logit_bias": {"1": 1}}, ALL, encode=None)
    with pytest.raises(SpecError) as err:
        parse_entries(mapped.entries, allowed_kinds=sorted(ALL.allow_request_kinds))
    assert rename_control_paths(err.value, mapped.origins).problems[0].path == "logits_processors[0].token_ids[0]"
