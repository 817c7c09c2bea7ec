"""The SGLang adapter on both SGLang versions it is proven on, each with its real classes: 0.5.23 (this
environment's) and 0.5.21 (the version NVIDIA Dynamo 1.6.1 pins), which ``scripts/setup-env.sh``
installs beside it in ``$VENV/sglang-0.5.21``. The adapter tests, the worker's request-building tests
and the conformance kit (inside ``test_sglang_adapter.py``) run again in a subprocess with that folder
first on ``PYTHONPATH``."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynlogits.adapters.sglang.compat import sglang_version

pytestmark = pytest.mark.heavy  # a whole subprocess run or build: make test-fast leaves it out

SIDE_VERSION = "0.5.21"
SIDE_DIR = Path(sys.prefix) / f"sglang-{SIDE_VERSION}"
#: Set by the subprocess run: the SGLang version its tests must be importing.
EXPECTED_ENV = "DYNLOGITS_EXPECT_SGLANG_VERSION"

HERE = Path(__file__).resolve().parent


def test_the_sglang_these_tests_import_is_the_one_this_run_expects():
    expected = os.environ.get(EXPECTED_ENV) or importlib.metadata.version("sglang")
    assert sglang_version() == expected


def test_the_adapter_tests_and_the_kit_pass_on_sglang_0_5_21_too():
    assert (SIDE_DIR / "sglang" / "version.py").is_file(), f"{SIDE_DIR} is missing: run scripts/setup-env.sh"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SIDE_DIR), *filter(None, [env.get("PYTHONPATH")])])
    env[EXPECTED_ENV] = SIDE_VERSION
    tests = [str(HERE / "test_sglang_adapter.py"), str(HERE / "test_sglang_worker.py"),
             f"{HERE / Path(__file__).name}::test_the_sglang_these_tests_import_is_the_one_this_run_expects"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                           "not exits_with_a_clear_message", *tests],
                          cwd=HERE.parents[2], env=env, capture_output=True, text=True, timeout=900)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in summary and not any(word in summary for word in ("failed", "skipped", "error")), summary
