"""The transformers adapter inside the real ``model.generate()`` (transformers 5.x, CPU).

The embedded model has random weights: without the adapter it writes noise, so a decoded text
equal to the forced text can only come from the adapter. The model is loaded once per module.
"""

from __future__ import annotations

import pytest
import torch

from dynlogits.adapters.transformers import generate_kwargs, logits_processor, logits_width, payload_for
from dynlogits.processors.registry import PYTHON_FACTORIES_ENV
from dynlogits.specs import SpecError, parse_spec
from dynlogits.testing.faults import RAISE_AFTER_FACTORY

MAX_NEW = 24


@pytest.fixture(scope="module")
def model(embedded_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(embedded_model), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok(embedded_tokenizer):
    return embedded_tokenizer


def forced(text: str, tok, role: str = "agg"):
    return payload_for(parse_spec({"entries": [{"kind": "forced_text", "text": text}]}), role, tok)


def batch(tok, prompts):
    return tok(list(prompts), return_tensors="pt", padding=True, padding_side="left")


def texts(tok, enc, out) -> list[str]:
    return [tok.decode(row[enc["input_ids"].shape[1] :], skip_special_tokens=True) for row in out]


def generated(tok, enc, out) -> list[list[int]]:
    """Generated ids per row, trailing padding removed."""
    rows = out[:, enc["input_ids"].shape[1] :].tolist()
    return [r[: max((i + 1 for i, t in enumerate(r) if t != tok.pad_token_id), default=0)] for r in rows]


def test_forced_text_spec_decodes_to_exactly_its_text(model, tok):
    enc = batch(tok, ["Say something"])
    out = model.generate(**enc, **generate_kwargs(model, tok, enc, [forced("Hello world!", tok)]),
                         max_new_tokens=MAX_NEW, do_sample=False)
    assert texts(tok, enc, out) == ["Hello world!"]
    ids = tok.encode("Hello world!", add_special_tokens=False)
    assert generated(tok, enc, out)[0] == [*ids, tok.eos_token_id]  # ended by its EOS, not by max_new_tokens


def test_left_padded_batch_gives_each_prompt_its_own_text(model, tok):
    wanted = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "Yes."]
    enc = batch(tok, ["Hi", "What is your name? Tell me please", "a"])
    assert (enc["input_ids"][:, 0] == tok.pad_token_id).sum() == 2  # two prompts really are left-padded
    assert len({len(tok.encode(t, add_special_tokens=False)) for t in wanted}) == 3
    out = model.generate(**enc, **generate_kwargs(model, tok, enc, [forced(t, tok) for t in wanted]),
                         max_new_tokens=MAX_NEW, do_sample=False)
    assert texts(tok, enc, out) == wanted


def test_every_sampled_sequence_of_a_prompt_gets_its_prompts_text(model, tok):
    wanted = ["Hello world!", "No, thank you."]
    enc = batch(tok, ["Hi", "Question: yes or no?"])
    torch.manual_seed(0)
    out = model.generate(**enc, **generate_kwargs(model, tok, enc, [forced(t, tok) for t in wanted], num_return_sequences=3),
                         max_new_tokens=MAX_NEW, do_sample=True, top_k=0, temperature=1.5)
    assert texts(tok, enc, out) == [wanted[0]] * 3 + [wanted[1]] * 3  # rows are request-major


def test_beam_search_gives_each_prompt_its_text(model, tok):
    wanted = ["Hello world!", "The answer is forty-two."]
    enc = batch(tok, ["Hi", "What is the answer?"])
    out = model.generate(**enc, **generate_kwargs(model, tok, enc, [forced(t, tok) for t in wanted],
                                                  num_beams=3, num_return_sequences=2),
                         max_new_tokens=MAX_NEW, do_sample=False)
    # Every beam of a prompt is forced alike, so both returned hypotheses are its text.
    assert texts(tok, enc, out) == [wanted[0]] * 2 + [wanted[1]] * 2


def test_prompt_without_payload_is_generated_as_without_the_adapter(model, tok):
    enc = batch(tok, ["Hi", "Tell me a story about a cat"])
    plain = model.generate(**enc, max_new_tokens=MAX_NEW, do_sample=False)
    mixed = model.generate(**enc, **generate_kwargs(model, tok, enc, [forced("Hello world!", tok), None]),
                           max_new_tokens=MAX_NEW, do_sample=False)
    assert texts(tok, enc, mixed)[0] == "Hello world!"
    assert generated(tok, enc, mixed)[1] == generated(tok, enc, plain)[1]
    assert generated(tok, enc, plain)[1]  # the reference really generated something


@pytest.mark.parametrize("role", ["prefill", "encode"])
def test_prefill_and_encode_roles_put_no_payload_and_change_nothing(model, tok, role):
    assert forced("Hello world!", tok, role) is None
    assert forced("Hello world!", tok, "decode") is not None
    enc = batch(tok, ["Hi there"])
    plain = model.generate(**enc, max_new_tokens=8, do_sample=False)
    gated = model.generate(**enc, **generate_kwargs(model, tok, enc, [forced("Hello world!", tok, role)]),
                           max_new_tokens=8, do_sample=False)
    assert torch.equal(gated, plain)


