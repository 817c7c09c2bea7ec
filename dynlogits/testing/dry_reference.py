"""llama.cpp's DRY sampler restated step by step in plain Python, for the oracle and the tests.

Written from ``src/llama-sampling.cpp`` (``get_overlapping_token_sequences``, ``llama_sampler_init_dry``,
``llama_sampler_dry_apply``), independently of ``dynlogits.processors.dry`` (which finds the same match
lengths another way): the breakers matched against each token's text, the rep limit from the nearest
breaker, the match lengths by the Z-algorithm over the reversed window, the longest repeat each next
token would extend, and the penalty ``multiplier * base ** (length - allowed_length)`` with llama.cpp's
float32 exponent clamp. Where llama.cpp runs its tokenizer on a breaker's rest, this spells the rest
with the vocabulary's texts, longest first, lowest id on a tie (docs/specs.md, ``dry``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEFAULT_BREAKERS", "LOOKBACK_ALL", "dry_penalties", "resolve_breakers"]

#: llama.cpp's default breakers.
DEFAULT_BREAKERS = ("\n", ":", '"', "*")
#: What ``penalty_last_n: -1`` means (``dynlogits.specs.builtin.dry.MAX_DRY_LOOKBACK``).
LOOKBACK_ALL = 2048
_TAIL_TOKENS = 20


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _tokenize(text: str, vocabulary: Sequence[str]) -> list[int] | None:
    """``text`` spelled with vocabulary texts, the longest that fits first, the lowest id on a tie."""
    out: list[int] = []
    i = 0
    while i < len(text):
        best, best_len = None, 0
        for token, piece in enumerate(vocabulary):
            if piece and len(piece) > best_len and text.startswith(piece, i):
                best, best_len = token, len(piece)
        if best is None:
            return None
        out.append(best)
        i += best_len
    return out


def resolve_breakers(breakers: Sequence[str], vocabulary: Sequence[str]) -> list[tuple[int, list[int]]]:
    """(head id, tail ids) pairs, as ``get_overlapping_token_sequences`` emplaces them: a token whose
    text holds the breaker with an empty tail; a token whose text ends with a proper prefix of the
    breaker with the rest's tokens (at most 20), once per distinct tail."""
    pairs: list[tuple[int, list[int]]] = []
    for breaker in breakers:
        for token in range(len(vocabulary)):
            word = vocabulary[token]
            if breaker in word:
                pairs.append((token, []))
                continue
            pos = word.find(breaker[0])
            while pos != -1:
                i = 1
                match = True
                while i < len(breaker) and pos + i < len(word):
                    if word[pos + i] != breaker[i]:
                        match = False
                        break
                    i += 1
                if match:
                    tail = _tokenize(breaker[i:], vocabulary)
                    if tail is not None:
                        tail = tail[:_TAIL_TOKENS]
                        if (token, tail) not in pairs:
                            pairs.append((token, tail))
                pos = word.find(breaker[0], pos + 1)
    return pairs


def dry_penalties(entry: Mapping[str, Any], context: Sequence[int], vocabulary: Sequence[str] | None = None
                  ) -> dict[int, float]:
    """Token id -> the penalty llama.cpp's DRY subtracts from its logit after ``context`` (the tokens
    accepted so far: the prompt's and the output's, oldest first; negative ids are placeholders,
    equal to nothing). ``entry`` is a ``dry`` entry as a wire dict."""
    multiplier = float(entry["multiplier"])
    base = float(entry.get("base", 1.75))
    allowed = int(entry.get("allowed_length", 2))
    last_n = int(entry.get("penalty_last_n", -1))
    breakers = entry.get("sequence_breakers", DEFAULT_BREAKERS)
    if multiplier == 0.0 or base < 1.0 or last_n == 0:
        return {}
    if breakers and vocabulary is None:
        raise ValueError("breakers need a vocabulary")
    pairs = resolve_breakers(breakers, vocabulary) if breakers and vocabulary is not None else []
    effective = LOOKBACK_ALL if last_n == -1 else last_n
    # the ring buffer: the last ``effective`` tokens; placeholders made distinct from every token
    ring = [t if t >= 0 else -1 - i for i, t in enumerate(context)][-effective:] if context else []

    def rat(i: int) -> int:  # i-th token from the end
        return ring[len(ring) - 1 - i]

    size = len(ring)
    if size <= allowed:
        return {}
    # step 1: the nearest breaker limits how far back a repeat may reach
    rep_limit = size
    for i in range(size):
        token = rat(i)
        tails = [tail for head, tail in pairs if head == token]
        if not tails:
            continue
        longest = -1
        for tail in tails:
            if longest < len(tail) <= i and all(tail[o] == rat(i - o - 1) for o in range(len(tail))):
                longest = len(tail)
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return {}
    # step 2: Z-algorithm over the reversed window
    count = [0] * size
    last = size - 1
    lt = rt = 0
    for k in range(1, size):
        if k > rt:
            n = 0
            while n + k < size and rat(n) == rat(n + k):
                n += 1
            count[last - k] = min(n, rep_limit)
            if n > 0:
                lt, rt = k, k + n - 1
        else:
            p = k - lt
            right = rt - k + 1
            if count[last - p] < right:
                count[last - k] = min(count[last - p], rep_limit)
            else:
                i = rt + 1
                while i < size and rat(i) == rat(i - k):
                    i += 1
                count[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    # step 3: the longest repeat each next token would extend
    longest_for: dict[int, int] = {}
    for i in range(size - 1):
        if count[i] >= allowed:
            token = rat(size - 2 - i)
            if longest_for.get(token, -1) < count[i]:
                longest_for[token] = count[i]
    # step 4: the penalty, the exponent clamped so base ** exponent stays within float32
    b32 = _f32(base)
    max_exp = int(_f32(_f32(88.7228391) / _f32(math.log(b32)))) if b32 > _f32(1.000001) else 0
    single = {head for head, tail in pairs if not tail}
    out: dict[int, float] = {}
    for token, length in longest_for.items():
        if token < 0 or token in single:
            continue
        exp = length - allowed
        if max_exp > 0 and exp > max_exp:
            exp = max_exp
        out[token] = multiplier * base ** exp
    return out
