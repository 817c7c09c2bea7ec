"""``DynamoLogitsProcessor`` and its builder called directly, as ``generate()`` calls them (no model),
plus the conformance kit against the adapter's driver."""

from __future__ import annotations

import io

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

import dynlogits.adapters.transformers.processor as processor_module
from dynlogits.adapters.transformers import DynamoLogitsProcessor, generate_kwargs, logits_processor, payload_for
from dynlogits.adapters.transformers.conformance import drivers
from dynlogits.processors.registry import PYTHON_FACTORIES_ENV
from dynlogits.specs import SpecError, parse_spec
from dynlogits.testing.faults import RAISE_AFTER_FACTORY

VOCAB = 32
EOS = 1


def forced_seq(*ids: int) -> list[dict]:
    return [{"kind": "forced_sequence", "token_ids": list(ids), "eos_token_id": EOS}]


def only_finite(row: torch.Tensor) -> list[int]:
    return torch.isfinite(row).nonzero().flatten().tolist()


def test_is_a_transformers_logits_processor_usable_in_a_processor_list():
    processor = logits_processor([forced_seq(7)], vocab_size=VOCAB, prompt_width=3, eos_token_id=EOS)
    assert isinstance(processor, LogitsProcessor)
    scores = torch.randn(1, VOCAB)
    before = scores.clone()
    out = LogitsProcessorList([processor])(torch.tensor([[0, 5, 6]]), scores)
    assert only_finite(out[0]) == [7]
    assert torch.equal(scores, before)  # like transformers' own processors: the input is not edited


def test_repeated_calls_on_one_input_tensor_do_not_accumulate_edits():
    """Prompt lookup checks candidates by calling the list again and again on one ``torch.ones``
    tensor; each call must see that tensor unchanged."""
    processor = logits_processor([forced_seq(7, 8)], vocab_size=VOCAB, prompt_width=1, eos_token_id=EOS)
    fake = torch.ones(1, VOCAB)
    assert only_finite(processor(torch.tensor([[0]]), fake)[0]) == [7]
    assert only_finite(processor(torch.tensor([[0, 7]]), fake)[0]) == [8]


def test_rows_map_request_major_and_each_row_reads_its_own_history():
    """Row r belongs to request r // rows_per_request; the position comes from each row's own
    generated tokens (input_ids[r, prompt_width:]), so diverged rows of one request differ."""
    processor = logits_processor([forced_seq(10, 11, 12), forced_seq(20, 21, 22)], vocab_size=VOCAB,
                                 prompt_width=2, rows_per_request=2, eos_token_id=EOS)
    assert processor.requests[0] is processor.requests[1] is not processor.requests[2] is processor.requests[3]
    input_ids = torch.tensor([
        [9, 9, 10],   # request 0, one token generated
        [9, 9, 10],   # request 0, same
        [9, 9, 20],   # request 1
        [9, 9, 20],
    ])
    scores = processor(input_ids, torch.randn(4, VOCAB))
    assert [only_finite(r) for r in scores] == [[11], [11], [21], [21]]
    per_row = DynamoLogitsProcessor(processor.requests, [2, 2, 3, 2])  # row 2 started a column later
    scores = per_row(input_ids, torch.randn(4, VOCAB))
    assert [only_finite(r) for r in scores] == [[11], [11], [20], [21]]


def test_rows_without_a_request_are_left_bit_for_bit():
    processor = logits_processor([None, forced_seq(4)], vocab_size=VOCAB, prompt_width=1, eos_token_id=EOS)
    scores = torch.randn(2, VOCAB)
    before = scores[0].clone()
    out = processor(torch.tensor([[3], [3]]), scores)
    assert torch.equal(out[0], before) and only_finite(out[1]) == [4]


def test_no_host_copy_when_no_row_has_a_request(monkeypatch):
    def copy_forbidden(*args, **kwargs):
        raise AssertionError("input_ids was copied to the host")

    monkeypatch.setattr(processor_module, "histories_from_ids", copy_forbidden)
    processor = logits_processor([None, None], vocab_size=VOCAB, prompt_width=1, rows_per_request=2, eos_token_id=EOS)
    scores = torch.randn(4, VOCAB)
    before = scores.clone()
    assert processor(torch.zeros(4, 3, dtype=torch.long), scores) is scores
    assert torch.equal(scores, before)


def test_a_failing_request_stops_all_its_rows_and_spares_the_other_request(monkeypatch):
    monkeypatch.setenv(PYTHON_FACTORIES_ENV, RAISE_AFTER_FACTORY)
    faulty = [{"kind": "python", "factory": RAISE_AFTER_FACTORY, "kwargs": {"after": 1}}]
    reports: list[str] = []
    processor = logits_processor([faulty, forced_seq(5, 6)], vocab_size=VOCAB, prompt_width=1, rows_per_request=3,
                                 eos_token_id=EOS, report=reports.append)
    input_ids = torch.tensor([[0, 8]] * 3 + [[0, 5]] * 3)
    scores = processor(input_ids, torch.randn(6, VOCAB))
    assert [only_finite(r) for r in scores] == [[EOS]] * 3 + [[6]] * 3
    assert all(float(r[EOS]) == 0.0 for r in scores[:3])
    processor(input_ids, torch.randn(6, VOCAB))  # a later step: still stopped, not reported again
    assert len(reports) == 1


