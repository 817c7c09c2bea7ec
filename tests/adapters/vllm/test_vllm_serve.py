"""vLLM's own OpenAI server with the adapter, driven by the real ``openai`` client, nothing of ours in front.

The server is what a plain vLLM user runs: ``python -m vllm.entrypoints.openai.api_server --model DIR
--logits-processors dynlogits.adapters.vllm:DynamoVllmLogitsProcessor`` (the same server as ``vllm
serve``, whose console script cannot find the CPU build's distribution name). The operator allows
``forced_sequence`` and ``banned_tokens`` per request (``DYN_LOGITS_REQUEST_KINDS``); clients send
the payload as ``vllm_xargs`` built by ``dynlogits.client.vllm_xargs``. One server for the module.

A plain request is checked against the model itself: its greedy tokens, fed back through the
embedded model in ``transformers``, are the model's own top choice at every step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import torch

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

from vllm_helpers import FORCED_TEXTS, forced_payload  # noqa: E402

from dynlogits.adapters.vllm import PROCESSOR_FQCN  # noqa: E402
from dynlogits.client import vllm_xargs  # noqa: E402
from dynlogits.policy.engine_spec import REQUEST_KINDS_ENV, SPEC_SOURCE_ENV  # noqa: E402
from dynlogits.tools.ports import free_port_block  # noqa: E402

pytestmark = pytest.mark.engine

MODEL = "dynlogits-tiny"
SERVE_KINDS = "forced_sequence,banned_tokens"
#: Start-up is ~35 s on an idle 2-core machine; CI shares the cores with other work.
READY_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 300
#: How far below the model's best logit a plain request's token may be (float32 on both sides).
TIE_TOLERANCE = 1e-4


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_ready(server: Server) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _healthy(server.url):
        if server.proc.poll() is not None:
            raise RuntimeError(f"vLLM's server exited with {server.proc.returncode}:\n{server.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"vLLM's server not healthy after {READY_TIMEOUT_S} s:\n{server.log_tail()}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (its engine core included), SIGKILL what is left after 60 s."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=60)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=10)
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(embedded_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port_block(1)
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
           REQUEST_KINDS_ENV: SERVE_KINDS}
    env.pop(SPEC_SOURCE_ENV, None)  # the default: nothing of ours resolves a spec here
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(embedded_model),
           "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
           "--logits-processors", PROCESSOR_FQCN, "--dtype", "float32", "--enforce-eager",
           "--gpu-memory-utilization", "0.2", "--max-model-len", "512", "--seed", "0"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    running = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        _wait_ready(running)
        yield running
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)


@pytest.fixture(scope="module")
def hf_model(embedded_model: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(embedded_model), dtype=torch.float32).eval()


def forced_xargs(tokenizer: Any, text: str) -> dict[str, str]:
    return vllm_xargs(forced_payload(tokenizer, text))


def complete(client: Any, prompt: str, xargs: dict[str, Any] | None = None, **extra: Any) -> Any:
    body = {**extra, **({"vllm_xargs": xargs} if xargs is not None else {})}
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=64, temperature=0.0, extra_body=body)


def chat(client: Any, prompt: str, xargs: dict[str, Any]) -> Any:
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=64,
                                          temperature=0.0, extra_body={"vllm_xargs": xargs})


def plain(client: Any, prompt: str) -> Any:
    """A greedy request without a payload, returning its prompt and output token ids."""
    return complete(client, prompt, max_tokens=12, ignore_eos=True, return_token_ids=True)


def assert_models_own_choices(hf_model: Any, choice: Any) -> None:
    """Every token of a plain greedy ``choice`` is the model's top choice (within float32 ties)."""
    prompt, output = choice.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]
    assert len(output) == 12
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1: -1]
    gaps = [float(row.max() - row[token]) for row, token in zip(logits, output)]
    assert max(gaps) <= TIE_TOLERANCE, gaps


