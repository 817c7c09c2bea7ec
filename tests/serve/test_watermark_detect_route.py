"""``POST /v1/watermark/detect`` (issue 50): a real frontend process (``--logits-spec`` with a
watermark whose key it reads from ``key_env``, API keys on) in front of the worker's real detection
route (``dynlogits.serve.worker.watermark.detect_route`` behind the worker secret, served by uvicorn in
a thread) with the embedded model's real tokenizer and the real detector. The engine is a stand-in
holding only what detection reads (tokenizer, logits width): detection runs no engine;
``tests/deploy/test_watermark_deploy.py`` detects what the real engine generated.

Checked: a watermarked id sequence is found and random ids are not; ``text`` is tokenized with the
served model's tokenizer; the route is behind the API keys and the worker behind its secret; bad
bodies get a 400 naming the field, bounded before any work; a deployment without a watermark answers
409; the key's digits are in no answer, no metric and no log line."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from deploy.launcher import FrontendProcess
from deploy.launcher import frontend_process as start_frontend
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from threaded_uvicorn import ThreadedServer

from dynlogits.policy.config import parse_config
from dynlogits.serve.protocol import WorkerInfo
from dynlogits.serve.secret import RequireWorkerSecret
from dynlogits.serve.worker.args import WorkerArgs
from dynlogits.serve.worker.state import WorkerState
from dynlogits.serve.worker.watermark import detect_route

torch = pytest.importorskip("torch")

from dynlogits.processors.watermark_detect import detect  # noqa: E402
from dynlogits.processors.watermark_prf import uniform  # noqa: E402

KEY = 15713294082266031957  # distinctive digits: grep-able wherever they must not appear
DIGITS = str(KEY)
WIDTH = 4
VOCAB = 1024  # the embedded model's logits width
API_KEY = "detect-test-api-key-0123456789"
SECRET = "detect-test-worker-secret-0123456789"
MAX_PROMPT_CHARS = 512
SPEC = ("entries:\n  - {kind: banned_tokens, token_ids: [7]}\n"
        f"  - {{kind: watermark, scheme: gumbel, context_width: {WIDTH}, key_env: WM_KEY}}\n")


@dataclass
class _Engine:
    """What detection reads of a started engine: the served model's tokenizer and logits width."""

    tokenizer: Any
    vocab_size: int = VOCAB
    model_name: str = "m"


def _worker(tokenizer: Any) -> Any:
    config = parse_config({"entries": [{"kind": "watermark", "scheme": "gumbel", "context_width": WIDTH,
                                        "key_env": "WM_KEY"}]}, environ={"WM_KEY": DIGITS})
    state = WorkerState(args=WorkerArgs(worker_secret=SECRET, request_limits=_limits()), config=config)
    state.engine = _Engine(tokenizer)  # type: ignore[assignment]  # a stand-in: detection reads only these
    state.policy = object()  # type: ignore[assignment]  # set once the engine serves; detection never reads it
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> dict[str, Any]:
        return WorkerInfo(model="m", role="agg", backend="vllm", max_model_len=64, vocab_size=VOCAB).model_dump()

    @app.post("/watermark/detect")
    async def watermark_detect(request: Request) -> JSONResponse:
        return await detect_route(state, request)

    return RequireWorkerSecret(app, secret=SECRET)


def _limits() -> Any:
    from dynlogits.serve.limits import RequestLimits

    return RequestLimits(max_prompt_chars=MAX_PROMPT_CHARS)


