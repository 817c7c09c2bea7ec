"""The worked plug-in in examples/resident_plugin (docs/specs.md, "Writing a kind"): ``acme.ban_range``
runs resident on both vLLM runners (the real classes, through the kit's drivers) beside built-ins,
``acme.no_repeat_ngram`` per row after them, and once the distribution is really installed
``dynlogits conformance vllm --kind NAME`` checks each kind by name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from dynlogits import sdk
from dynlogits.specs.kinds import kinds_registered

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "resident_plugin"
VOCAB = 1024  # the embedded model's logits width: what the vLLM drivers serve
EOS = 1


@pytest.fixture
def acme(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The example's kinds in force in this process (its package importable, as if installed)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from acme_ban_range import kinds

    with kinds_registered(kinds.BAN_RANGE, kinds.NO_REPEAT_NGRAM):
        yield kinds


@pytest.fixture(params=["vllm-v1", "vllm-v2"])
def driver(request: pytest.FixtureRequest, acme: Any) -> Any:
    from dynlogits.adapters.vllm.conformance import drivers

    return next(d for d in drivers(vocab_size=VOCAB) if d.name == request.param)


def _steps(driver: Any, payload: list[dict[str, Any]], steps: int = 5) -> list[int]:
    """Greedy steps of one request, each row checked against the entries applied in order on the host."""
    reference = sdk.realize(payload, vocab_size=VOCAB, stop_token_id=EOS,
                            facts=sdk.RequestFacts.of(prompt_ids=(3,), eos_token_id=EOS))
    assert reference is not None and reference.processor is not None
    driver.add("r", payload, prompt_ids=(3,), eos_token_id=EOS)
    history: list[int] = []
    for step in range(steps):
        raw = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(step))
        raw[0, 20:40] += 10.0  # the banned range would win every step
        raw[0, 50] += 5.0  # then 50, which no_repeat_ngram(1) bans once generated
        want = raw[0].clone()
        reference.processor(history, want)
        out = driver.step(["r"], raw.clone())
        assert torch.allclose(out[0], want), step
        history.append(int(out[0].argmax()))
        driver.commit("r", history[-1])
    assert driver.failures() == []
    return history


def _resident(driver: Any) -> list[list[str]]:
    return [[type(p).__name__ for p in r.processor.processors] for r in driver.processor._resident.requests if r is not None]


def test_ban_range_runs_resident_on_both_vllm_runners(driver):
    history = _steps(driver, [{"kind": "acme.ban_range", "start": 20, "stop": 40}])
    assert _resident(driver) == [["BanRange"]]
    assert not set(history) & set(range(20, 40))


def test_beside_built_ins_and_a_hosted_kind_only_the_hosted_kind_runs_per_row(driver):
    payload = [{"kind": "banned_tokens", "token_ids": [7]}, {"kind": "acme.ban_range", "start": 20, "stop": 40},
               {"kind": "acme.no_repeat_ngram", "n": 1}]
    history = _steps(driver, payload)
    assert _resident(driver) == [["BannedTokensProcessor", "BanRange"]]
    assert history[0] == 50 and len(set(history)) == len(history)  # no token twice


def test_no_repeat_ngram_skips_placeholders():
    sys.path.insert(0, str(EXAMPLE))
    try:
        from acme_ban_range.processors import NoRepeatNgram
    finally:
        sys.path.remove(str(EXAMPLE))
    row = torch.zeros(8)
    NoRepeatNgram(2)([3, 4, 3, -1], row)  # the newest token is a placeholder: nothing is known to repeat
    assert torch.isfinite(row).all()
    NoRepeatNgram(2)([3, 4, 3], row)  # "3 4" was generated: 4 after 3 is banned
    assert torch.isinf(row).nonzero().flatten().tolist() == [4]


# -- installed for real, checked by name --------------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example distribution pip-installed (a dist-info with its entry points) into a folder of its
    own that only the subprocesses started here see."""
    src = tmp_path_factory.mktemp("src") / "resident_plugin"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(src)], check=True, cwd=src, timeout=300, capture_output=True)
    return target


@pytest.mark.heavy  # a subprocess running the kit: make test-fast leaves it out
@pytest.mark.parametrize("kind", ["acme.ban_range", "acme.no_repeat_ngram"])
def test_the_conformance_command_checks_an_installed_kind_by_name(site: Path, kind: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "conformance", "vllm", "--kind", kind],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert lines[0].startswith(f"kind {kind} (distribution acme-ban-range 0.1.0, entry point acme_ban_range.kinds:")
    checks = [line for line in lines if " :: " in line]
    assert checks and all(line.startswith("PASSED") and f":: {kind}: " in line for line in checks), checks
    assert {line.split(" :: ")[0].split()[-1] for line in checks} == {"vllm-v1", "vllm-v2"}
    assert lines[-1] == f"{len(checks)} passed, 0 failed"


@pytest.mark.heavy
def test_an_unknown_kind_is_refused_naming_the_installed_ones(site: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "conformance", "vllm", "--kind", "acme.nope"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 2
    assert "no plug-in kind 'acme.nope' is installed" in proc.stderr and "acme.ban_range, acme.no_repeat_ngram" in proc.stderr
