"""The payloads the benchmark measures: one per kind, deterministic, valid for a logits width.

Every request of a batch carries the same kind of payload with its own ids (seeded per request),
so a batched implementation cannot profit from identical rows. ``mixed`` is what a deployment
typically stacks: ``banned_tokens`` (100 ids), ``logit_bias`` (50 ids, disjoint from the banned
ones) and ``min_tokens`` held active for the whole run (its stop id masked on every step).
``banned_phrases``: 64 phrases of 1-4 tokens (16 of each length); its requests write the phrases'
prefixes in turn, so every other token ends some phrase's prefix and masks its last token.
``scoped``: reasoning delimiters and ``banned_tokens`` (100 ids) scoped to the answer; its requests
open a reasoning span every ``SCOPED_CYCLE`` tokens and close it half-way, so half the tokens are
reasoning (the ban idle) and half answer.
Both cycles start at a point of the request's own (``_phase``): the requests of a batch are not in
lock step, so every step of a batch does about the same work and a median of steps is not a coin
toss between two costs.
``watermark``: vLLM's Gumbel-max watermark (context width 4) under one fixed key (``WATERMARK_KEY``),
given in the request's own payload: the adapter realizes a client's entry with its key where the
operator's config has no watermark (``dynlogits.policy.watermark_key`` only resolves the operator's),
and the bench drives the adapter with ``extra_args`` directly. Its requests sample (temperature 1.0,
vLLM's default, set explicitly where the bench builds ``SamplingParams``) and write pseudo-random
tokens, seeded per request and step, so no 4-token context repeats (a repeated one is left to the
engine's sampler, vLLM's deduplication) and every row is watermarked at every step.
``no_repeat_ngram`` (size ``NGRAM_SIZE``) and ``dry`` (llama.cpp's defaults: multiplier 0.8, base
1.75, allowed length 2, the whole context, prompt included): each request repeats a cycle of
``REPEAT_CYCLE`` ids of its own, from a point of its own, and starts with ``PRIMED`` tokens of it
already written, so from the first measured step every row bans one token (the one that would
complete a 3-gram of the history) or penalizes one (the one that would extend a repeat). ``dry``
has ``sequence_breakers: []``: text breakers need the engine's tokenizer, which neither the
per-row loop nor the CUDA-model count has; the breakers are resolved once per vocabulary (cached),
and a step only reads their mask, so leaving them out drops no per-step work that scales.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["BANNED_IDS", "BIAS_IDS", "FORCED_LENGTH", "HOSTED_KINDS", "KINDS", "MIN_TOKENS", "NGRAM_SIZE", "PHRASES",
           "PRIMED", "REPEAT_CYCLE", "SCOPED_CYCLE", "WATERMARK_KEY", "WATERMARK_WIDTH", "next_token", "payload",
           "writes_a_banned_phrase"]

#: The kinds of the micro suite, in table order.
KINDS = ("forced_sequence", "banned_tokens", "logit_bias", "mixed", "banned_phrases", "scoped", "watermark",
         "no_repeat_ngram", "dry")
#: Length of the forced sequence (the wire target names a 64-token sequence).
FORCED_LENGTH = 64
BANNED_IDS = 100
BIAS_IDS = 50
#: ``min_tokens`` far beyond any run, so its mask is applied on every measured step.
MIN_TOKENS = 1_000_000
#: Phrases of a ``banned_phrases`` request, and their longest (lengths 1..PHRASE_TOKENS, as many of each).
PHRASES = 64
PHRASE_TOKENS = 4
#: A ``scoped`` request writes the start tag at the start of every cycle and the end tag half-way.
SCOPED_CYCLE = 16
#: The watermark's key (one for every request, as an operator's) and context width (vLLM's default).
WATERMARK_KEY = 0x5EC2E7_0BAD_CAFE
WATERMARK_WIDTH = 4
#: ``no_repeat_ngram``'s n-gram size.
NGRAM_SIZE = 3
#: ``no_repeat_ngram`` and ``dry`` requests repeat a cycle of this many distinct ids of their own.
REPEAT_CYCLE = 8
#: Tokens already in a request's output before the first step (warm-up included), per kind: two
#: cycles, so the repeats are there from the first step. These kinds' device counts run on histories
#: that repeat too (``drive.adapter_counts(repeating=True)``).
PRIMED = {"no_repeat_ngram": 2 * REPEAT_CYCLE, "dry": 2 * REPEAT_CYCLE}
#: Workloads whose requests run on the hosted path, per adapter implementation (``adapter``: the V1
#: runner; ``adapter_v2``: Model Runner V2), as the adapter splits them today: on the V1 runner none
#: (scoped ``banned_tokens`` is resident on both runners, docs/vllm.md); on Model Runner V2 none
#: either (``dry`` without multi-token breakers and ``no_repeat_ngram`` up to size 8 are decided on
#: the device there). The device-side targets (no syncs, few launches) are the
#: resident path's and leave the pairs listed here out; the tables print their counts all the same.
#: tests/tools/test_bench.py holds this to the adapter's split.
HOSTED_KINDS: dict[str, frozenset[str]] = {"adapter": frozenset(),
                                           "adapter_v2": frozenset()}


def _ids(rng: random.Random, count: int, vocab_size: int, *, avoid: int) -> list[int]:
    """``count`` distinct ids below ``vocab_size - 1`` (the filler token), none equal to ``avoid``."""
    return [i for i in rng.sample(range(vocab_size - 1), count + 1) if i != avoid][:count]


def _phase(entry: dict[str, Any], cycle: int) -> int:
    """Where a request's cycle starts, from its own ids (requests are seeded apart)."""
    first = entry["phrases"][0] if entry["kind"] == "banned_phrases" else entry["start_token_ids"]
    return int(first[0]) % cycle


