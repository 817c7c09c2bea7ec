"""The payload as JSON text (what ``vllm_xargs`` of ``vllm serve`` carries) and the trust rule for it,
without an engine: vLLM's real ``SamplingParams`` and validators, the real processor class built
from a real ``VllmConfig``; ``tests/adapters/vllm/test_vllm_serve.py`` runs the same through vLLM's server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.v1.sample.logits_processor import validate_logits_processors_parameters  # noqa: E402

from dynlogits.adapters.vllm import PROCESSOR_FQCN, DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.adapters.vllm.request import payload_text_bound, realize_request, validate  # noqa: E402
from dynlogits.client import payload_text, vllm_xargs  # noqa: E402
from dynlogits.policy.engine_spec import REQUEST_KINDS_ENV, SPEC_SOURCE_ENV  # noqa: E402
from dynlogits.specs import ARRIVAL_KEY, DEFAULT_LIMITS, WIRE_KEY, SpecError  # noqa: E402
from dynlogits.specs.entries import REQUEST_FORBIDDEN_KINDS, WIRE_KINDS  # noqa: E402
from dynlogits.specs.schema import golden_vectors  # noqa: E402

VOCAB = 1024
FORCED = [{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 2}]
#: Every kind a client may be allowed in the text form while the worker is the spec source.
CLIENT_KINDS = ",".join(sorted(WIRE_KINDS - REQUEST_FORBIDDEN_KINDS))


def sp(value: Any, **extra: Any) -> SamplingParams:
    return SamplingParams(extra_args={WIRE_KEY: value, **extra})


def text(payload: Any) -> str:
    return json.dumps(payload)


@pytest.fixture()
def allow(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    def set_kinds(kinds: str) -> None:
        monkeypatch.setenv(REQUEST_KINDS_ENV, kinds)
    monkeypatch.delenv(SPEC_SOURCE_ENV, raising=False)
    return set_kinds


# -- the text form: same rules, same error paths ---------------------------------------------------
def _client_form(payload: Any) -> bool:
    """Whether a client could send ``payload`` in the text form at all (no operator-only kind)."""
    return not any(isinstance(e, dict) and e.get("kind") in ("python", "forced_text") for e in payload or [])


TEXT_VECTORS = [(name, v) for name, v in golden_vectors() if isinstance(v["payload"], list) and _client_form(v["payload"])]


@pytest.mark.parametrize(("name", "vector"), TEXT_VECTORS, ids=[n for n, _ in TEXT_VECTORS])
def test_json_text_gets_the_same_verdict_and_error_paths_as_the_list(allow, name: str, vector: dict[str, Any]) -> None:
    allow(CLIENT_KINDS)
    if vector["valid"]:
        validate(sp(vector["payload"]))
        validate(sp(text(vector["payload"])))
        return
    for carried in (vector["payload"], text(vector["payload"])):
        with pytest.raises(SpecError) as err:
            validate(sp(carried))
        for expected in vector.get("errors") or [vector["error"]]:
            assert expected.split(": ")[0] + ": " in str(err.value), (carried, str(err.value))


def test_a_bad_entry_in_text_is_named_by_its_field_through_vllms_admission(allow) -> None:
    allow(CLIENT_KINDS)
    bad = text([{"kind": "forced_sequence", "token_ids": [5, -3], "eos_token_id": 2}])
    with pytest.raises(VLLMValidationError, match=r"dynamo_logits\[0\]\.token_ids\[1\]: must be >= 0"):
        validate_logits_processors_parameters([PROCESSOR_FQCN], sp(bad))


@pytest.mark.parametrize("value", ["not json", "[{'kind': 'banned_tokens'}]", "[NaN]", "[1,", "[" * 5000 + "]" * 5000])
def test_text_that_is_not_json_is_refused_saying_so(allow, value: str) -> None:
    allow(CLIENT_KINDS)
    with pytest.raises(SpecError, match=r"^extra_args\.dynamo_logits: .*not valid JSON"):
        validate(sp(value))


def test_text_of_text_is_not_parsed_twice(allow) -> None:
    allow(CLIENT_KINDS)
    with pytest.raises(SpecError, match=r"dynamo_logits: must be a list"):
        validate(sp(text(text(FORCED))))


def test_text_longer_than_any_payload_within_the_limits_is_refused_before_parsing(allow) -> None:
    allow(CLIENT_KINDS)
    bound = payload_text_bound(DEFAULT_LIMITS)
    widest = [{"kind": "thinking_budget", "start_token_ids": [2**31 - 1] * DEFAULT_LIMITS.max_token_ids,
               "end_token_ids": [2**31 - 1] * DEFAULT_LIMITS.max_token_ids, "budget": 1}] * DEFAULT_LIMITS.max_entries
    assert len(json.dumps(widest, indent=1)) < bound  # the bound leaves room for the widest payload, spaced
    with pytest.raises(SpecError, match=rf"JSON text of {bound + 1} characters is longer than .*\({bound}\)"):
        validate(sp("x" * (bound + 1)))  # not JSON either: the size is what is reported


# -- trust: who may send which kinds ------------------------------------------------------------
def test_by_default_a_client_may_send_no_kind_in_text(allow, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUEST_KINDS_ENV, raising=False)
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]\.kind: kind 'forced_sequence' is not allowed .*\(allowed: \[\]\)"):
        validate(sp(text(FORCED)))
    validate(sp(FORCED))  # a list is the engine owner's (our worker, Dynamo, LLM(...) callers)


def test_the_operator_setting_allows_kinds_and_nothing_else(allow) -> None:
    allow("forced_sequence, banned_tokens")
    validate(sp(text(FORCED + [{"kind": "banned_tokens", "token_ids": [9]}])))
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]\.kind: kind 'logit_bias' is not allowed"):
        validate(sp(text([{"kind": "logit_bias", "bias": {"3": 1.0}}])))


def test_python_is_never_accepted_from_a_client_even_with_its_factory_allow_listed(allow, monkeypatch: pytest.MonkeyPatch) -> None:
    allow(CLIENT_KINDS)
    monkeypatch.setenv("DYN_LOGITS_PYTHON_FACTORIES", "os:system")
    entry = [{"kind": "python", "factory": "os:system", "kwargs": {}}]
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]\.kind: kind 'python' is operator-only"):
        validate(sp(text(entry)))
    request = realize_request(sp(text(entry)), vocab_size=VOCAB)  # the engine refuses it too, never imports it
    assert request is not None and request.failed and request.processor is None


@pytest.mark.parametrize(("kinds", "rule"), [
    ("python", r"kind 'python' runs code on workers and may never be allowed in requests"),
    ("forced_sequence,nope", r"unknown kind 'nope'"),
    ("forced_text", r"kind 'forced_text' is resolved with the engine's tokenizer, only when the engine is the spec source"),
])
def test_a_bad_operator_setting_stops_the_engine_at_start_naming_it(allow, vllm_config: Any, kinds: str, rule: str) -> None:
    allow(kinds)
    with pytest.raises(SpecError, match=rf"^{REQUEST_KINDS_ENV}: {rule}"):
        DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)


# -- in the engine ----------------------------------------------------------------------------------
def test_the_engine_realizes_allowed_text_and_fail_stops_text_it_refuses(allow) -> None:
    allow("forced_sequence")
    request = realize_request(sp(text(FORCED)), vocab_size=VOCAB)
    assert request is not None and not request.failed
    row = torch.zeros(VOCAB)
    assert int(request([], row).argmax()) == 5
    refused = realize_request(sp(text([{"kind": "banned_tokens", "token_ids": [3]}]), ), vocab_size=VOCAB)
    assert refused is not None and refused.failed and "not allowed" in str(refused.error)


def test_an_arrival_counts_only_beside_a_payload_the_worker_wrote(allow) -> None:
    """``extra_args[ARRIVAL_KEY]`` sets a ``deadline``'s clock beside a list payload (the worker's
    activation writes both); beside text (a client's ``vllm_xargs``), or with the engine as the spec
    source, it is ignored: the request counts from its realization."""
    allow("deadline")
    deadline = [{"kind": "deadline", "seconds": 60}]
    long_ago = time.time() - 3600.0

    class EngineSource:  # the engine as the spec source (VllmEngineSpec's role): extra_args are the client's
        limits = DEFAULT_LIMITS

        def payload_for(self, params: Any) -> list[dict[str, Any]]:
            return deadline

    for carried, source, forced in ((deadline, None, True), (text(deadline), None, False),
                                    (deadline, EngineSource(), False)):
        params = SamplingParams(stop_token_ids=[2], extra_args={WIRE_KEY: carried, ARRIVAL_KEY: long_ago})
        request = realize_request(params, vocab_size=VOCAB, engine_spec=source)
        assert request is not None and not request.failed
        row = request([], torch.zeros(VOCAB))
        assert (torch.isfinite(row).nonzero().flatten().tolist() == [2]) is forced, (carried, source)


def test_a_prefill_for_a_remote_decode_worker_runs_no_client_text(allow) -> None:
    allow("forced_sequence")
    prefill = sp(text(FORCED), kv_transfer_params={"do_remote_decode": True})
    assert realize_request(prefill, vocab_size=VOCAB) is None
    decode = sp(text(FORCED), kv_transfer_params={"do_remote_prefill": True})
    assert realize_request(decode, vocab_size=VOCAB) is not None


def test_with_the_engine_as_source_text_is_held_to_the_config_and_the_setting(
        allow, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, embedded_tokenizer: Any) -> None:
    """``DYN_LOGITS_SPEC_SOURCE=engine``: the config's ``allow_request_kinds`` plus the setting; text
    ``forced_text`` is resolved with the engine's tokenizer."""
    from dynlogits.adapters.vllm.engine_spec import VllmEngineSpec
    from dynlogits.policy.engine_spec import resolve_engine_spec
    from dynlogits.policy.roles import DisaggregationMode

    config = tmp_path / "logits.yaml"
    config.write_text(yaml.safe_dump({"allow_request_kinds": ["forced_text"]}))
    monkeypatch.setenv(SPEC_SOURCE_ENV, "engine")
    monkeypatch.setenv("DYN_LOGITS_SPEC", str(config))
    allow("banned_tokens")
    hello = text([{"kind": "forced_text", "text": "Hello"}])
    validate(sp(hello))
    validate(sp(text([{"kind": "banned_tokens", "token_ids": [3]}])))
    with pytest.raises(SpecError, match=r"extra_args\.dynamo_logits\[0\]\.kind: kind 'logit_bias' is not allowed"):
        validate(sp(text([{"kind": "logit_bias", "bias": {"3": 1.0}}])))
    spec = resolve_engine_spec(DisaggregationMode.AGGREGATED, lambda: embedded_tokenizer, VOCAB)
    assert spec is not None
    payload = VllmEngineSpec(spec).payload_for(sp(hello))
    assert payload == [{"kind": "forced_sequence", "token_ids": embedded_tokenizer.encode("Hello", add_special_tokens=False),
                        "eos_token_id": embedded_tokenizer.eos_token_id}]


# -- the client helper ----------------------------------------------------------------------------
def test_the_helper_writes_text_the_adapter_reads_back(allow) -> None:
    allow("forced_sequence")
    xargs = vllm_xargs(FORCED)
    assert set(xargs) == {WIRE_KEY} and isinstance(xargs[WIRE_KEY], str)
    assert json.loads(xargs[WIRE_KEY]) == FORCED
    validate(SamplingParams(extra_args=xargs))


def test_the_helper_accepts_spec_models_and_refuses_bad_or_operator_only_entries() -> None:
    from dynlogits.specs import ForcedTokenSequenceSpec

    assert json.loads(payload_text([ForcedTokenSequenceSpec(token_ids=(5, 6), eos_token_id=2)])) == FORCED
    with pytest.raises(SpecError, match=r"^dynamo_logits\[0\]\.token_ids\[1\]: must be >= 0"):
        vllm_xargs([{"kind": "forced_sequence", "token_ids": [5, -3], "eos_token_id": 2}])
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]\.kind: kind 'python' is operator-only"):
        vllm_xargs([{"kind": "python", "factory": "os:system", "kwargs": {}}])


def test_the_helper_imports_neither_torch_nor_an_engine() -> None:
    code = ("import sys, dynlogits.client; "
            "print(sorted(m for m in ('torch', 'vllm', 'sglang', 'tensorrt_llm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