def test_failed_request_without_a_stop_token_in_the_width_uses_an_explicit_stop_id():
    processor = logits_processor([forced_seq(VOCAB + 1)], vocab_size=VOCAB, prompt_width=0, eos_token_id=VOCAB + 3,
                                 stop_token_ids=(9, 4))
    assert only_finite(processor(torch.zeros(1, 1, dtype=torch.long), torch.randn(1, VOCAB))[0]) == [4]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rows_per_request": 0}, ValueError, "rows_per_request must be an integer >= 1"),
        ({"rows_per_request": True}, ValueError, "rows_per_request"),
        ({"prompt_width": -1}, ValueError, "prompt_width must be an integer >= 0"),
        ({"vocab_size": 0}, ValueError, "vocab_size must be an integer >= 1"),
        ({"payloads": forced_seq(3)}, TypeError, r"payloads\[0\] is a mapping"),  # one payload, not a list of them
        ({"payloads": {"kind": "forced_sequence"}}, TypeError, "one payload"),
    ],
)
def test_builder_rejects_arguments_that_cannot_be_meant(kwargs, error, match):
    args = {"payloads": [forced_seq(3)], "vocab_size": VOCAB, "prompt_width": 1, "eos_token_id": EOS} | kwargs
    payloads = args.pop("payloads")
    with pytest.raises(error, match=match):
        logits_processor(payloads, **args)


def test_a_batch_it_was_not_built_for_is_refused():
    processor = logits_processor([forced_seq(3)], vocab_size=VOCAB, prompt_width=1, rows_per_request=2, eos_token_id=EOS)
    with pytest.raises(ValueError, match="built for 2 rows.*num_beams"):
        processor(torch.zeros(3, 2, dtype=torch.long), torch.randn(3, VOCAB))
    with pytest.raises(ValueError, match="logits width 32"):
        processor(torch.zeros(2, 2, dtype=torch.long), torch.randn(2, VOCAB + 1))
    with pytest.raises(ValueError, match="exceeds input_ids width"):
        processor(torch.zeros(2, 0, dtype=torch.long), torch.randn(2, VOCAB))
    with pytest.raises(ValueError, match="2 entries for 3 rows"):
        DynamoLogitsProcessor([None, None, None], [0, 0])


class _Model:
    """Just what ``generate_kwargs`` reads from a model (no forward pass here)."""

    class generation_config:  # noqa: N801
        eos_token_id = [EOS, 2]

    config = None

    def get_output_embeddings(self):
        return torch.nn.Linear(4, VOCAB, bias=False)


def test_generate_kwargs_pin_the_expansion_the_processor_was_built_for(embedded_tokenizer):
    enc = {"input_ids": torch.zeros(2, 5, dtype=torch.long)}
    kwargs = generate_kwargs(_Model(), embedded_tokenizer, enc, [forced_seq(3), None], num_beams=4, num_return_sequences=2)
    assert kwargs["num_beams"] == 4 and kwargs["num_return_sequences"] == 2
    (processor,) = kwargs["logits_processor"]
    assert isinstance(kwargs["logits_processor"], LogitsProcessorList)
    assert processor.num_rows == 8 and processor.vocab_size == VOCAB
    assert processor.requests[3] is processor.requests[0] and processor.requests[4] is None
    assert processor.requests[0].stop_token_id == EOS
    with pytest.raises(ValueError, match="1 payloads for a batch of 2 prompts"):
        generate_kwargs(_Model(), embedded_tokenizer, enc, [None])
    with pytest.raises(ValueError, match="num_beams must be an integer >= 1"):
        generate_kwargs(_Model(), embedded_tokenizer, enc, [None, None], num_beams=0)


def test_payload_for_resolves_text_with_the_tokenizer_and_needs_one_only_for_text(embedded_tokenizer):
    spec = parse_spec({"entries": [{"kind": "banned_tokens", "token_ids": [7]}, {"kind": "forced_text", "text": "Yes."}]})
    payload = payload_for(spec, "agg", embedded_tokenizer)
    assert payload[1] == {"kind": "forced_sequence", "token_ids": embedded_tokenizer.encode("Yes.", add_special_tokens=False),
                          "eos_token_id": embedded_tokenizer.eos_token_id}
    with pytest.raises(SpecError, match=r"entries\[1\]\.text"):
        payload_for(spec, "agg", None)
    assert payload_for(parse_spec({"entries": [{"kind": "banned_tokens", "token_ids": [7]}]}), "decode", None) is not None
    assert payload_for(spec, "prefill", embedded_tokenizer) is None and payload_for(None, "agg", None) is None


def test_conformance_driver_is_one_transformers_driver_that_passes_the_kit():
    from dynlogits.testing import AdapterDriver, run_conformance

    (driver,) = drivers(vocab_size=1024)
    assert isinstance(driver, AdapterDriver) and driver.name == "transformers" and driver.vocab_size == 1024
    out = io.StringIO()
    assert run_conformance("transformers", out) == 0, out.getvalue()
