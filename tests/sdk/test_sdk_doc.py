"""docs/sdk.md's toy backend, built from the doc's own snippets, passes the conformance kit; and
the kit catches each kind of broken adapter (mutants of that toy), so its passes mean something."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path
from types import ModuleType

import pytest

from dynlogits import sdk
from dynlogits.testing import CHECKS, drivers_for, run_check, run_conformance

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "sdk.md"


def _toy_source() -> str:
    text = DOC.read_text()
    section = text.split("## From zero: a toy backend", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 4, "the toy backend section lost its snippets"
    return "\n\n".join(blocks)


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("toy")
    (folder / "toy_backend.py").write_text(_toy_source())
    return folder


@pytest.fixture(scope="module")
def toy(toy_dir: Path) -> ModuleType:
    sys.path.insert(0, str(toy_dir))
    try:
        yield importlib.import_module("toy_backend")
    finally:
        sys.path.remove(str(toy_dir))
        sys.modules.pop("toy_backend", None)


def _outcome(driver_factory, check_name: str):
    check = next(c for c in CHECKS if c.name == check_name)
    return run_check(check, drivers_for(driver_factory)[0])


def test_the_docs_toy_backend_passes_every_check(toy: ModuleType) -> None:
    out = StringIO()
    assert run_conformance("toy_backend:drivers", out) == 0, out.getvalue()
    assert f"{len(CHECKS)} passed, 0 failed" in out.getvalue()


def test_the_command_runs_a_third_party_driver_by_import_string(toy_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_dir), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "dynlogits.cli", "conformance", "toy_backend:drivers"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("adapter toy_backend:drivers / driver toy: the toy engine")
    assert sum(line.startswith("PASSED  toy :: ") for line in lines) == len(CHECKS)
    assert lines[-1] == f"{len(CHECKS)} passed, 0 failed"


def test_the_command_fails_for_an_unknown_adapter() -> None:
    proc = subprocess.run([sys.executable, "-m", "dynlogits.cli", "conformance", "nope"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown adapter 'nope'" in proc.stderr


def test_the_toy_activation_drops_a_smuggled_payload(toy: ModuleType) -> None:
    from dynlogits.roles import DisaggregationMode

    req = toy.make_request([1, 2], None, DisaggregationMode.AGGREGATED, client_params={sdk.WIRE_KEY: [{"kind": "x"}], "a": 1})
    assert req.params == {"a": 1}


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
