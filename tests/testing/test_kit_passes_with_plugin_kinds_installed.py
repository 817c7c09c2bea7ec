"""The conformance kit passes every shipped adapter whatever third-party kinds are installed.

An installed kind joins the wire union, so the rule of an unknown kind lists it too
(``... 'python', 'echo_kp')``); the kit must not read that as a wrong error. A real distribution
(``echo-kp``, publishing the kind ``echo_kp`` in the entry-point group ``dynlogits.processors``) is
pip-installed into a folder of its own that only the subprocesses started here see on
``PYTHONPATH``, so nothing leaks into other tests.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_dist import install_plugin

from dynlogits import sdk
from dynlogits.testing import CHECKS, KIT_VOCAB_SIZE, SHIPPED, run_check

pytestmark = pytest.mark.heavy  # a whole subprocess run: make test-fast leaves it out

ROOT = Path(__file__).resolve().parents[2]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "echo-kp"
version = "0.1.0"

[project.entry-points."dynlogits.processors"]
echo_kp = "echo_kp.kinds:ECHO_KP"

[tool.setuptools]
packages = ["echo_kp"]
"""

KINDS = '''\
"""The kind's declaration: pydantic only, never torch."""
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dynlogits.specs.kinds import ProcessorKind


class EchoSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["echo_kp"] = "echo_kp"


ECHO_KP = ProcessorKind("echo_kp", EchoSpec, "echo_kp.processors:make_echo")
'''

PROCESSORS = '''\
def make_echo(entry, ctx):
    return lambda generated_ids, logits: None
'''

#: Engines a shipped adapter's drivers need installed (the others run harnesses on torch alone).
NEEDS = {"vllm": "vllm", "transformers": "transformers", "sglang": "sglang"}


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``echo-kp`` installed (a dist-info with ``entry_points.txt``) into a folder of its own."""
    return install_plugin(tmp_path_factory.mktemp("echo-kp-src"), tmp_path_factory.mktemp("echo-kp-site"), "echo_kp",
                          PYPROJECT, {"kinds.py": KINDS, "processors.py": PROCESSORS})


def _run(site: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


def test_the_plugin_kind_is_installed_and_joins_the_unknown_kind_rule(plugin_site: Path) -> None:
    """The set-up is real: the subprocesses see the kind through importlib.metadata, and the golden
    ``unknown_kind`` vector's message then lists it (what used to fail the kit)."""
    code = (
        "from dynlogits.specs import SpecError, decode_wire_payload, kinds\n"
        "print(sorted(kinds.installed_kinds()))\n"
        "try:\n"
        "    decode_wire_payload([{'kind': 'temperature'}])\n"
        "except SpecError as err:\n"
        "    print(err)\n"
    )
    proc = _run(plugin_site, "-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    installed, message = proc.stdout.splitlines()
    assert installed == "['echo_kp']"
    assert message.endswith("'python', 'echo_kp')"), message


@pytest.mark.parametrize("adapter", sorted(SHIPPED))
def test_the_kit_passes_every_shipped_adapter_with_a_plugin_kind_installed(plugin_site: Path, adapter: str) -> None:
    if adapter in NEEDS and importlib.util.find_spec(NEEDS[adapter]) is None:
        pytest.skip(f"{NEEDS[adapter]} is not installed")
    proc = _run(plugin_site, "-m", "dynlogits.tools.cli", "conformance", adapter)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    drivers = sum(line.startswith(f"adapter {adapter} / driver ") for line in lines)
    skipped = [line for line in lines if line.startswith("SKIPPED")]
    assert all(":: a_failed_engine_read_fails_only_its_request" in line for line in skipped), skipped
    want = f"{drivers * len(CHECKS) - len(skipped)} passed, 0 failed" + (f", {len(skipped)} skipped" if skipped else "")
    assert drivers >= 1 and lines[-1] == want, proc.stdout
    assert sum(":: invalid_vectors_are_rejected_naming_the_field" in line and line.startswith("PASSED")
               for line in lines) == drivers


# -- the kit stays strict about the rule itself ---------------------------------------------------
class _RewritingAdmission:
    """Only what the invalid-vector check uses: admission through the SDK, its message rewritten."""

    name = "rewriting"
    exercised = "admission only"
    vocab_size = KIT_VOCAB_SIZE
    releases_on_finish = True

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def admit(self, payload) -> None:
        try:
            sdk.validate(payload)
        except sdk.SpecError as err:
            raise ValueError(str(err).replace(self.old, self.new)) from None


def _invalid_vectors_outcome(old: str, new: str):
    check = next(c for c in CHECKS if c.name == "invalid_vectors_are_rejected_naming_the_field")
    return run_check(check, _RewritingAdmission(old, new))


@pytest.mark.parametrize(("old", "new", "why"), [
    ("'python')", "'python', 'no_such_kind')", "a kind that is neither built in nor in force"),
    ("'min_tokens', ", "", "a built-in kind left out"),
    ("unknown kind 'temperature'", "unknown kind 'temp'", "another rule"),
    ("dynamo_logits[1]: unknown kind", "dynamo_logits[0]: unknown kind", "another path"),
])
def test_the_kit_still_fails_a_wrong_list_of_kinds(old: str, new: str, why: str) -> None:
    outcome = _invalid_vectors_outcome(old, new)
    assert outcome.status == "failed" and "unknown_kind.json" in outcome.detail, why


def test_the_kit_accepts_the_list_of_kinds_unchanged() -> None:
    assert _invalid_vectors_outcome("", "").status == "passed"