@dataclass
class _Deployment:
    frontend: FrontendProcess
    plain: FrontendProcess
    worker_url: str

    def detect(self, body: Any, *, api_key: str | None = API_KEY, plain: bool = False) -> httpx.Response:
        url = (self.plain if plain else self.frontend).url
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.post(f"{url}/v1/watermark/detect", json=body, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def deployment(embedded_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Deployment]:
    folder = tmp_path_factory.mktemp("detect")
    spec = folder / "watermark.yaml"
    spec.write_text(SPEC)
    keys = folder / "api.keys"
    keys.write_text(API_KEY + "\n")
    env = {"WM_KEY": DIGITS, "DYN_WORKER_SECRET": SECRET}
    with ThreadedServer(_worker(embedded_tokenizer)) as worker:
        url = f"http://127.0.0.1:{worker.port}"
        with start_frontend("detect", "--agg-worker", url, "--logits-spec", str(spec), "--api-key-file", str(keys),
                            "--max-prompt-chars", str(MAX_PROMPT_CHARS), env=env,
                            log_path=folder / "frontend.log") as frontend, \
                start_frontend("plain", "--agg-worker", url, env={"DYN_WORKER_SECRET": SECRET},
                               log_path=folder / "plain.log") as plain:
            yield _Deployment(frontend, plain, url)


def _watermarked(n: int, key: int = KEY) -> list[int]:
    """``n`` ids drawn as the watermark draws them from a flat distribution: each the argmax of the
    PRF's uniform over the vocabulary for the context before it (``-1`` before the output)."""
    ids: list[int] = []
    for _ in range(n):
        context = ([-1] * WIDTH + ids)[-WIDTH:]
        u = uniform(key, torch.tensor([context]), torch.arange(VOCAB).unsqueeze(0))
        ids.append(int(u.argmax()))
    return ids


def test_watermarked_ids_are_found_and_random_ids_are_not(deployment: _Deployment) -> None:
    marked = _watermarked(40)
    answer = deployment.detect({"token_ids": marked})
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert set(found) == {"score", "p_value", "num_scored_tokens", "is_watermarked"}
    assert found["is_watermarked"] is True and found["p_value"] < 1e-6 and found["num_scored_tokens"] == 40
    assert found == {**detect(marked, key=KEY, context_width=WIDTH, vocab_size=VOCAB).__dict__}
    random_ids = [random.Random(5).randrange(VOCAB) for _ in range(40)]
    assert deployment.detect({"token_ids": random_ids}).json()["is_watermarked"] is False
    assert deployment.detect({"token_ids": _watermarked(40, key=KEY + 1)}).json()["is_watermarked"] is False


def test_text_is_tokenized_with_the_served_models_tokenizer(deployment: _Deployment, embedded_tokenizer: Any) -> None:
    text = "The quick brown fox jumps over the lazy dog, twice over."
    ids = embedded_tokenizer.encode(text, add_special_tokens=False)
    answer = deployment.detect({"text": text})
    assert answer.status_code == 200, answer.text
    expected = detect(ids, key=KEY, context_width=WIDTH, vocab_size=VOCAB)
    assert answer.json()["num_scored_tokens"] == expected.num_scored_tokens
    assert answer.json()["p_value"] == pytest.approx(expected.p_value)


def test_the_route_is_behind_the_api_keys_and_the_worker_behind_its_secret(deployment: _Deployment) -> None:
    for api_key in (None, "wrong-key"):
        refused = deployment.detect({"token_ids": [1, 2, 3]}, api_key=api_key)
        assert refused.status_code == 401
    direct = httpx.post(f"{deployment.worker_url}/watermark/detect", json={"token_ids": [1, 2]}, timeout=10)
    assert direct.status_code == 401


@pytest.mark.parametrize(("body", "param", "rule"), [
    ({"text": "a", "token_ids": [1]}, "token_ids", "exactly one of text and token_ids"),
    ({}, "text", "exactly one of text and token_ids"),
    ({"token_ids": [1], "key": 3}, "key", "unknown field"),
    ({"token_ids": [1, 2, -1]}, "token_ids[2]", "from 0 to"),
    ({"token_ids": [1, "2"]}, "token_ids[1]", "integer"),
    ({"token_ids": [1, 2, VOCAB]}, "token_ids[2]", f"logits width {VOCAB}"),  # only the worker knows the width
    ({"token_ids": [1] * (MAX_PROMPT_CHARS + 1)}, "token_ids", "limit max_prompt_chars"),
    ({"text": "x" * (MAX_PROMPT_CHARS + 1)}, "text", "limit max_prompt_chars"),
    ({"text": 5}, "text", "must be a string"),
    ({"token_ids": []}, "token_ids", "must not be empty"),
    ([1, 2], None, "JSON object"),
], ids=["both", "neither", "unknown field", "negative id", "string id", "beyond the width", "too many ids",
        "too long a text", "text not a string", "no ids", "not an object"])
def test_a_bad_body_is_a_400_naming_the_field(deployment: _Deployment, body: Any, param: str | None, rule: str) -> None:
    answer = deployment.detect(body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and rule in error["message"]


def test_a_deployment_without_a_watermark_answers_409(deployment: _Deployment) -> None:
    answer = deployment.detect({"token_ids": [1, 2, 3]}, plain=True)
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "no_watermark_configured"
    assert "no watermark configured" in answer.json()["error"]["message"]


def test_the_key_is_in_no_answer_metric_or_log_line(deployment: _Deployment) -> None:
    answers = [deployment.detect({"token_ids": _watermarked(8)}), deployment.detect({"token_ids": [VOCAB]}),
               deployment.detect({"token_ids": [1]}, api_key=None), deployment.detect({"text": ""}),
               httpx.get(f"{deployment.frontend.url}/metrics", timeout=10),
               httpx.get(f"{deployment.frontend.url}/health", timeout=10),
               httpx.get(f"{deployment.frontend.url}/health", headers={"Authorization": f"Bearer {SECRET}"}, timeout=10)]
    for answer in answers:
        assert DIGITS not in answer.text
    metrics = answers[4].text
    assert 'dynlogits_requests_total{endpoint="watermark_detect"}' in metrics
    assert 'dynlogits_request_errors_total{endpoint="watermark_detect",status="400"}' in metrics
    log = Path(str(deployment.frontend.log_path)).read_text(errors="replace")
    assert DIGITS not in log