def test_bad_payload_is_rejected_before_generate_naming_the_field(model, tok):
    enc = batch(tok, ["a", "b"])
    bad = [{"kind": "forced_sequence", "token_ids": [5, -3], "eos_token_id": 1}]
    with pytest.raises(SpecError) as err:
        generate_kwargs(model, tok, enc, [forced("Yes.", tok), bad])
    assert "payloads[1].dynamo_logits[0].token_ids[1]" in str(err.value)
    assert "payloads[0]" not in str(err.value)


def test_admission_bounds_ids_by_the_logits_width_not_the_tokenizer_length(model, tok):
    width = logits_width(model)
    assert width == model.config.vocab_size > len(tok)  # the embedded model pads its logits
    enc = batch(tok, ["a"])
    inside = [{"kind": "banned_tokens", "token_ids": [width - 1]}]
    generate_kwargs(model, tok, enc, [inside])  # beyond the tokenizer, inside the logits: admitted
    beyond = [{"kind": "banned_tokens", "token_ids": [width]}]
    with pytest.raises(SpecError, match=r"payloads\[0\]\.dynamo_logits\[0\]\.token_ids\[0\]: must be < vocab size"):
        generate_kwargs(model, tok, enc, [beyond])


def test_id_beyond_the_logits_width_ends_only_its_own_request_and_is_reported_once(model, tok):
    """Without admission (the builder alone), the bad request is realized already failed."""
    enc = batch(tok, ["a", "bb"])
    width = logits_width(model)
    bad = [{"kind": "forced_sequence", "token_ids": [width + 5], "eos_token_id": tok.eos_token_id}]
    reports: list[str] = []
    processor = logits_processor([bad, forced("Hello world!", tok)], vocab_size=width,
                                 prompt_width=enc["input_ids"].shape[1], eos_token_id=tok.eos_token_id,
                                 report=reports.append)
    out = model.generate(**enc, logits_processor=[processor], max_new_tokens=MAX_NEW, do_sample=False)
    assert generated(tok, enc, out)[0] == [tok.eos_token_id]  # ended at once
    assert texts(tok, enc, out)[1] == "Hello world!"
    assert len(reports) == 1 and "payload rejected in the engine" in reports[0]


def test_raising_processor_ends_all_rows_of_its_request_only_and_is_reported_once(model, tok, monkeypatch):
    monkeypatch.setenv(PYTHON_FACTORIES_ENV, RAISE_AFTER_FACTORY)
    faulty = [*forced("Hello world!", tok), {"kind": "python", "factory": RAISE_AFTER_FACTORY, "kwargs": {"after": 2}}]
    enc = batch(tok, ["a", "bb"])
    reports: list[str] = []
    torch.manual_seed(0)
    kwargs = generate_kwargs(model, tok, enc, [faulty, forced("Yes, please.", tok)], num_return_sequences=2,
                             report=reports.append)
    out = model.generate(**enc, **kwargs, max_new_tokens=MAX_NEW, do_sample=True)
    first_two = tok.encode("Hello world!", add_special_tokens=False)[:2]
    rows = generated(tok, enc, out)
    assert rows[0] == rows[1] == [*first_two, tok.eos_token_id]  # both samples fail-stopped after 2 tokens
    assert texts(tok, enc, out)[2:] == ["Yes, please."] * 2
    assert len(reports) == 1 and "injected fault" in reports[0]


@pytest.mark.parametrize("assist", ["prompt_lookup", "assistant_model"])
def test_assisted_generation_calls_per_draft_position_keep_the_forced_text(model, tok, assist):
    """Assisted generation verifies several draft tokens per forward pass, calling the processors
    once per draft position with input_ids cut there: each call's history holds the drafts before
    it. With an assistant model, the assistant's own generate() runs the same processor too."""
    text = "Hello world! Hello world!"
    enc = batch(tok, ["Hello world! Hello"])
    extra = {"prompt_lookup_num_tokens": 3} if assist == "prompt_lookup" else {"assistant_model": model}
    out = model.generate(**enc, **generate_kwargs(model, tok, enc, [forced(text, tok)]), max_new_tokens=MAX_NEW,
                         do_sample=False, **extra)
    assert texts(tok, enc, out) == [text]


def test_a_plugin_factory_is_told_each_prompt_without_its_padding_the_stop_ids_and_the_arrival(model, tok):
    """``kit.facts`` (the kit's plug-in kind: records its context, keeps only the prompt's and stop
    ids' logits) inside the real ``generate()`` over a left-padded batch."""
    from dynlogits.testing import plugin_factories, plugin_kinds

    prompts = ["Hi", "What is your name? Tell me please"]
    enc = batch(tok, prompts)
    assert (enc["input_ids"][:, 0] == tok.pad_token_id).sum() == 1  # the short prompt is left-padded
    payloads = [[{"kind": "kit.facts", "tag": f"p{k}"}] for k in range(len(prompts))]
    with plugin_kinds.registered(), plugin_factories.recording() as seen:
        kwargs = generate_kwargs(model, tok, enc, payloads, arrival_time=1700000000.25)
        out = model.generate(**enc, **kwargs, max_new_tokens=4, do_sample=False)
        for k, prompt in enumerate(prompts):
            [ctx] = seen[f"p{k}"]
            ids = tok(prompt)["input_ids"]
            assert ctx.prompt_ids == tuple(ids) and ctx.vocab_size == logits_width(model)
            assert ctx.stop_token_ids == (tok.eos_token_id,) and ctx.arrival_time == 1700000000.25
            assert set(generated(tok, enc, out[k : k + 1])[0]) <= {*ids, tok.eos_token_id}
