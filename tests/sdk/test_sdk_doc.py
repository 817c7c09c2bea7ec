"""docs/sdk.md's backends, built from the doc's own snippets, pass the conformance kit: the toy
backend and the per-request numpy backend (llama-cpp-python's calling convention); and the kit
catches each kind of broken adapter (mutants of the toy), so its passes mean something."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from dynlogits import sdk
from dynlogits.testing import CHECKS, KIT_VOCAB_SIZE, drivers_for, run_check, run_conformance

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "sdk.md"


TOY_SECTION = "## From zero: a toy backend"
NUMPY_SECTION = "## Engines that call one processor per request, on numpy arrays"


def _section_source(heading: str, min_blocks: int) -> str:
    """The ``python`` snippets of one section of the doc, in order, as one module."""
    text = DOC.read_text()
    assert f"\n{heading}\n" in text, f"docs/sdk.md lost its section {heading!r}"
    section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= min_blocks, f"the section {heading!r} lost its snippets"
    return "\n\n".join(blocks)


def _toy_source() -> str:
    return _section_source(TOY_SECTION, 4)


def _import_from(folder: Path, name: str):  # noqa: ANN202 - a generator fixture body
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("toy")
    (folder / "toy_backend.py").write_text(_toy_source())
    return folder


@pytest.fixture(scope="module")
def toy(toy_dir: Path) -> ModuleType:
    yield from _import_from(toy_dir, "toy_backend")


@pytest.fixture(scope="module")
def numpy_backend(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    folder = tmp_path_factory.mktemp("numpy_backend")
    (folder / "numpy_backend.py").write_text(_section_source(NUMPY_SECTION, 3))
    yield from _import_from(folder, "numpy_backend")


def _outcome(driver_factory, check_name: str):
    check = next(c for c in CHECKS if c.name == check_name)
    return run_check(check, drivers_for(driver_factory)[0])


def test_the_docs_toy_backend_passes_every_check(toy: ModuleType) -> None:
    out = StringIO()
    assert run_conformance("toy_backend:drivers", out) == 0, out.getvalue()
    # The toy reads no engine object per step: the engine-read check (opt-in) skips.
    assert f"{len(CHECKS) - 1} passed, 0 failed, 1 skipped" in out.getvalue()


def test_the_command_runs_a_third_party_driver_by_import_string(toy_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_dir), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "conformance", "toy_backend:drivers"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("adapter toy_backend:drivers / driver toy: the toy engine")
    assert sum(line.startswith("PASSED  toy :: ") for line in lines) == len(CHECKS) - 1
    assert lines[-1] == f"{len(CHECKS) - 1} passed, 0 failed, 1 skipped"


def test_the_command_fails_for_an_unknown_adapter() -> None:
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "conformance", "nope"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown adapter 'nope'" in proc.stderr


def test_the_toy_activation_drops_a_smuggled_payload_and_arrival(toy: ModuleType) -> None:
    from dynlogits.policy.roles import DisaggregationMode
    from dynlogits.specs import ARRIVAL_KEY, parse_spec

    smuggled = {sdk.WIRE_KEY: [{"kind": "x"}], ARRIVAL_KEY: 1e12, "a": 1}
    req = toy.make_request([1, 2], None, DisaggregationMode.AGGREGATED, client_params=smuggled, arrival_time=5.0)
    assert req.params == {"a": 1}
    spec = parse_spec({"entries": [{"kind": "banned_tokens", "token_ids": [3]}]})
    req = toy.make_request([1, 2], spec, DisaggregationMode.AGGREGATED, client_params=smuggled, arrival_time=5.0)
    assert req.params == {sdk.WIRE_KEY: [{"kind": "banned_tokens", "token_ids": [3]}], ARRIVAL_KEY: 5.0, "a": 1}


# -- mutants: each breaks one duty, and the kit must say which ----------------------------------
def _mutant(toy: ModuleType, **overrides):
    adapter_cls = type("MutantAdapter", (toy.ToyAdapter,), overrides.pop("adapter", {}))
    driver_attrs = {"__init__": lambda self, vocab_size: (toy.ToyDriver.__init__(self, vocab_size),
                                                          setattr(self, "adapter", adapter_cls(vocab_size)))[0]}
    driver_attrs.update(overrides)
    driver_cls = type("MutantDriver", (toy.ToyDriver,), driver_attrs)
    return lambda vocab_size: [driver_cls(vocab_size)]


def test_the_kit_catches_rows_given_to_the_wrong_request(toy: ModuleType) -> None:
    def apply(self, logits, batch):  # applies requests in admission order, not by row
        items = list(self.active.values())
        sdk.apply_rows(logits, list(range(len(items))), [g for g, _ in items],
                       [r.tokens[len(r.prompt):] for _, r in items])
        return logits

    outcome = _outcome(_mutant(toy, adapter={"apply": apply}), "rows_follow_their_requests_when_the_batch_changes")
    assert outcome.status == "failed"


def test_the_kit_catches_state_kept_after_a_request_ends(toy: ModuleType) -> None:
    outcome = _outcome(_mutant(toy, adapter={"remove": lambda self, req_id: None}), "no_state_is_left_after_requests_end")
    assert outcome.status == "failed" and "still holds state for 3" in outcome.detail


def test_the_kit_catches_an_exception_escaping_the_sampler(toy: ModuleType) -> None:
    def apply(self, logits, batch):  # no isolation: calls the raw processors
        for row, req_id in enumerate(batch):
            if req_id in self.active:
                guarded, request = self.active[req_id]
                guarded.processor(request.tokens[len(request.prompt):], logits[row])
        return logits

    outcome = _outcome(_mutant(toy, adapter={"apply": apply}), "a_raising_processor_fails_only_its_request")
    assert outcome.status == "failed" and "injected fault" in outcome.detail


def test_the_kit_catches_activation_on_a_prefill_worker(toy: ModuleType) -> None:
    def activate(self, spec, role):  # ignores the role
        return sdk.encode_payload(spec.entries) if spec else None

    outcome = _outcome(_mutant(toy, activate=activate), "prefill_and_encode_workers_activate_nothing")
    assert outcome.status == "failed" and "prefill worker activated" in outcome.detail


def test_the_kit_catches_histories_that_include_the_prompt(toy: ModuleType) -> None:
    def apply(self, logits, batch):
        rows = [i for i, q in enumerate(batch) if q in self.active]
        sdk.apply_rows(logits, rows, [self.active[batch[i]][0] for i in rows],
                       [self.active[batch[i]][1].tokens for i in rows])
        return logits

    outcome = _outcome(_mutant(toy, adapter={"apply": apply}), "state_is_fresh_per_request")
    assert outcome.status == "failed"


def test_the_kit_catches_an_admission_that_lets_bad_payloads_in(toy: ModuleType) -> None:
    outcome = _outcome(_mutant(toy, admit=lambda self, payload: None), "invalid_vectors_are_rejected_naming_the_field")
    assert outcome.status == "failed" and "admitted, expected" in outcome.detail


def test_the_kit_catches_a_processor_that_ignores_the_payload_order(toy: ModuleType) -> None:
    def add(self, req_id, request, eos_token_id):  # realizes the entries in reverse order
        payload = request.params.get(sdk.WIRE_KEY)
        request.params = {sdk.WIRE_KEY: list(reversed(payload))} if payload else request.params
        toy.ToyAdapter.add(self, req_id, request, eos_token_id)

    outcome = _outcome(_mutant(toy, adapter={"add": add}), "valid_vectors_behave_as_documented")
    assert outcome.status == "failed"


def test_the_kit_catches_an_adapter_that_does_not_tell_factories_the_request_facts(toy: ModuleType) -> None:
    def add(self, req_id, request, eos_token_id):  # realizes without the facts
        guarded = sdk.realize(request.params.get(sdk.WIRE_KEY), vocab_size=self.vocab_size,
                              stop_token_id=eos_token_id, report=self.failures.append)
        if guarded is not None:
            self.active[req_id] = (guarded, request)

    outcome = _outcome(_mutant(toy, adapter={"add": add}), "a_plugin_factory_is_given_the_request_facts")
    assert outcome.status == "failed"


# -- the per-request numpy backend (llama-cpp-python's calling convention) ------------------------
def test_the_docs_numpy_backend_passes_every_check(numpy_backend: ModuleType) -> None:
    out = StringIO()
    assert run_conformance("numpy_backend:drivers", out) == 0, out.getvalue()
    assert out.getvalue().splitlines()[-1] == f"{len(CHECKS) - 1} passed, 0 failed, 1 skipped"


def _forcing_processor(numpy_backend: ModuleType, token_ids=(5, 6, 7), prompt=(3, 4)):
    adapter = numpy_backend.NumpyAdapter(16)
    payload = [{"kind": "forced_sequence", "token_ids": list(token_ids), "eos_token_id": 1}]
    [processor] = adapter.processors_for({sdk.WIRE_KEY: payload}, list(prompt), eos_token_id=1)
    return processor, adapter


def _forced_row(token: int, width: int = 16) -> np.ndarray:
    row = np.full(width, -np.inf, dtype=np.float32)
    row[token] = 0.0
    return row


def test_the_numpy_processor_edits_the_engines_row_in_place(numpy_backend: ModuleType) -> None:
    processor, _ = _forcing_processor(numpy_backend)
    matrix = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)  # the engine's scores
    scores = matrix[-1, :]
    out = processor(np.array([3, 4, 5], dtype=np.intc), scores)  # prompt (3, 4), then 5 generated
    assert out is scores and np.shares_memory(out, matrix)
    np.testing.assert_array_equal(matrix[-1], _forced_row(6))  # position 1: the prompt is not history


@pytest.mark.parametrize("layout", ["read-only", "strided", "reversed", "float64"])
def test_the_numpy_processor_copies_scores_it_cannot_share(numpy_backend: ModuleType, layout: str) -> None:
    processor, adapter = _forcing_processor(numpy_backend)
    base = np.random.default_rng(1).standard_normal(32).astype(np.float32)
    scores = {
        "read-only": base[:16].copy(),
        "strided": base[::2],
        "reversed": base[::-1][:16],
        "float64": base[:16].astype(np.float64),
    }[layout]
    if layout == "read-only":
        scores.flags.writeable = False
    before = scores.copy()
    out = processor(np.array([3, 4], dtype=np.intc), scores)
    assert out is not scores and out.dtype == scores.dtype and out.shape == (16,)
    np.testing.assert_array_equal(out, _forced_row(5).astype(scores.dtype))
    np.testing.assert_array_equal(scores, before)  # the engine's array is only replaced by the result
    assert adapter.failures == []


def test_the_numpy_driver_holds_state_only_through_the_engines_processor_lists(numpy_backend: ModuleType) -> None:
    driver = numpy_backend.drivers(16)[0]
    forced = [{"kind": "forced_sequence", "token_ids": [5], "eos_token_id": 1}]
    driver.add("with", forced, prompt_ids=[3], eos_token_id=1)
    driver.add("without", None, prompt_ids=[3], eos_token_id=1)
    assert driver.held_requests() == 1
    logits = torch.zeros(2, 16)
    assert driver.step(["with", "without"], logits) is logits
    assert logits[0].tolist() == _forced_row(5).tolist() and logits[1].tolist() == [0.0] * 16
    driver.remove("with")
    assert driver.held_requests() == 0


def test_the_kit_catches_a_numpy_processor_that_counts_the_prompt(numpy_backend: ModuleType) -> None:
    class PromptCounting(numpy_backend.NumpyProcessor):
        def __init__(self, guarded, prompt_len):
            super().__init__(guarded, 0)  # forgets the prompt length: history = all of input_ids

    class Adapter(numpy_backend.NumpyAdapter):
        def processors_for(self, params, prompt_ids, eos_token_id, **facts):
            return [PromptCounting(p.guarded, p.prompt_len)
                    for p in super().processors_for(params, prompt_ids, eos_token_id, **facts)]

    class Driver(numpy_backend.NumpyDriver):
        def __init__(self, vocab_size):
            super().__init__(vocab_size)
            self.adapter = Adapter(vocab_size)

    outcome = _outcome(lambda vocab_size: [Driver(vocab_size)], "state_is_fresh_per_request")
    assert outcome.status == "failed"


def test_the_kit_steps_drivers_with_fresh_cpu_float32_contiguous_logits(numpy_backend: ModuleType) -> None:
    """What docs/sdk.md and the driver protocol promise ``step`` receives, and the numpy driver relies on."""
    seen: list[torch.Tensor] = []

    class Checking(numpy_backend.NumpyDriver):
        def step(self, batch, logits):
            assert logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous()
            assert tuple(logits.shape) == (len(batch), self.vocab_size)
            assert all(logits.data_ptr() != s.data_ptr() for s in seen), "a tensor reused across steps"
            seen.append(logits)
            return super().step(batch, logits)

    for check in CHECKS:
        seen.clear()
        outcome = run_check(check, Checking(KIT_VOCAB_SIZE))
        assert outcome.status == "passed" or (outcome.status == "skipped" and "break_engine_reads" in outcome.detail), \
            f"{check.name}: {outcome.detail}"
