"""``dynlogits watermark detect``: one JSON line with vLLM's detector's p-value for the same ids; the
key from ``--key`` or ``--key-env``, never printed; ``--text`` tokenized with ``--model``'s tokenizer."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dynlogits.processors.watermark import WatermarkProcessor
from dynlogits.processors.watermark_detect import detect
from dynlogits.tools.cli import main

KEY = 16_045_690_984_833_335_023


def _watermarked(n: int = 120, vocab: int = 1000) -> list[int]:
    processor = WatermarkProcessor(KEY, 4, temperature=1.0)
    gen = torch.Generator().manual_seed(9)
    out: list[int] = []
    for _ in range(n):
        row = torch.randn(vocab, generator=gen)
        processor(out, row)
        out.append(int(torch.argmax(row)))
    return out


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_it_prints_vllms_p_value_for_the_same_ids(capsys: pytest.CaptureFixture[str]) -> None:
    watermarking = pytest.importorskip("vllm.v1.watermarking")
    for ids in (_watermarked(), [random.Random(1).randrange(1000) for _ in range(150)]):
        code, out, err = _run(["watermark", "detect", "--key", str(KEY), "--context-width", "4",
                               "--token-ids", ",".join(map(str, ids))], capsys)
        assert code == 0, err
        line = json.loads(out)
        assert list(line) == ["score", "p_value", "num_scored_tokens", "is_watermarked"] and out.count("\n") == 1
        theirs = watermarking.GumbelWatermarkDetector(KEY, 4, prf="philox").detect(ids)
        assert (line["score"], line["p_value"], line["num_scored_tokens"], line["is_watermarked"]) == (
            theirs.score, theirs.p_value, theirs.num_scored_tokens, theirs.is_watermarked)
        assert str(KEY) not in out + err


def test_the_key_comes_from_the_environment_and_is_never_printed(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ids = _watermarked()
    monkeypatch.setenv("WM_KEY", f" {KEY}\n")
    code, out, err = _run(["watermark", "detect", "--key-env", "WM_KEY", "--token-ids", ",".join(map(str, ids))], capsys)
    assert code == 0 and json.loads(out)["is_watermarked"] and json.loads(out)["p_value"] <= 1e-4
    assert json.loads(out)["p_value"] == detect(ids, key=KEY, context_width=4, vocab_size=1000).p_value
    monkeypatch.setenv("WM_KEY", f"{KEY}x")
    code, out, err = _run(["watermark", "detect", "--key-env", "WM_KEY", "--token-ids", "1,2"], capsys)
    assert code == 2 and err == "error: --key-env (WM_KEY): must be a decimal integer from 0 to 18446744073709551615\n"
    assert str(KEY) not in out + err
    code, out, err = _run(["watermark", "detect", "--key-env", "NOT_SET_ANYWHERE", "--token-ids", "1"], capsys)
    assert code == 2 and "--key-env: the environment variable NOT_SET_ANYWHERE is not set" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--key", "1", "--context-width", "40", "--token-ids", "1"], "error: --context-width: must be an integer in [1, 32]"),
    (["--key", "1", "--token-ids", "1,x"], "error: --token-ids: must be non-negative decimal ids separated by commas"),
    (["--key", "1", "--vocab-size", "5", "--token-ids", "1,9"], "error: --token-ids[1]: must be an integer in [0, 5)"),
    (["--key", "1", "--text", "hello"], "error: --text: needs --model"),
])
def test_bad_arguments_exit_2_naming_the_argument(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["watermark", "detect", *argv], capsys)
    assert code == 2 and err.startswith(message) and not out


def test_text_is_tokenized_with_the_models_tokenizer(embedded_model: Path, embedded_tokenizer: object,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    text = "The quick brown fox jumps over the lazy dog, twice over."
    ids = embedded_tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]  # a HF tokenizer
    code, out, err = _run(["watermark", "detect", "--key", "5", "--text", text, "--model", str(embedded_model)], capsys)
    assert code == 0, err
    assert json.loads(out)["p_value"] == detect(ids, key=5, context_width=4, vocab_size=10**6).p_value
    assert json.loads(out)["num_scored_tokens"] == len(ids)


def test_the_command_runs_as_dynlogits_watermark_detect() -> None:
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "watermark", "detect", "--key", "3",
                           "--token-ids", "4,5,6"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["num_scored_tokens"] == 3
