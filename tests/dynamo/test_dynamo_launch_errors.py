"""``--runtime`` option errors of the launch scripts: each exits non-zero with a message saying why
and what to use instead, before starting anything."""

from __future__ import annotations

import os
import subprocess

import pytest
from dynamo_helpers import ROOT


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / "launch" / script), "--port", "18999", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "DYN_READY_TIMEOUT": "5"})


def test_disagg_on_dynamo_says_nixl_is_missing_and_what_to_use_instead() -> None:
    out = run_script("disagg.sh", "--runtime", "dynamo")
    assert out.returncode == 3
    assert "NIXL" in out.stderr and "needs CUDA" in out.stderr
    assert "Use instead: launch/agg.sh --runtime dynamo" in out.stderr and "launch/disagg.sh (embedded runtime" in out.stderr
    assert "started" not in out.stderr  # nothing was started


@pytest.mark.parametrize(("args", "message"), [
    (["--runtime", "vllm"], "--runtime must be 'embedded' or 'dynamo', got 'vllm'"),
    (["--workers", "2"], "--workers needs --runtime dynamo"),
    (["--runtime", "dynamo", "--workers", "0"], "--workers must be a positive integer, got '0'"),
    (["--runtime", "dynamo", "--allow-request-kinds", "forced_text"], "put allow_request_kinds in the --logits-spec file"),
    (["--runtime", "dynamo", "--logits-spec", "/nonexistent.yaml"], "--logits-spec /nonexistent.yaml: cannot read it"),
])
def test_bad_runtime_options_are_refused_with_the_rule(args: list[str], message: str) -> None:
    out = run_script("agg.sh", *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "started" not in out.stderr


def test_help_lists_the_runtime_option() -> None:
    out = run_script("agg.sh", "--help")
    assert out.returncode == 0
    assert "--runtime embedded|dynamo" in out.stdout and "--workers N" in out.stdout