def _cycle(kind: str, vocab_size: int, seed: int) -> tuple[list[int], int]:
    """A ``no_repeat_ngram`` / ``dry`` request's cycle of ids and where it starts (seeded per request)."""
    rng = random.Random(f"{kind}-cycle:{vocab_size}:{seed}")
    return rng.sample(range(vocab_size - 1), REPEAT_CYCLE), rng.randrange(REPEAT_CYCLE)


def next_token(payload: list[dict[str, Any]], generated: int, *, vocab_size: int, seed: int = 0) -> int:
    """The token a request of this payload emits after ``generated`` tokens: the forced one for
    ``forced_sequence``, pseudo-random ones for ``watermark`` and a cycle for ``no_repeat_ngram``
    and ``dry`` (both seeded by ``seed``, the request's), else the filler token ``vocab_size - 1``,
    which no payload names."""
    entry = payload[0]
    if entry["kind"] == "watermark":  # never the filler (the prompt's token), so no context repeats
        return random.Random(f"watermark-step:{vocab_size}:{seed}:{generated}").randrange(vocab_size - 1)
    if entry["kind"] in ("no_repeat_ngram", "dry"):
        ids, phase = _cycle(entry["kind"], vocab_size, seed)
        return ids[(generated + phase) % REPEAT_CYCLE]
    if entry["kind"] == "forced_sequence":
        ids = entry["token_ids"]
        return int(ids[generated]) if generated < len(ids) else int(entry["eos_token_id"])
    if entry["kind"] == "banned_phrases":  # the prefixes of its phrases of several tokens, one after the other
        prefixes = [t for phrase in entry["phrases"] if len(phrase) > 1 for t in phrase[:-1]]
        return int(prefixes[(generated + _phase(entry, len(prefixes))) % len(prefixes)])
    if entry["kind"] == "reasoning":  # scoped: a span opened every cycle, closed half-way
        at = (generated + _phase(entry, SCOPED_CYCLE)) % SCOPED_CYCLE
        if at in (0, SCOPED_CYCLE // 2):
            return int(entry["start_token_ids" if at == 0 else "end_token_ids"][0])
    return vocab_size - 1


def writes_a_banned_phrase(payload: list[dict[str, Any]], output: list[int]) -> bool:
    """Whether ``output`` contains a phrase of the ``banned_phrases`` entry of ``payload``."""
    phrases = {tuple(p) for p in payload[0]["phrases"]}
    return any(tuple(output[i : i + k]) in phrases for k in range(1, PHRASE_TOKENS + 1) for i in range(len(output) - k + 1))


def payload(kind: str, *, vocab_size: int, eos_token_id: int, seed: int = 0) -> list[dict[str, Any]]:
    """The wire payload (``extra_args["dynamo_logits"]``) of one request of ``kind``.

    Ids lie in ``[0, vocab_size - 1)`` and never equal ``eos_token_id``; ``ValueError`` for an
    unknown kind.
    """
    rng = random.Random(f"{kind}:{vocab_size}:{seed}")
    if kind == "forced_sequence":
        return [{"kind": "forced_sequence", "token_ids": _ids(rng, FORCED_LENGTH, vocab_size, avoid=eos_token_id),
                 "eos_token_id": eos_token_id}]
    if kind == "banned_tokens":
        return [{"kind": "banned_tokens", "token_ids": _ids(rng, BANNED_IDS, vocab_size, avoid=eos_token_id)}]
    if kind == "logit_bias":
        ids = _ids(rng, BIAS_IDS, vocab_size, avoid=eos_token_id)
        return [{"kind": "logit_bias", "bias": {str(i): round(rng.uniform(-5.0, 5.0), 3) for i in ids}}]
    if kind == "mixed":
        ids = _ids(rng, BANNED_IDS + BIAS_IDS, vocab_size, avoid=eos_token_id)
        banned, biased = ids[:BANNED_IDS], ids[BANNED_IDS:]
        return [
            {"kind": "banned_tokens", "token_ids": banned},
            {"kind": "logit_bias", "bias": {str(i): round(rng.uniform(-5.0, 5.0), 3) for i in biased}},
            {"kind": "min_tokens", "min_tokens": MIN_TOKENS, "stop_token_ids": [eos_token_id]},
        ]
    if kind == "banned_phrases":
        ids = _ids(rng, PHRASES * (PHRASE_TOKENS + 1) // 2, vocab_size, avoid=eos_token_id)
        phrases, at = [], 0
        for i in range(PHRASES):
            length = 1 + i % PHRASE_TOKENS
            phrases.append(ids[at : at + length])
            at += length
        return [{"kind": "banned_phrases", "phrases": phrases}]
    if kind == "scoped":
        ids = _ids(rng, BANNED_IDS + 2, vocab_size, avoid=eos_token_id)
        return [{"kind": "reasoning", "start_token_ids": [ids[0]], "end_token_ids": [ids[1]]},
                {"kind": "banned_tokens", "token_ids": ids[2:], "scope": "answer"}]
    if kind == "watermark":
        return [{"kind": "watermark", "scheme": "gumbel", "key": WATERMARK_KEY, "context_width": WATERMARK_WIDTH}]
    if kind == "no_repeat_ngram":
        return [{"kind": "no_repeat_ngram", "size": NGRAM_SIZE}]
    if kind == "dry":
        return [{"kind": "dry", "multiplier": 0.8, "base": 1.75, "allowed_length": 2, "sequence_breakers": [],
                 "penalty_last_n": -1, "include_prompt": True}]
    raise ValueError(f"unknown benchmark kind {kind!r}; expected one of {', '.join(KINDS)}")
