"""The `dynlogits` command: validate (golden vectors, configs), schema, make-model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dynlogits.specs.schema import golden_vectors, payload_schema, spec_schema

SPECS_DIR = Path(__file__).resolve().parents[2] / "specs"
VECTORS = golden_vectors()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dynlogits", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("name", "vector"), VECTORS, ids=[n for n, _ in VECTORS])
def test_validate_prints_what_each_golden_vector_says(name, vector):
    result = run_cli("validate", str(SPECS_DIR / "golden" / name))
    if vector["valid"]:
        assert result.returncode == 0 and result.stdout.startswith("ok:"), result.stdout + result.stderr
    else:
        assert result.returncode == 1
        assert result.stdout.splitlines() == vector["errors"]


def test_validate_reads_config_files(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("entries: [{kind: forced_text, text: Hi}, {kind: banned_tokens, token_ids: [3]}]\n")
    result = run_cli("validate", str(good))
    assert (result.returncode, result.stdout.strip()) == (0, "ok: 2 entries (forced_text, banned_tokens)")
    bad = tmp_path / "bad.yaml"
    bad.write_text("entries: [{kind: logit_bias, bias: {'7': .nan}}]\n")
    result = run_cli("validate", str(bad))
    assert (result.returncode, result.stdout.strip()) == (1, 'bad.yaml: entries[0].bias["7"]: must be a finite number')


@pytest.mark.parametrize(("flag", "build"), [((), payload_schema), (("--spec",), spec_schema)])
def test_schema_prints_the_generated_schema(flag, build):
    result = run_cli("schema", *flag)
    assert result.returncode == 0 and json.loads(result.stdout) == build()


def test_make_model_builds_a_loadable_model_folder(tmp_path):
    result = run_cli("make-model", str(tmp_path / "m"), "--vocab-size", "4096")
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["vocab_size"] == 4096 and config["architectures"] == ["LlamaForCausalLM"]


def test_make_model_builds_the_reasoning_variant_on_request(tmp_path):
    result = run_cli("make-model", str(tmp_path / "m"), "--reasoning")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "m" / "dynlogits_reasoning.json").read_text())["start_text"] == "<think>"


def test_make_model_rejects_a_bad_vocab_size(tmp_path):
    result = run_cli("make-model", str(tmp_path / "m"), "--vocab-size", "3")
    assert result.returncode == 2 and "vocab_size" in result.stderr
