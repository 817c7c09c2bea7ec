"""The embedded default model: tokenizer, config, weights, caching and atomic writes.

No engine starts here (engine test modules load the model); shapes are read from the
safetensors header so the 151936-wide model is never loaded into memory.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dynlogits import model_builder
from dynlogits.model_builder import build_model, default_model_dir

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from the safetensors header alone."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return {name: meta["shape"] for name, meta in header.items() if name != "__metadata__"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("default") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("text", [
    "Hello world!", "Hello world !", "yes", " no.", "  two  spaces\n\ttab and newline\n",
    "café naïve 🙂 你好 Привет", "{\"key\": [1, 2, 3]}", "a rare word: zyzzyva",
])
def test_tokenizer_round_trips_text_exactly(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_tokenizer_encodes_common_words_as_single_tokens(tokenizer: Any) -> None:
    for word in ("Hello", " world", " the", " yes", " no"):
        assert len(tokenizer.encode(word, add_special_tokens=False)) == 1, word


def test_special_tokens_agree_across_tokenizer_config_and_generation_config(model_dir: Path, tokenizer: Any) -> None:
    tok_config = _json(model_dir / "tokenizer_config.json")
    config = _json(model_dir / "config.json")
    gen_config = _json(model_dir / "generation_config.json")
    assert (tok_config["bos_token"], tok_config["eos_token"]) == (model_builder.BOS, model_builder.EOS)
    bos, eos = tokenizer.convert_tokens_to_ids([model_builder.BOS, model_builder.EOS])
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (bos, eos)
    assert tokenizer.pad_token_id is not None and tokenizer.pad_token_id not in (bos, eos)
    for cfg in (config, gen_config):
        assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (bos, eos)


def test_encoding_with_special_tokens_prepends_bos_once(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello world!")
    assert ids[0] == tokenizer.bos_token_id
    assert ids[1:] == tokenizer.encode("Hello world!", add_special_tokens=False)


def test_default_logits_width_is_padded_past_tokenizer_to_multiple_of_64(model_dir: Path, tokenizer: Any) -> None:
    width = _json(model_dir / "config.json")["vocab_size"]
    assert width > len(tokenizer)
    assert width % 64 == 0
    shapes = _tensor_shapes(model_dir / "model.safetensors")
    assert shapes["model.embed_tokens.weight"] == [width, 64]
    assert shapes["lm_head.weight"] == [width, 64]


def test_config_is_a_small_untied_float32_llama(model_dir: Path) -> None:
    config = _json(model_dir / "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (64, 2, 2)
    assert config["head_dim"] == config["hidden_size"] // config["num_attention_heads"] == 32
    assert config["torch_dtype"] == "float32"
    assert config["tie_word_embeddings"] is False


def test_vocab_size_151936_sets_config_and_weight_shapes(tmp_path: Path) -> None:
    out = build_model(tmp_path / "big", vocab_size=151936)
    assert _json(out / "config.json")["vocab_size"] == 151936
    shapes = _tensor_shapes(out / "model.safetensors")
    assert shapes["model.embed_tokens.weight"] == [151936, 64]
    assert shapes["lm_head.weight"] == [151936, 64]


def test_same_arguments_give_byte_identical_files(tmp_path: Path, model_dir: Path) -> None:
    again = build_model(tmp_path / "again")
    names = sorted(p.name for p in model_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name


def test_other_seed_gives_other_weights_and_same_tokenizer(tmp_path: Path, model_dir: Path) -> None:
    other = build_model(tmp_path / "seed1", seed=1)
    assert (other / "model.safetensors").read_bytes() != (model_dir / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_chat_template_renders_turns_and_generation_prompt(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith(model_builder.BOS)
    assert "system<|end_header_id|>\n\nBe brief." + model_builder.EOS in text
    assert "user<|end_header_id|>\n\nhi" + model_builder.EOS in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert not without.endswith("assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("vocab_size", [10, 0, -64, 262145, True, 1024.0, "1024"])
def test_bad_vocab_size_raises_value_error_naming_vocab_size(tmp_path: Path, vocab_size: Any) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_model(tmp_path / "m", vocab_size=vocab_size)
    assert not (tmp_path / "m").exists()
    assert list(tmp_path.iterdir()) == []  # no temp folder left behind


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, None])
def test_bad_seed_raises_value_error_naming_seed(tmp_path: Path, seed: Any) -> None:
    with pytest.raises(ValueError, match="seed"):
        build_model(tmp_path / "m", seed=seed)


def test_complete_model_with_same_arguments_is_not_rebuilt(tmp_path: Path) -> None:
    out = build_model(tmp_path / "m")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    os.utime(out / "model.safetensors", ns=(1, 1))
    assert build_model(out) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == 1
    assert set(before) == {p.name for p in out.iterdir()}


def test_model_built_with_other_arguments_is_replaced(tmp_path: Path) -> None:
    out = build_model(tmp_path / "m")
    build_model(out, vocab_size=2048)
    assert _json(out / "config.json")["vocab_size"] == 2048
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_incomplete_model_folder_is_rebuilt(tmp_path: Path) -> None:
    out = build_model(tmp_path / "m")
    (out / "model.safetensors").unlink()
    build_model(out)
    assert _tensor_shapes(out / "model.safetensors")["lm_head.weight"][1] == 64


def test_refuses_to_overwrite_a_folder_it_did_not_build(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a dynlogits model folder"):
        build_model(tmp_path / "m")
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"


def test_crash_while_building_leaves_no_model_and_no_temp_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args: Any) -> None:
        raise RuntimeError("simulated crash while writing weights")

    monkeypatch.setattr(model_builder, "_weights", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_model(tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_importing_the_module_does_not_import_heavy_libraries() -> None:
    code = ("import sys, dynlogits.model_builder; "
            "print(sorted(m for m in ('torch', 'tokenizers', 'safetensors', 'transformers', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_default_model_dir_builds_once_and_reports_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DYNLOGITS_MODEL_DIR", str(tmp_path / "cache" / "model"))
    path = default_model_dir()
    assert path == (tmp_path / "cache" / "model").resolve()
    assert "building the embedded default model in" in capsys.readouterr().err
    assert default_model_dir() == path
    assert capsys.readouterr().err == ""
    assert _json(path / "config.json")["vocab_size"] % 64 == 0


def test_concurrent_default_model_dir_calls_build_exactly_once(tmp_path: Path) -> None:
    env = {**os.environ, "DYNLOGITS_MODEL_DIR": str(tmp_path / "model")}
    code = "from dynlogits.model_builder import default_model_dir; print(default_model_dir())"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    assert {out.strip() for out, _ in results} == {str((tmp_path / "model").resolve())}
    assert sum("building the embedded default model" in err for _, err in results) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.lock"]


# --- the reasoning variant ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def reasoning_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("reasoning") / "model", reasoning=True)


def test_the_reasoning_variant_adds_one_token_per_think_tag_and_keeps_every_other_id(
        reasoning_dir: Path, model_dir: Path, tokenizer: Any) -> None:
    reasoning = transformers.AutoTokenizer.from_pretrained(reasoning_dir)
    start, end = (reasoning.encode(t, add_special_tokens=False) for t in ("<think>", "</think>"))
    assert len(start) == 1 and len(end) == 1 and start[0] >= len(tokenizer) and end[0] >= len(tokenizer)
    text = "Hello world! <think>a thought</think> The answer is 42."
    assert reasoning.decode(reasoning.encode(text, add_special_tokens=False), skip_special_tokens=True) == text
    plain = "Hello world! The answer is 42."
    assert reasoning.encode(plain) == tokenizer.encode(plain)
    assert _json(reasoning_dir / "config.json")["vocab_size"] == _json(model_dir / "config.json")["vocab_size"]
    assert (reasoning_dir / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()


def test_the_reasoning_variants_template_opens_a_span_at_the_end_of_the_generation_prompt(reasoning_dir: Path) -> None:
    """DeepSeek-R1 style: generation starts inside ``<think>``; an earlier answer's reasoning is dropped."""
    reasoning = transformers.AutoTokenizer.from_pretrained(reasoning_dir)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>hmm</think>Hello."},
                {"role": "user", "content": "and?"}]
    text = reasoning.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n<think>\n")
    assert "assistant<|end_header_id|>\n\nHello." + model_builder.EOS in text and "hmm" not in text


def test_a_model_declares_its_default_reasoning_delimiters_in_a_file(reasoning_dir: Path, model_dir: Path,
                                                                     tmp_path: Path) -> None:
    assert model_builder.model_reasoning(reasoning_dir) == {"start_text": "<think>", "end_text": "</think>"}
    assert model_builder.model_reasoning(model_dir) is None  # the default model declares none
    assert model_builder.model_reasoning("org/hub-name") is None
    (tmp_path / model_builder.REASONING_FILE).write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        model_builder.model_reasoning(tmp_path)


def test_the_reasoning_variant_and_the_default_model_are_not_mistaken_for_each_other(tmp_path: Path) -> None:
    out = build_model(tmp_path / "m", reasoning=True)
    assert build_model(out) == out and model_builder.model_reasoning(out) is None  # rebuilt as the default
    assert model_builder.model_reasoning(build_model(out, reasoning=True)) is not None
