"""The frontend's translation of a worker's ``failure`` chunk (a request whose logits-processor entries
failed while it generated) for the stock ``openai`` client: a 422 (or a 500 for a processor that
raised) in OpenAI's error shape, or, streamed, the chunks so far, an error event, then ``[DONE]``;
never a ``finish_reason: "stop"``; counted by reason in ``/metrics``.

A real frontend process and the real client; the worker is a small app served by uvicorn in a thread
(no engine): it answers ``/ready`` as the real worker does and ``/generate`` with the NDJSON a real
worker sends for such a request (``dynlogits.serve.worker.vllm_engine.VllmEngine.generate``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from deploy.launcher import FrontendProcess
from deploy.launcher import frontend_process as start_frontend
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from threaded_uvicorn import ThreadedServer

from dynlogits.serve.protocol import EntryFailure, GenerateChunk, Usage, WorkerInfo

MODEL = "m"
FAILURES = {
    "no_token_left": EntryFailure(reason="no_token_left", param="logits_processors[1]", position=1,
                                  message="logits_processors[1] (trigger): no token left to sample at output position 1"),
    "processor_error": EntryFailure(reason="processor_error", param="deployment entries[0]", position=3,
                                    message="deployment entries[0] (python): raised at output position 3"),
}


def _worker() -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> dict[str, Any]:
        return WorkerInfo(model=MODEL, role="agg", backend="vllm", max_model_len=64, vocab_size=32).model_dump()

    @app.post("/generate")
    async def generate(request: Request) -> StreamingResponse:
        body = await request.json()
        failure = FAILURES.get(body.get("prompt") or "")
        chunks = [GenerateChunk(text="hello", token_ids=[5])]
        if failure is not None:
            chunks.append(GenerateChunk(failure=failure))
        else:
            chunks += [GenerateChunk(finish_reason="stop", token_ids=[1]),
                       GenerateChunk(usage=Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3))]
        lines = [c.model_dump_json(exclude_none=True).encode() + b"\n" for c in chunks]
        return StreamingResponse(iter(lines), media_type="application/x-ndjson")

    return app


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProcess]:
    with ThreadedServer(_worker()) as worker, start_frontend(
            "failures", "--agg-worker", f"http://127.0.0.1:{worker.port}",
            log_path=tmp_path_factory.mktemp("failures") / "frontend.log") as process:
        yield process


def _client(frontend: FrontendProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _failures(frontend: FrontendProcess) -> dict[str, float]:
    text = httpx.get(f"{frontend.url}/metrics", timeout=10).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^dynlogits_request_failures_total\{endpoint="completion",reason="([a-z_]+)"\} (\S+)$', text, re.MULTILINE)}


def test_a_request_that_finished_is_answered_as_before(frontend: FrontendProcess) -> None:
    reply = _client(frontend).completions.create(model=MODEL, prompt="ok", max_tokens=4)
    assert (reply.choices[0].text, reply.choices[0].finish_reason) == ("hello", "stop")


def test_no_token_left_is_a_422_naming_the_entry(frontend: FrontendProcess) -> None:
    before = _failures(frontend)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        _client(frontend).completions.create(model=MODEL, prompt="no_token_left", max_tokens=4)
    err = caught.value
    assert err.body == {"message": FAILURES["no_token_left"].message, "type": "logits_processor_error",
                        "param": "logits_processors[1]", "code": "no_token_left"}
    assert _failures(frontend).get("no_token_left", 0) == before.get("no_token_left", 0) + 1


def test_a_processor_that_raised_is_a_500(frontend: FrontendProcess) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        _client(frontend).completions.create(model=MODEL, prompt="processor_error", max_tokens=4)
    assert (caught.value.code, caught.value.param) == ("processor_error", "deployment entries[0]")


def test_streamed_the_chunks_so_far_then_the_error_then_done(frontend: FrontendProcess) -> None:
    before = _failures(frontend)
    stream = _client(frontend).completions.create(model=MODEL, prompt="no_token_left", max_tokens=4, stream=True)
    texts: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            texts += [c.text for c in chunk.choices]
            assert all(c.finish_reason is None for c in chunk.choices)
    assert texts == ["hello"]
    assert (caught.value.code, caught.value.param, caught.value.type) == (
        "no_token_left", "logits_processors[1]", "logits_processor_error")
    assert _failures(frontend).get("no_token_left", 0) == before.get("no_token_left", 0) + 1

    body = {"model": MODEL, "prompt": "no_token_left", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{frontend.url}/v1/completions", json=body, timeout=30) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2]) == {"error": err_body(caught.value)}
    assert len(events) == 3  # the one text chunk, the error, [DONE]


def err_body(err: openai.APIError) -> dict[str, Any]:
    return {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