def refusal(client: Any, dynamo_logits: Any) -> str:
    """The message of the 400 a request with ``vllm_xargs={"dynamo_logits": ...}`` gets."""
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, "Hi", {"dynamo_logits": dynamo_logits}, max_tokens=4)
    assert err.value.status_code == 400
    return str(err.value)


def test_eight_concurrent_forced_texts_come_back_exact_beside_plain_requests(
        client: Any, embedded_tokenizer: Any, hf_model: Any) -> None:
    texts = FORCED_TEXTS[:8]
    with ThreadPoolExecutor(max_workers=10) as pool:
        forced = [pool.submit(complete if i % 2 else chat, client, f"Request {i}: say something.",
                              forced_xargs(embedded_tokenizer, text)) for i, text in enumerate(texts)]
        plains = [pool.submit(plain, client, prompt) for prompt in ("Hi there", "The answer is")]
        results = [f.result(timeout=REQUEST_TIMEOUT_S) for f in forced]
        unforced = [f.result(timeout=REQUEST_TIMEOUT_S) for f in plains]
    got = [r.choices[0].text if i % 2 else r.choices[0].message.content for i, r in enumerate(results)]
    assert got == texts
    assert all(r.choices[0].finish_reason == "stop" for r in results)
    for r in unforced:
        assert_models_own_choices(hf_model, r.choices[0])


def test_a_malformed_entry_is_a_400_naming_its_field(client: Any) -> None:
    bad = json.dumps([{"kind": "forced_sequence", "token_ids": [5, -3], "eos_token_id": 2}])
    assert "extra_args.dynamo_logits[0].token_ids[1]: must be >= 0" in refusal(client, bad)


def test_text_that_is_not_json_is_a_400_saying_so(client: Any) -> None:
    assert "extra_args.dynamo_logits: must be a list of entries or its JSON text; this text is not valid JSON" \
        in refusal(client, "force: Hello world!")


def test_kinds_outside_the_operator_setting_are_a_400(client: Any) -> None:
    bias = refusal(client, json.dumps([{"kind": "logit_bias", "bias": {"3": 5.0}}]))
    assert "dynamo_logits[0].kind: kind 'logit_bias' is not allowed" in bias
    assert "['banned_tokens', 'forced_sequence']" in bias
    code = refusal(client, json.dumps([{"kind": "python", "factory": "os:system", "kwargs": {"command": "true"}}]))
    assert "dynamo_logits[0].kind: kind 'python' is operator-only" in code


def test_vllm_itself_refuses_the_payload_as_a_list(client: Any) -> None:
    """Why the text form exists: ``vllm_xargs`` values are flat, so vLLM's own validation answers."""
    assert "body.vllm_xargs.dynamo_logits" in refusal(client, [{"kind": "banned_tokens", "token_ids": [3]}])


def test_the_example_client_forces_its_text_through_the_server(server: Server) -> None:
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, str(root / "examples" / "vllm_serve_client.py"), "--base-url",
                           f"{server.url}/v1", "--text", "Yes, thank you."],
                          capture_output=True, text=True, timeout=REQUEST_TIMEOUT_S, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "forced: Yes, thank you." in lines
    assert "refused (400): extra_args.dynamo_logits[0].token_ids[0]: must be >= 0" in lines


def test_the_server_serves_after_refusals(server: Server, client: Any, embedded_tokenizer: Any, hf_model: Any) -> None:
    refusal(client, "[{")
    assert _healthy(server.url) and server.proc.poll() is None
    result = complete(client, "Again", forced_xargs(embedded_tokenizer, "Hello world!"))
    assert result.choices[0].text == "Hello world!"
    banned_first = plain(client, "Hi there").choices[0].model_extra["token_ids"][0]
    ban = vllm_xargs([{"kind": "banned_tokens", "token_ids": [banned_first]}])
    steered = complete(client, "Hi there", ban, max_tokens=12, ignore_eos=True, return_token_ids=True)
    assert steered.choices[0].model_extra["token_ids"][0] != banned_first
    assert_models_own_choices(hf_model, plain(client, "Hi there").choices[0])
