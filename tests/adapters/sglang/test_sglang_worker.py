"""``python -m dynlogits.serve.worker --backend sglang``: requests are built for SGLang's engine with its real
request classes and tested up to the engine call; the engine itself is never started (it needs a GPU and
sgl-kernel), and the worker exits with a clear message where it cannot start."""

from __future__ import annotations

import json
import subprocess
import sys

from dynlogits.adapters.sglang.harness import decode_like_sglang
from dynlogits.adapters.sglang.processor import processor_string
from dynlogits.sdk import carried_arrival
from dynlogits.serve.protocol import SamplingOptions
from dynlogits.serve.worker.sglang_engine import SglangEngine
from dynlogits.specs import WIRE_KEY, ForcedTokenSequenceSpec, encode_entries
from dynlogits.tools.ports import free_port_block


def _engine(tokenizer) -> SglangEngine:
    return SglangEngine(engine=None, tokenizer=tokenizer, model_name="m", max_model_len=512,
                        vocab_size=1024, adapter_registered=True)


def test_worker_builds_sglang_requests_with_its_own_processor_and_the_payload(embedded_tokenizer):
    engine = _engine(embedded_tokenizer)
    entries = [ForcedTokenSequenceSpec(token_ids=(5, 6), eos_token_id=1)]
    options = SamplingOptions(max_tokens=8, temperature=0.0, n=2, stop=["x"])
    request = engine.sampling_params(options, entries, {WIRE_KEY: [{"kind": "smuggled"}]})
    assert request.custom_logit_processor == processor_string()
    assert json.loads(request.sampling_params["custom_params"][WIRE_KEY]) == encode_entries(entries)
    prompt = engine.render_prompt(prompt="hello", prompt_token_ids=None, messages=None)
    generate = request.generate_req_input(prompt, "req-1")
    assert type(generate).__name__ == "GenerateReqInput" and generate.custom_logit_processor == processor_string()
    wire = decode_like_sglang(generate.sampling_params, rid="req-1", input_ids=prompt,
                              custom_logit_processor=generate.custom_logit_processor)
    assert wire.sampling_params.max_new_tokens == 8 and wire.sampling_params.n == 2
    assert json.loads(wire.sampling_params.custom_params[WIRE_KEY]) == encode_entries(entries)


def test_worker_stamps_the_arrival_beside_the_payload_through_sglangs_transport(embedded_tokenizer):
    entries = [ForcedTokenSequenceSpec(token_ids=(5, 6), eos_token_id=1)]
    request = _engine(embedded_tokenizer).sampling_params(SamplingOptions(), entries, {}, arrival_time=1700000000.25)
    wire = decode_like_sglang(request.sampling_params, rid="req-1", input_ids=[3, 4],
                              custom_logit_processor=request.custom_logit_processor)
    assert carried_arrival(wire.sampling_params.custom_params) == 1700000000.25


def test_activation_drops_an_arrival_a_client_put_in_custom_params():
    from dynlogits.adapters.sglang import activate
    from dynlogits.specs import ARRIVAL_KEY

    entries = [ForcedTokenSequenceSpec(token_ids=(5, 6), eos_token_id=1)]
    params = {"custom_params": {ARRIVAL_KEY: 1e12, "theirs": 1}}
    activate(params, entries)
    assert ARRIVAL_KEY not in params["custom_params"] and params["custom_params"]["theirs"] == 1
    activate(params, entries, arrival_time=5.0)
    assert params["custom_params"][ARRIVAL_KEY] == 5.0
    activate(params, [], arrival_time=5.0)
    assert params["custom_params"] == {"theirs": 1}


def test_worker_without_entries_names_no_processor(embedded_tokenizer):
    request = _engine(embedded_tokenizer).sampling_params(SamplingOptions(), [], {})
    assert request.custom_logit_processor is None and request.sampling_params.get("custom_params") is None


def test_sglang_worker_exits_with_a_clear_message_when_sglangs_engine_cannot_start(tmp_path):
    port = free_port_block(1)
    proc = subprocess.run([sys.executable, "-m", "dynlogits.serve.worker", "--backend", "sglang", "--port", str(port)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "SglangEngineUnavailable" in proc.stderr and "needs SGLang installed with its GPU dependencies" in proc.stderr


def test_the_sglang_engine_takes_the_entry_names_the_worker_passes_every_engine(embedded_tokenizer):
    """``GenerateCall.start`` names the entries to every engine's ``generate`` (the ``WorkerEngine``
    contract both engines implement); SGLang's stream is a stand-in here (its engine needs a GPU)."""
    import asyncio
    import types

    async def async_generate(**kwargs):
        async def outputs():
            yield {"index": 0, "text": "hi", "output_ids": [5], "meta_info": {"finish_reason": {"type": "stop"}}}
        return outputs()

    engine = _engine(embedded_tokenizer)
    engine.engine = types.SimpleNamespace(engine=types.SimpleNamespace(async_generate=async_generate))
    request = engine.sampling_params(SamplingOptions(max_tokens=4), [], {})

    async def run():
        return [c async for c in engine.generate([1, 2], request, "r-1", entry_paths=["deployment entries[0]"],
                                                 entry_kinds=["banned_tokens"])]

    chunks = asyncio.run(run())
    assert chunks[0].text == "hi" and chunks[0].finish_reason == "stop" and chunks[-1].usage.completion_tokens == 1
