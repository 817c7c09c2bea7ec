"""The engine as the spec source (``DYN_LOGITS_SPEC_SOURCE=engine``), without starting an engine.

Real parts: the embedded model's tokenizer, vLLM's ``SamplingParams``, ``KVTransferConfig`` and,
for the role, a ``VllmConfig`` built by vLLM's own ``EngineArgs`` handed to the real
``DynamoVllmLogitsProcessor``. The same code runs inside ``dynamo.vllm`` in ``test_dynamo_deploy.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from vllm import SamplingParams
from vllm.config import KVTransferConfig

from dynlogits import sdk
from dynlogits.adapters.vllm.engine_spec import VllmEngineSpec, engine_role, request_role
from dynlogits.adapters.vllm.request import realize_request, validate
from dynlogits.policy.engine_spec import SPEC_SOURCE_ENV, SpecSource, resolve_engine_spec, spec_source
from dynlogits.policy.hook import TEST_HOOK_ENV, TEST_HOOK_TEXT
from dynlogits.policy.roles import DisaggregationMode as Mode
from dynlogits.specs import SpecError

VOCAB = 1024  # the embedded model's logits width
ENGINE = {SPEC_SOURCE_ENV: "engine"}
HOOK = {**ENGINE, TEST_HOOK_ENV: "1"}


def forced(tokenizer: Any, text: str) -> dict[str, Any]:
    return {"kind": "forced_sequence", "token_ids": tokenizer.encode(text, add_special_tokens=False),
            "eos_token_id": tokenizer.eos_token_id}


def write_config(tmp_path: Path, doc: dict[str, Any]) -> dict[str, str]:
    path = tmp_path / "logits.yaml"
    path.write_text(yaml.safe_dump(doc))
    return {**ENGINE, "DYN_LOGITS_SPEC": str(path)}


def test_the_worker_is_the_default_source_so_the_engine_resolves_nothing(embedded_tokenizer: Any) -> None:
    # The embedded worker (python -m dynlogits.serve.worker) writes extra_args itself: the engine must not add the hook again.
    assert spec_source({}) is SpecSource.WORKER
    assert resolve_engine_spec(Mode.AGGREGATED, lambda: embedded_tokenizer, VOCAB, {TEST_HOOK_ENV: "1"}) is None


def test_a_bad_source_value_names_the_variable() -> None:
    with pytest.raises(SpecError) as err:
        spec_source({SPEC_SOURCE_ENV: "frontend"})
    assert err.value.problems[0].path == SPEC_SOURCE_ENV
    assert "'engine'" in str(err.value)


@pytest.mark.parametrize("role", [Mode.AGGREGATED, Mode.DECODE])
def test_the_hook_is_resolved_with_the_engines_tokenizer_on_generating_roles(embedded_tokenizer: Any, role: Mode) -> None:
    spec = resolve_engine_spec(role, lambda: embedded_tokenizer, VOCAB, HOOK)
    assert spec is not None
    assert spec.payload_for(None) == [forced(embedded_tokenizer, TEST_HOOK_TEXT)]


@pytest.mark.parametrize("role", [Mode.PREFILL, Mode.ENCODE])
def test_prefill_and_encode_engines_activate_nothing(embedded_tokenizer: Any, tmp_path: Path, role: Mode) -> None:
    environ = {**write_config(tmp_path, {"entries": [{"kind": "banned_tokens", "token_ids": [7]}],
                                         "allow_request_kinds": ["banned_tokens"]}), TEST_HOOK_ENV: "1"}
    spec = resolve_engine_spec(role, lambda: embedded_tokenizer, VOCAB, environ)
    assert spec is not None
    assert spec.payload_for(None) is None
    assert spec.payload_for([{"kind": "banned_tokens", "token_ids": [9]}]) is None
    with pytest.raises(SpecError):  # still validated, so a bad request fails the same way on every role
        spec.payload_for([{"kind": "logit_bias", "bias": {"3": 1.0}}])


def test_the_operator_spec_applies_to_every_request_and_allowed_request_kinds_follow(embedded_tokenizer: Any, tmp_path: Path) -> None:
    environ = write_config(tmp_path, {"entries": [{"kind": "banned_tokens", "token_ids": [7, 8]}],
                                      "allow_request_kinds": ["forced_text"]})
    spec = resolve_engine_spec(Mode.AGGREGATED, lambda: embedded_tokenizer, VOCAB, environ)
    assert spec is not None
    deployment = [{"kind": "banned_tokens", "token_ids": [7, 8]}]
    assert spec.payload_for(None) == deployment
    assert spec.payload_for([]) == deployment
    assert spec.payload_for([{"kind": "forced_text", "text": "Hello world!"}]) == [*deployment, forced(embedded_tokenizer, "Hello world!")]


def test_a_clients_entries_that_contradict_the_operators_are_refused_naming_both(embedded_tokenizer: Any,
                                                                                 tmp_path: Path) -> None:
    environ = write_config(tmp_path, {"entries": [{"kind": "forced_text", "text": "Hi"}],
                                      "allow_request_kinds": ["forced_text"]})
    spec = resolve_engine_spec(Mode.AGGREGATED, lambda: embedded_tokenizer, VOCAB, environ)
    assert spec is not None
    with pytest.raises(SpecError, match=r"extra_args\.dynamo_logits\[0\]: contradicts the entries before it: "
                                        r"it forces token \d+ at output position 0, which deployment entries\[0\] does not allow"):
        spec.payload_for([{"kind": "forced_text", "text": "Hello world!"}])


@pytest.mark.parametrize(("payload", "path", "rule"), [
    ([{"kind": "banned_tokens", "token_ids": [1]}], "extra_args.dynamo_logits[0].kind", "not allowed by this deployment"),
    ([{"kind": "python", "factory": "os:system"}], "extra_args.dynamo_logits[0].kind", "operator-only"),
    ({"kind": "forced_text", "text": "x"}, "extra_args.dynamo_logits", "list"),
    ([{"kind": "forced_text", "text": ""}], "extra_args.dynamo_logits[0].text", ""),
])
def test_a_clients_payload_is_held_to_the_operators_allow_list(embedded_tokenizer: Any, tmp_path: Path,
                                                                payload: Any, path: str, rule: str) -> None:
    environ = write_config(tmp_path, {"allow_request_kinds": ["forced_text"]})
    spec = resolve_engine_spec(Mode.AGGREGATED, lambda: embedded_tokenizer, VOCAB, environ)
    assert spec is not None
    with pytest.raises(SpecError) as err:
        spec.payload_for(payload)
    assert err.value.problems[0].path.startswith(path)
    assert rule in str(err.value)


def test_an_id_beyond_the_logits_width_is_refused_in_the_engine(embedded_tokenizer: Any, tmp_path: Path) -> None:
    spec = resolve_engine_spec(Mode.AGGREGATED, lambda: embedded_tokenizer, VOCAB,
                               write_config(tmp_path, {"allow_request_kinds": ["banned_tokens"]}))
    assert spec is not None
    with pytest.raises(SpecError, match=r"extra_args\.dynamo_logits\[0\]\.token_ids"):
        spec.payload_for([{"kind": "banned_tokens", "token_ids": [VOCAB]}])


@pytest.mark.parametrize(("kv", "role"), [
    (None, Mode.AGGREGATED),
    ({"kv_connector": "NixlConnector", "kv_role": "kv_producer"}, Mode.PREFILL),
    ({"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}, Mode.DECODE),
    ({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, Mode.AGGREGATED),
])
def test_the_engines_role_comes_from_its_kv_transfer_config(kv: dict[str, str] | None, role: Mode) -> None:
    class Config:
        kv_transfer_config = KVTransferConfig(**kv) if kv else None

    assert engine_role(Config()) is role


def test_a_prefill_for_a_remote_decode_is_a_prefill_request_whatever_the_engines_role() -> None:
    prefill = SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": {"do_remote_decode": True}})
    assert request_role(prefill, Mode.AGGREGATED) is Mode.PREFILL
    assert request_role(SamplingParams(), Mode.DECODE) is Mode.DECODE
    assert request_role(SamplingParams(extra_args={"kv_transfer_params": {"do_remote_prefill": True}}),
                        Mode.DECODE) is Mode.DECODE


def vllm_engine_spec(tokenizer: Any, environ: dict[str, str]) -> VllmEngineSpec:
    """What ``engine_spec_for`` builds in an aggregated engine, with the embedded tokenizer."""
    spec = resolve_engine_spec(Mode.AGGREGATED, lambda: tokenizer, VOCAB, environ)
    assert spec is not None
    return VllmEngineSpec(spec)


def test_realization_runs_the_deployment_spec_and_fails_a_bad_client_payload_alone(embedded_tokenizer: Any) -> None:
    engine_spec = vllm_engine_spec(embedded_tokenizer, HOOK)
    first = embedded_tokenizer.encode(TEST_HOOK_TEXT, add_special_tokens=False)[0]

    request = realize_request(SamplingParams(max_tokens=8), vocab_size=VOCAB, engine_spec=engine_spec)
    assert request is not None
    row = torch.zeros(VOCAB)
    sdk.apply_row(request, [], row)
    assert int(row.argmax()) == first

    prefill = SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": {"do_remote_decode": True}})
    assert realize_request(prefill, vocab_size=VOCAB, engine_spec=engine_spec) is None

    failures: list[str] = []
    smuggled = SamplingParams(max_tokens=8, extra_args={"dynamo_logits": [{"kind": "banned_tokens", "token_ids": [first]}]})
    bad = realize_request(smuggled, vocab_size=VOCAB, report=failures.append, engine_spec=engine_spec)
    assert bad is not None and bad.failure is not None  # reported, never raised into the engine
    assert "not allowed by this deployment" in failures[0]
    row = torch.zeros(VOCAB)  # no stop token to end it: the deployment's entries keep applying
    sdk.apply_row(bad, [], row)
    assert int(row.argmax()) == first


def test_admission_holds_extra_args_to_the_allow_list_only_with_the_engine_as_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smuggled = SamplingParams(extra_args={"dynamo_logits": [{"kind": "banned_tokens", "token_ids": [3]}]})
    validate(smuggled)  # worker as source: the payload came from the gate upstream
    for key, value in write_config(tmp_path, {"allow_request_kinds": ["forced_text"]}).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=r"extra_args\.dynamo_logits\[0\]\.kind: kind 'banned_tokens' is not allowed"):
        validate(smuggled)
    validate(SamplingParams(extra_args={"dynamo_logits": [{"kind": "forced_text", "text": "ok"}]}))
    validate(SamplingParams())


@pytest.fixture(scope="module")
def engine_configs(embedded_model: Path) -> dict[str, Any]:
    """Real ``VllmConfig``s for an aggregated and a KV-producer (prefill) engine; no engine starts."""
    from vllm.engine.arg_utils import EngineArgs

    producer = {"kv_connector": "ExampleConnector", "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": "/tmp/dynlogits-unused-kv"}}
    return {name: EngineArgs(model=str(embedded_model), dtype="float32", enforce_eager=True, max_model_len=512,
                             kv_transfer_config=kv).create_engine_config()
            for name, kv in (("agg", None), ("prefill", producer))}


def test_the_real_processor_resolves_the_spec_once_and_a_kv_producer_activates_nothing(
        engine_configs: dict[str, Any], embedded_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor

    for key, value in HOOK.items():
        monkeypatch.setenv(key, value)
    agg = DynamoVllmLogitsProcessor(engine_configs["agg"], torch.device("cpu"), False)
    prefill = DynamoVllmLogitsProcessor(engine_configs["prefill"], torch.device("cpu"), False)
    assert agg.engine_spec is not None and agg.engine_spec.role is Mode.AGGREGATED
    assert prefill.engine_spec is not None and prefill.engine_spec.role is Mode.PREFILL
    assert agg.new_req_logits_processor(SamplingParams(max_tokens=4)) is not None
    assert prefill.new_req_logits_processor(SamplingParams(max_tokens=4)) is None

    monkeypatch.delenv(SPEC_SOURCE_ENV)
    assert DynamoVllmLogitsProcessor(engine_configs["agg"], torch.device("cpu"), False).engine_spec is None


def test_with_the_engine_as_source_the_models_default_reasoning_delimiters_lead_each_payload(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model folder that declares reasoning delimiters (the embedded model's reasoning variant)
    gives them to every request that activates entries, resolved with the engine's tokenizer."""
    from vllm.engine.arg_utils import EngineArgs

    from dynlogits.adapters.vllm.engine_spec import engine_spec_for
    from dynlogits.model_builder import build_model

    model = build_model(tmp_path / "reasoning", reasoning=True)
    config = tmp_path / "spec.yaml"
    config.write_text("allow_request_kinds: [thinking_budget]\n")
    vllm_config = EngineArgs(model=str(model), dtype="float32", enforce_eager=True, max_model_len=512).create_engine_config()
    spec = engine_spec_for(vllm_config, 1024, {SPEC_SOURCE_ENV: "engine", "DYN_LOGITS_SPEC": str(config)})
    assert spec is not None
    payload = spec.payload_for(SamplingParams(extra_args={"dynamo_logits": [{"kind": "thinking_budget", "budget": 2}]}))
    assert payload is not None and payload[0] == {"kind": "reasoning", "start_token_ids": [1000], "end_token_ids": [1001]}
