"""Every adapter this project ships passes the conformance kit, from pytest and from the command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dynlogits.testing import CHECKS, SHIPPED, drivers_for, resolve, run_check


def _drivers(adapter: str):
    # SGLang through its adapter's CPU import shim (a plain `import sglang` patches transformers process-wide);
    # TensorRT-LLM is optional to its adapter.
    pytest.importorskip({"sglang": "dynlogits.adapters.sglang.conformance", "trtllm": "torch"}.get(adapter, adapter))
    return drivers_for(resolve(adapter))


#: Adapters that read engine objects at every step (SGLang's ``Req``, TensorRT-LLM's request
#: state): their drivers must opt in to the engine-read check; the others read only what the engine
#: hands them (vLLM's BatchUpdate and token lists, transformers' ``input_ids``) and skip it.
READ_ENGINE_OBJECTS = {"sglang", "trtllm"}
ENGINE_READ_CHECK = "a_failed_engine_read_fails_only_its_request"


@pytest.mark.parametrize("adapter", sorted(SHIPPED))
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
def test_shipped_adapter_passes_check(adapter: str, check) -> None:
    skips = check.name == ENGINE_READ_CHECK and adapter not in READ_ENGINE_OBJECTS
    for driver in _drivers(adapter):
        outcome = run_check(check, driver)
        assert outcome.status == ("skipped" if skips else "passed"), f"{driver.name}: {outcome.status}: {outcome.detail}"


@pytest.mark.heavy  # runs the kit's command in a subprocess
def test_conformance_command_passes_for_vllm_and_names_the_engine_classes() -> None:
    pytest.importorskip("vllm")
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "conformance", "vllm"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("adapter vllm / driver vllm-v1: vLLM") and "real VllmConfig" in line for line in lines)
    assert any(line.startswith("adapter vllm / driver vllm-v2: vLLM") and "harness" in line for line in lines)
    # Neither vLLM driver reads engine objects per step, so the engine-read check skips on both.
    assert lines[-1] == f"{2 * (len(CHECKS) - 1)} passed, 0 failed, 2 skipped"
