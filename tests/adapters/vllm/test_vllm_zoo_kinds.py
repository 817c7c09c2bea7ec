"""Where the zoo's kinds run in the vLLM adapter (docs/vllm.md, "The apply path"), with vLLM's real
classes and no engine: all four are resident on the V1 runner (decided from the live histories) and
under Model Runner V2 (``deadline`` reads no history, ``trigger`` is followed and ``multiple_choice``
decided on the device), and each draft row follows its own history."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from dynlogits.adapters.vllm.conformance import VllmV1Driver, VllmV2Driver, _params  # noqa: E402
from dynlogits.testing.oracle import OracleRequest, expected_row  # noqa: E402
from dynlogits.testing.runner import KIT_VOCAB_SIZE  # noqa: E402

EOS = 1
PROMPT = (3, 4, 5)
TRIGGER = [{"kind": "trigger", "trigger_token_ids": [40, 41], "phrase_token_ids": [50, 51]}]
PAYLOADS: dict[str, list[dict[str, Any]]] = {
    "trigger": TRIGGER,
    "deadline": [{"kind": "deadline", "seconds": 3600}],
    "prompt_tokens": [{"kind": "prompt_tokens", "mode": "restrict"}],
    "multiple_choice": [{"kind": "multiple_choice", "choices": [[7, 8], [9]], "eos_token_id": EOS}],
}
RESIDENT = {"v1": {"trigger", "deadline", "prompt_tokens", "multiple_choice"},
            "v2": {"trigger", "prompt_tokens", "deadline", "multiple_choice"}}


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_the_v1_runner_keeps_every_zoo_kind_resident(kind: str) -> None:
    driver = VllmV1Driver(KIT_VOCAB_SIZE)
    driver.add("r", PAYLOADS[kind], prompt_ids=PROMPT, eos_token_id=EOS)
    driver.step(["r"], torch.randn(1, KIT_VOCAB_SIZE))
    (entry,) = driver.processor._entries.values()
    assert (entry.slot is not None) == (kind in RESIDENT["v1"])
    assert not driver.failures()


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_model_runner_v2_keeps_every_zoo_kind_resident(kind: str) -> None:
    driver = VllmV2Driver(KIT_VOCAB_SIZE)
    driver.add("r", PAYLOADS[kind], prompt_ids=PROMPT, eos_token_id=EOS)
    driver.step(["r"], torch.randn(1, KIT_VOCAB_SIZE))
    slot = driver.harness.reqs["r"].slot
    assert bool(driver.processor._is_resident[slot]) == (kind in RESIDENT["v2"])
    assert bool(driver.processor._active[slot]) and not driver.failures()


def test_under_model_runner_v2_each_draft_row_of_a_trigger_request_follows_its_own_history() -> None:
    driver = VllmV2Driver(KIT_VOCAB_SIZE)
    harness = driver.harness
    harness.add_request("r", PROMPT, _params(TRIGGER, EOS))
    harness.commit("r", [40])
    drafts = [41, 50, 6]
    logits = torch.randn(1 + len(drafts), KIT_VOCAB_SIZE)
    out = harness.step(["r"], logits.clone(), drafts={"r": drafts})
    request = OracleRequest(prompt=PROMPT, stop_token_ids=(EOS,), arrival=time.time(), now=time.time())
    for k in range(len(drafts) + 1):  # row k: the committed token and the first k drafts
        history = [40, *drafts[:k]]
        want = expected_row(TRIGGER, history, logits[k].tolist(), request)
        assert out[k].tolist() == pytest.approx(want), f"draft row {k}"
    assert [int(out[k].argmax()) for k in (1, 2)] == [50, 51]  # the phrase, from the trigger in the drafts
    assert driver.processor._is_resident[harness.reqs["r"].slot]  # followed on the device, not read back
    assert not driver.failures()


# -- the prompt a prompt-bound kind reads, where a client's payload reaches the engine -------------
def _prompt_bound_request(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, embedded_tokenizer: Any, *,
                          engine: bool, prompt_len: int) -> Any:
    import json

    import yaml
    from vllm import SamplingParams

    from dynlogits.adapters.vllm.engine_spec import VllmEngineSpec
    from dynlogits.adapters.vllm.request import realize_request
    from dynlogits.policy.engine_spec import REQUEST_KINDS_ENV, SPEC_SOURCE_ENV, resolve_engine_spec
    from dynlogits.policy.roles import DisaggregationMode
    from dynlogits.specs import WIRE_KEY

    monkeypatch.setenv(REQUEST_KINDS_ENV, "prompt_tokens")
    spec = None
    if engine:  # the engine as the spec source, its operator config tightening max_prompt_tokens
        config = tmp_path / "logits.yaml"
        config.write_text(yaml.safe_dump({"allow_request_kinds": ["prompt_tokens"], "limits": {"max_prompt_tokens": 4}}))
        monkeypatch.setenv(SPEC_SOURCE_ENV, "engine")
        monkeypatch.setenv("DYN_LOGITS_SPEC", str(config))
        resolved = resolve_engine_spec(DisaggregationMode.AGGREGATED, lambda: embedded_tokenizer, KIT_VOCAB_SIZE)
        assert resolved is not None
        spec = VllmEngineSpec(resolved)
    else:
        monkeypatch.delenv(SPEC_SOURCE_ENV, raising=False)
    params = SamplingParams(stop_token_ids=[EOS], extra_args={WIRE_KEY: json.dumps([{"kind": "prompt_tokens", "mode": "boost"}])})
    failures: list[str] = []
    request = realize_request(params, vocab_size=KIT_VOCAB_SIZE, report=failures.append, engine_spec=spec,
                              prompt_ids=[5] * prompt_len)
    assert request is not None
    return request, failures


@pytest.mark.parametrize(("engine", "limit"), [(True, 4), (False, 131_072)], ids=["engine-spec-source", "client-text"])
def test_a_clients_prompt_bound_entry_on_a_prompt_over_the_limit_fails_its_request_naming_the_prompt(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, embedded_tokenizer: Any, engine: bool, limit: int) -> None:
    ok, failures = _prompt_bound_request(tmp_path, monkeypatch, embedded_tokenizer, engine=engine, prompt_len=limit)
    assert not ok.failed and not failures
    over, failures = _prompt_bound_request(tmp_path, monkeypatch, embedded_tokenizer, engine=engine, prompt_len=limit + 1)
    assert over.failed and len(failures) == 1
    assert (f"prompt: is {limit + 1} tokens; extra_args.dynamo_logits[0] (prompt_tokens) reads at most {limit} "
            "(limit max_prompt_tokens)") in failures[0]
