"""OpenAI's ``logit_bias`` and vLLM's ``allowed_token_ids`` / ``bad_words`` as dynlogits kinds
(``dynlogits.serve.openai_controls``): mapped exactly, refused by name where the deployment does not allow
the kind or the kind cannot express the request, never accepted and ignored. ``bad_words``, resolved by
the worker's request policy, is checked against vLLM's own ``SamplingParams.update_from_tokenizer`` with
the embedded model's tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.policy.config import DeploymentConfig, parse_config
from dynlogits.policy.request import build_policy
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.serve.openai_controls import rename_control_paths, with_controls
from dynlogits.specs import SpecError, parse_entries

ALL = parse_config({"allow_request_kinds": ["logit_bias", "allowed_tokens", "banned_tokens", "banned_phrases",
                                            "forced_text"]})
VOCAB = 1000  # the embedded model's logits width


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The embedded model's tokenizer as vLLM's engine holds it (the worker's ``engine.tokenizer``)."""
    from vllm.tokenizers import get_tokenizer

    from dynlogits.model_builder import default_model_dir

    return get_tokenizer(str(default_model_dir()))


def _vllm_bad_words(tokenizer: Any, words: list[str]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(bad_words=words)
    params.update_from_tokenizer(tokenizer)
    return params.bad_words_token_ids or []


def _worker_entries(tokenizer: Any, fields: dict[str, Any], config: DeploymentConfig = ALL) -> list[Any]:
    """The wire entries the worker activates for a request with these control fields (its request
    policy on the embedded model's tokenizer; errors renamed as the worker renames them)."""
    controls = with_controls(None, fields, config)
    policy = build_policy(DisaggregationMode.AGGREGATED, config, lambda: tokenizer, VOCAB, environ={})
    try:
        return policy.entries_for(controls.entries)
    except SpecError as err:
        raise rename_control_paths(err, controls.origins) from None


def test_logit_bias_and_allowed_token_ids_map_onto_their_kinds_after_the_clients_entries() -> None:
    own = [{"kind": "forced_text", "text": "hi"}]
    controls = with_controls(own, {"logit_bias": {"42": 100, "7": -2.5}, "allowed_token_ids": [42, 43],
                                   "bad_words": None}, ALL)
    assert controls.entries == [own[0], {"kind": "logit_bias", "bias": {"42": 100, "7": -2.5}},
                                {"kind": "allowed_tokens", "token_ids": [42, 43]}]
    assert controls.origins == [None, "logit_bias", "allowed_token_ids"]
    entries = parse_entries(controls.entries, allowed_kinds=sorted(ALL.allow_request_kinds))
    assert entries[2].eos_token_id is None  # as vLLM: only the listed ids, EOS too only when listed


def test_neutral_values_add_nothing() -> None:
    controls = with_controls(None, {"logit_bias": {}, "bad_words": [], "allowed_token_ids": None}, ALL)
    assert controls.entries == []


def test_bad_words_map_onto_banned_phrases_texts_as_sent() -> None:
    controls = with_controls(None, {"bad_words": ["hello world", " a"]}, ALL)
    assert controls.entries == [{"kind": "banned_phrases", "texts": ["hello world", " a"]}]
    assert controls.origins == ["bad_words"]


WORDS = [["hello"], ["Hello", "a"], ["hello world"], ["the", "world", "xyzzyq"], ["  Hello world", "hello world", " cat"]]


@pytest.mark.parametrize("words", WORDS, ids=lambda w: "+".join(w))
def test_bad_words_ban_exactly_the_sequences_vllm_bans(tokenizer: Any, words: list[str]) -> None:
    """One token or several, as given or with a leading space: the worker's phrases are vLLM's
    ``bad_words_token_ids`` (without repeats)."""
    vllm = list(dict.fromkeys(tuple(seq) for seq in _vllm_bad_words(tokenizer, words)))
    (entry,) = _worker_entries(tokenizer, {"bad_words": words})
    assert entry.kind == "banned_phrases" and list(entry.phrases) == vllm


def test_bad_words_over_the_phrase_limit_once_resolved_are_refused_naming_the_field(tokenizer: Any) -> None:
    """Each word may become two sequences (bare and with a leading space): the limit holds after that."""
    narrow = parse_config({"allow_request_kinds": ["banned_phrases"], "limits": {"max_phrases": 2}})
    assert len(_vllm_bad_words(tokenizer, ["hello world", "Hello"])) == 4  # the premise
    with pytest.raises(SpecError) as err:
        _worker_entries(tokenizer, {"bad_words": ["hello world", "Hello"]}, narrow)
    problem = err.value.problems[0]
    assert problem.path == "bad_words" and problem.rule == ("resolves to 4 token sequences with this worker's tokenizer; "
                                                            "must be at most 2 (limit max_phrases)"), problem


def test_a_bad_word_too_long_in_tokens_is_refused_by_its_index_without_echoing_it(tokenizer: Any) -> None:
    word = "xyzzyq " * 500
    with pytest.raises(SpecError) as err:
        _worker_entries(tokenizer, {"bad_words": ["hello", word]})
    (problem,) = err.value.problems
    assert problem.path == "bad_words[1]" and "limit max_phrase_tokens" in problem.rule, problem
    assert "xyzzyq" not in str(err.value) and len(str(err.value)) < 200


@pytest.mark.parametrize(("field", "value"), [("logit_bias", {"1": 5}), ("allowed_token_ids", [1]),
                                              ("bad_words", ["hello"])])
def test_a_field_whose_kind_is_not_allowed_is_refused_by_its_own_name(field: str, value: Any) -> None:
    narrow = parse_config({"allow_request_kinds": ["forced_text"]})
    with pytest.raises(SpecError) as err:
        with_controls(None, {field: value}, narrow)
    problem = err.value.problems[0]
    assert problem.path == field and "does not allow" in problem.rule, problem


@pytest.mark.parametrize(("value", "path"), [("hello", "bad_words"), (["hello", 3], "bad_words[1]"),
                                             (["  "], "bad_words[0]"), (["x" * 4097], "bad_words[0]"),
                                             (["x"] * 257, "bad_words")])
def test_bad_words_of_the_wrong_shape_are_refused_before_any_tokenizer_sees_them(value: Any, path: str) -> None:
    """``with_controls`` takes no tokenizer: the frontend refuses these too."""
    with pytest.raises(SpecError) as err:
        with_controls(None, {"bad_words": value}, ALL)
    assert err.value.problems[0].path == path
    assert "xxxx" not in str(err.value)


@pytest.mark.parametrize(("controls", "path", "rule"), [
    ({"logit_bias": {"abc": 1}}, 'logit_bias["abc"]', "decimal token id"),
    ({"logit_bias": {"5": 101}}, 'logit_bias["5"]', "<= 100"),
    ({"logit_bias": {str(i): 1.0 for i in range(2049)}}, "logit_bias", "max_bias_entries"),
    ({"allowed_token_ids": [1, -2]}, "allowed_token_ids[1]", ">= 0"),
    ({"allowed_token_ids": []}, "allowed_token_ids", "at least 1"),
])
def test_errors_inside_a_mapped_entry_name_the_field_not_logits_processors(controls: dict[str, Any], path: str,
                                                                          rule: str) -> None:
    mapped = with_controls([{"kind": "banned_tokens", "token_ids": [1]}], controls, ALL)
    with pytest.raises(SpecError) as err:
        parse_entries(mapped.entries, allowed_kinds=sorted(ALL.allow_request_kinds), limits=ALL.limits)
    problem = rename_control_paths(err.value, mapped.origins).problems[0]
    assert problem.path == path and rule in problem.rule, problem


def test_the_clients_own_entries_keep_their_paths() -> None:
    mapped = with_controls([{"kind": "banned_tokens", "token_ids": [-1]}], {"logit_bias": {"1": 1}}, ALL)
    with pytest.raises(SpecError) as err:
        parse_entries(mapped.entries, allowed_kinds=sorted(ALL.allow_request_kinds))
    assert rename_control_paths(err.value, mapped.origins).problems[0].path == "logits_processors[0].token_ids[0]"
