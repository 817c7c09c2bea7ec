"""``DYN_ENABLE_TEST_LOGITS_PROCESSOR=1 ./launch/agg.sh``: "Hello world!", worker loss and recovery, clean stop.

Tests in this module run in order on one deployment; the last ones kill its worker and stop it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import httpx
import openai
import psutil
import pytest

from .conftest import model_name, openai_client
from .launcher import ENGINE_FLAGS, LOG_DIR, PYTHON, ROOT, Deployment, command_line, free_port_block, wait_until

pytestmark = pytest.mark.engine

HELLO = "Hello world!"
MESSAGES = [{"role": "user", "content": "What do you say?"}]


@pytest.fixture(scope="module")
def hook_agg() -> Iterator[Deployment]:
    # DYN_LOGITS_SPEC_SOURCE=engine exported by mistake must change nothing: the worker is the source
    # and pins its engine to 'worker' (else the engine would refuse the worker's own payload).
    d = Deployment("hook-agg", "agg.sh", free_port_block(2),
                   env={"DYN_ENABLE_TEST_LOGITS_PROCESSOR": "1", "DYN_LOGITS_SPEC_SOURCE": "engine"})
    d.start()
    yield d
    d.stop()


def test_chat_answers_hello_world(hook_agg: Deployment) -> None:
    client = openai_client(hook_agg)
    reply = client.chat.completions.create(model=model_name(hook_agg), messages=MESSAGES)
    assert reply.choices[0].message.content == HELLO
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens >= 2


def test_streaming_chat_answers_hello_world(hook_agg: Deployment) -> None:
    client = openai_client(hook_agg)
    stream = client.chat.completions.create(model=model_name(hook_agg), messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == HELLO
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and not chunks[-1].choices


def test_text_completion_answers_hello_world(hook_agg: Deployment) -> None:
    client = openai_client(hook_agg)
    reply = client.completions.create(model=model_name(hook_agg), prompt="Once upon a time", max_tokens=50)
    assert reply.choices[0].text == HELLO


def test_example_client_hello(hook_agg: Deployment) -> None:
    out = subprocess.run([PYTHON, str(ROOT / "examples" / "openai_client.py"), "--base-url", hook_agg.base_url,
                          "--hello"], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == HELLO


def test_request_kinds_need_the_operators_allow_list(hook_agg: Deployment) -> None:
    client = openai_client(hook_agg)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_name(hook_agg), messages=MESSAGES,
                                       extra_body={"logits_processors": [{"kind": "forced_text", "text": "x"}]})
    assert "not allowed by this deployment" in err.value.message
    assert err.value.body["param"] == "logits_processors[0].kind"  # type: ignore[index]


def _worker(d: Deployment) -> psutil.Process:
    return d.named("dynlogits.serve.worker")[0]


@pytest.fixture()
def restarted_worker(hook_agg: Deployment) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_worker_killed_gives_503_then_recovers(hook_agg: Deployment, restarted_worker: list) -> None:
    client = openai_client(hook_agg)
    model = model_name(hook_agg)
    worker = _worker(hook_agg)
    os.killpg(worker.pid, signal.SIGKILL)  # worker and its engine core, as a crash would

    def unavailable() -> openai.APIStatusError | None:
        try:
            client.chat.completions.create(model=model, messages=MESSAGES)
        except openai.APIStatusError as err:
            return err if err.status_code == 503 else None
        return None

    err = wait_until(unavailable, 30, "503 after the worker died")
    # Which 503 comes first is a race, both right: the request reaches the dead worker before a
    # readiness probe has seen it go (refused: "no agg worker is available"), or after (no model
    # is served any more). A clean-clone run with a busy core saw the second.
    assert "no agg worker is available" in err.message or "no worker is ready yet" in err.message, err.message
    assert err.response.headers.get("retry-after"), err.response.headers
    assert httpx.get(f"{hook_agg.url}/health").status_code == 503

    port = hook_agg.port + 1
    with open(LOG_DIR / "hook-agg-restarted-worker.log", "wb") as log:
        restarted_worker.append(subprocess.Popen(
            [PYTHON, "-m", "dynlogits.serve.worker", "--port", str(port), *ENGINE_FLAGS], cwd=ROOT,
            env={**os.environ, "DYN_ENABLE_TEST_LOGITS_PROCESSOR": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    wait_until(lambda: httpx.get(f"{hook_agg.url}/health").status_code == 200, 300, "recovery")
    assert client.chat.completions.create(model=model, messages=MESSAGES).choices[0].message.content == HELLO


def test_script_stops_every_child_on_ctrl_c(hook_agg: Deployment) -> None:
    children = hook_agg.processes()[1:]
    assert any("dynlogits.serve.frontend" in command_line(p) for p in children)
    left = hook_agg.stop(signal.SIGINT)
    assert hook_agg.proc is not None and hook_agg.proc.returncode is not None
    assert left == [], f"left behind: {[(p.pid, p.name()) for p in left]}"
