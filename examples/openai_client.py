"""Per-request logits processors through the official ``openai`` SDK (``extra_body``).

Start a deployment that allows request kinds, then run this::

    ./launch/agg.sh --logits-spec examples/deployment.yaml &
    python examples/openai_client.py --base-url http://127.0.0.1:8000/v1

With ``--hello`` it sends one plain chat request and prints the answer (what
``DYN_ENABLE_TEST_LOGITS_PROCESSOR=1 ./launch/agg.sh`` turns into "Hello world!").
"""

from __future__ import annotations

import argparse
import os

from openai import BadRequestError, OpenAI


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    p.add_argument("--hello", action="store_true", help="send one plain chat request and print the answer")
    args = p.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Say something."}]

    if args.hello:
        reply = client.chat.completions.create(model=model, messages=messages)
        print(reply.choices[0].message.content)
        return

    # 1. Force a text: the worker tokenizes it with the model's tokenizer and ends with EOS.
    forced = client.chat.completions.create(
        model=model, messages=messages,
        extra_body={"logits_processors": [{"kind": "forced_text", "text": "The answer is 42."}]},
    )
    print("forced_text:", forced.choices[0].message.content)

    # 2. Streaming works the same way.
    stream = client.chat.completions.create(
        model=model, messages=messages, stream=True,
        extra_body={"logits_processors": [{"kind": "forced_text", "text": "Streamed, token by token."}]},
    )
    print("streamed:", "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))

    # 3. A bad entry is a 400 that names the field.
    try:
        client.chat.completions.create(
            model=model, messages=messages,
            extra_body={"logits_processors": [{"kind": "banned_tokens", "token_ids": [1, -5]}]},
        )
    except BadRequestError as err:
        print("rejected:", err.body["message"] if isinstance(err.body, dict) else err)


if __name__ == "__main__":
    main()
