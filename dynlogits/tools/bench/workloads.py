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
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["BANNED_IDS", "BIAS_IDS", "FORCED_LENGTH", "HOSTED_KINDS", "KINDS", "MIN_TOKENS", "PHRASES", "SCOPED_CYCLE",
           "next_token", "payload", "writes_a_banned_phrase"]

#: The kinds of the micro suite, in table order.
KINDS = ("forced_sequence", "banned_tokens", "logit_bias", "mixed", "banned_phrases", "scoped")
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
#: Workloads whose requests run on the hosted path, per adapter implementation: none (scoped
#: ``banned_tokens`` is resident on both runners, docs/vllm.md). The device-side targets (no syncs,
#: few launches) are the resident path's, and leave any listed here out.
HOSTED_KINDS: dict[str, frozenset[str]] = {"adapter": frozenset(), "adapter_v2": frozenset()}


def _ids(rng: random.Random, count: int, vocab_size: int, *, avoid: int) -> list[int]:
    """``count`` distinct ids below ``vocab_size - 1`` (the filler token), none equal to ``avoid``."""
    return [i for i in rng.sample(range(vocab_size - 1), count + 1) if i != avoid][:count]


def _phase(entry: dict[str, Any], cycle: int) -> int:
    """Where a request's cycle starts, from its own ids (requests are seeded apart)."""
    first = entry["phrases"][0] if entry["kind"] == "banned_phrases" else entry["start_token_ids"]
    return int(first[0]) % cycle


def next_token(payload: list[dict[str, Any]], generated: int, *, vocab_size: int) -> int:
    """The token a request of this payload emits after ``generated`` tokens: the forced one for
    ``forced_sequence``, else the filler token ``vocab_size - 1``, which no payload names."""
    entry = payload[0]
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
    raise ValueError(f"unknown benchmark kind {kind!r}; expected one of {', '.join(KINDS)}")
