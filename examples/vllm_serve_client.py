"""Per-request logits processors through vLLM's own OpenAI server, with the official ``openai`` SDK.

Start vLLM's server with the adapter, allowing the kinds clients may send, then run this::

    DYN_LOGITS_REQUEST_KINDS=forced_sequence,banned_tokens \\
        vllm serve MODEL --logits-processors dynlogits.adapters.vllm:DynamoVllmLogitsProcessor &
    python examples/vllm_serve_client.py --base-url http://127.0.0.1:8000/v1 --text "Hello world!"

The payload travels as ``vllm_xargs`` (flat values only: the entries as JSON text, written by
``dynlogits.client.vllm_xargs``). The text is tokenized here with the model's tokenizer (by default
the ``root`` vLLM reports for the served model), so the request forces exactly those tokens.
"""

from __future__ import annotations

import argparse
import os

from openai import BadRequestError, OpenAI
from transformers import AutoTokenizer

from dynlogits.client import vllm_xargs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    p.add_argument("--text", default="Hello world!", help="the text to force")
    p.add_argument("--tokenizer", default=None, help="the model's tokenizer (default: the served model's root)")
    args = p.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    model = client.models.list().data[0]
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or model.model_extra.get("root") or model.id)

    forced = {"kind": "forced_sequence", "token_ids": tokenizer.encode(args.text, add_special_tokens=False),
              "eos_token_id": tokenizer.eos_token_id}
    reply = client.completions.create(model=model.id, prompt="Say something.", max_tokens=64,
                                      extra_body={"vllm_xargs": vllm_xargs([forced])})
    print("forced:", reply.choices[0].text)

    # A bad entry is a 400 naming its field (sent as raw text here: vllm_xargs() would refuse it first).
    bad = '[{"kind": "banned_tokens", "token_ids": [-1]}]'
    try:
        client.completions.create(model=model.id, prompt="Hi", max_tokens=4,
                                  extra_body={"vllm_xargs": {"dynamo_logits": bad}})
    except BadRequestError as err:
        print(f"refused ({err.status_code}):", err.body.get("message") if isinstance(err.body, dict) else err)


if __name__ == "__main__":
    main()
