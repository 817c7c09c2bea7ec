"""The operator's watermark through ``launch/agg.sh`` (issue 50): a config whose watermark key the
deployment reads from an environment variable (``key_env``), API keys on; answers sampled at
temperature 1 by the real vLLM engine are found by the deployment's ``POST /v1/watermark/detect`` (their
text, tokenized by the served model's tokenizer), and a plain deployment's answer (``open_agg``, no
watermark) is not; a client's own watermark beside the operator's is refused naming both; the key's
digits are in no answer, no ``/stats``, ``/ready`` or ``/metrics`` and no line of the deployment's log
(frontend, worker and engine processes alike)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from .launcher import WORKER_AUTH, Deployment, free_port_block

pytestmark = pytest.mark.engine

KEY = 15713294082266031957  # distinctive digits: grep-able wherever they must not appear
DIGITS = str(KEY)
KEY_ENV = "DYN_TEST_WATERMARK_KEY"
API_KEY = "watermark-deploy-api-key-0123456789"
SPEC = f"""# the operator's watermark; its key is read from ${KEY_ENV} when the deployment starts
entries:
  - {{kind: watermark, scheme: gumbel, context_width: 4, key_env: {KEY_ENV}}}
allow_request_kinds: [watermark, banned_tokens]
"""
PROMPT = "Once upon a time"
#: Sampled answers per deployment: each is detected (or not) on its own.
ANSWERS = 2


@pytest.fixture(scope="module")
def watermark_agg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    folder = tmp_path_factory.mktemp("watermark-agg")
    (folder / "watermark.yaml").write_text(SPEC)
    (folder / "api.keys").write_text(API_KEY + "\n")
    d = Deployment("watermark-agg", "agg.sh", free_port_block(2),
                   args=["--logits-spec", str(folder / "watermark.yaml"), "--api-key-file", str(folder / "api.keys")],
                   env={"DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0", KEY_ENV: DIGITS})
    d.start()
    yield d
    d.stop()


def _client(d: Deployment, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.base_url, api_key=api_key, max_retries=0, timeout=300)


def _sampled(client: openai.OpenAI, seed: int, entries: list[dict[str, Any]] | None = None) -> str:
    """A 160-token answer sampled at temperature 1 (no stop token: its length is fixed), with the
    client's own ``entries`` if given."""
    model = client.models.list().data[0].id
    body: dict[str, Any] = {"ignore_eos": True}
    if entries is not None:
        body["logits_processors"] = entries
    answer = client.completions.create(model=model, prompt=PROMPT, temperature=1.0, max_tokens=160, seed=seed,
                                       extra_body=body)
    assert answer.usage is not None and answer.usage.completion_tokens == 160
    return answer.choices[0].text


def _detect(d: Deployment, body: dict[str, Any], api_key: str | None = API_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.post(f"{d.url}/v1/watermark/detect", json=body, headers=headers, timeout=60)


def test_a_watermarked_answer_is_detected_and_a_plain_deployments_is_not(watermark_agg: Deployment,
                                                                          open_agg: Deployment) -> None:
    marked = [_sampled(_client(watermark_agg, API_KEY), seed) for seed in range(ANSWERS)]
    plain = [_sampled(_client(open_agg, "unused"), seed) for seed in range(ANSWERS)]
    for text in marked:
        found = _detect(watermark_agg, {"text": text})
        assert found.status_code == 200, found.text
        result = found.json()
        assert result["is_watermarked"] is True and result["p_value"] <= 1e-4, result
        assert result["num_scored_tokens"] >= 100
    for text in plain:
        result = _detect(watermark_agg, {"text": text}).json()
        assert result["is_watermarked"] is False, result
    # the route is behind the API keys, and the plain deployment has no watermark to detect with
    assert _detect(watermark_agg, {"text": marked[0]}, api_key=None).status_code == 401
    refused = _detect(open_agg, {"text": marked[0]})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "no_watermark_configured"


def test_a_clients_own_entries_leave_the_operators_watermark_in_place(watermark_agg: Deployment) -> None:
    """The client's entries are admitted and run before the operator's watermark, which draws last:
    the answer is still found."""
    text = _sampled(_client(watermark_agg, API_KEY), 7, entries=[{"kind": "banned_tokens", "token_ids": [3, 4]}])
    result = _detect(watermark_agg, {"text": text}).json()
    assert result["is_watermarked"] is True and result["p_value"] <= 1e-4, result


def test_a_clients_watermark_beside_the_operators_is_refused_naming_both(watermark_agg: Deployment) -> None:
    client = _client(watermark_agg, API_KEY)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name_of(client), prompt=PROMPT, max_tokens=4, extra_body={
            "logits_processors": [{"kind": "banned_tokens", "token_ids": [3]},
                                  {"kind": "watermark", "scheme": "gumbel", "key": 1, "context_width": 4}]})
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == "logits_processors[1]"
    assert "deployment entries[0]" in error["message"] and "neither removed nor replaced" in error["message"]
    # a client cannot have the servers read their environment for a key either
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name_of(client), prompt=PROMPT, max_tokens=4, extra_body={
            "logits_processors": [{"kind": "watermark", "scheme": "gumbel", "key_env": KEY_ENV}]})
    assert "logits_processors[0]" in str(info.value.body) and DIGITS not in str(info.value.body)


def model_name_of(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_the_key_is_never_echoed(watermark_agg: Deployment) -> None:
    """After the requests above (detections, refusals): the key's digits are in no answer of any
    route, no counter and no line any process of the deployment logged."""
    worker = WORKER_AUTH
    answers = [
        _detect(watermark_agg, {"token_ids": [1, 2, 3, 4, 5, 6]}),
        _detect(watermark_agg, {"token_ids": [10**6]}),
        httpx.get(f"{watermark_agg.url}/metrics", timeout=10),
        httpx.get(f"{watermark_agg.url}/health", timeout=10),
        httpx.get(f"{watermark_agg.worker_url()}/stats", headers=worker, timeout=10),
        httpx.get(f"{watermark_agg.worker_url()}/ready", headers=worker, timeout=10),
    ]
    for answer in answers:
        assert DIGITS not in answer.text, answer.request.url
    assert answers[4].status_code == 200 and answers[5].status_code == 200
    assert answers[5].json()["deployment_kinds"] == ["watermark"]
    assert watermark_agg.log_path is not None
    log = watermark_agg.log_path.read_text(errors="replace")
    assert DIGITS not in log

