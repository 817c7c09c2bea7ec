"""The ``watermark`` kind's pseudorandom function: vLLM 0.32's Philox watermark PRF, bit for bit.

vLLM's native Gumbel-max watermark (``vllm/v1/watermarking/prfs/philox.py``, ``PhiloxPRF``, version
``philox4x32-10-v1``) maps a 64-bit key, a context (the ``context_width`` tokens before the sampled
one, ``-1`` where the output has fewer) and a candidate token id to a uniform value in ``(0, 1)``:

1. The context is absorbed four words at a time (the last block padded with ``2**32 - 1 - i`` at
   its free index ``i``) into a Philox4x32-10 state that starts as ``(0x574D4358, width, 0, 0)``:
   each block is XORed into the state, which is then encrypted under the key
   ``(key_lo ^ block_offset, key_hi)``. Each context id enters as its low 32 bits (``-1`` is
   ``0xFFFFFFFF``).
2. A candidate ``t`` is one Philox4x32-10 call on the counter ``(t >> 2, s0, s1, s2)`` under the key
   ``(key_lo ^ s3, key_hi ^ 0x574D544B)``; of the four output words, word ``t & 3`` is taken.
3. Its top 24 bits ``m`` give ``float32((m + 1) / (2**24 + 1))`` (computed in float64).

This module computes the same values. ``uniform`` takes tensors (the context part as tensor ops,
as vLLM's CPU path does); ``context_state`` absorbs one context on the host in Python integers and
``uniform_from_state`` then derives a whole vocabulary row from it with tensor ops whose other
operands are Python integers: on CUDA that is a fixed number of kernel launches and no host
synchronization or host-to-device copy (nothing reads a device value back, nothing is uploaded).
The arithmetic is plain int64 tensor arithmetic, identical on CPU and CUDA. Torch only; no vLLM
import (``tests/processors/test_watermark_prf.py`` compares with vLLM's own ``PhiloxPRF``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

__all__ = ["MAX_KEY", "context_block", "absorb", "context_state", "gumbel_noise", "key_words", "uniform", "uniform_from_state",
           "uniform_from_states"]

#: The largest key: keys are 64-bit (vLLM's ``PhiloxPRF`` refuses larger ones).
MAX_KEY = 2**64 - 1

_MASK = 0xFFFFFFFF
_M0 = 0xD2511F53
_M1 = 0xCD9E8D57
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_CONTEXT_DOMAIN = 0x574D4358
_TOKEN_DOMAIN = 0x574D544B
_ROUNDS = 10

#: A 32-bit word: a Python int on the host or an int64 tensor holding values in ``[0, 2**32)``.
W = TypeVar("W", int, torch.Tensor)


def _mulhilo(multiplier: int, value: W) -> tuple[W, W]:
    """``(high, low)`` 32-bit halves of ``multiplier * value`` (``value`` in ``[0, 2**32)``), the
    multiplier in 16-bit halves so no partial product overflows int64: ``value * m_lo`` and
    ``value * m_hi`` are below ``2**48``, and ``low = value * m_lo + (value * m_hi mod 2**16) * 2**16``
    is below ``2**49``; the product is ``low + (value * m_hi >> 16) * 2**32``."""
    m_lo, m_hi = multiplier & 0xFFFF, multiplier >> 16
    by_hi = value * m_hi
    low = value * m_lo + ((by_hi & 0xFFFF) << 16)
    return (by_hi >> 16) + (low >> 32), low & _MASK


def _philox(counter: tuple[W, W, W, W], key: tuple[W, W]) -> tuple[W, W, W, W]:
    """Philox4x32-10 (Salmon et al., SC'11) of one counter under one key, word-wise (every word in
    ``[0, 2**32)``: XORs of such words need no mask)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    if isinstance(k0, torch.Tensor) and isinstance(k1, torch.Tensor):  # every round's key in two ops a word
        steps = _steps(k0.device)
        k0s, k1s = (k0.unsqueeze(-1) + steps[0]) & _MASK, (k1.unsqueeze(-1) + steps[1]) & _MASK
        for round_index in range(_ROUNDS):
            hi0, lo0 = _mulhilo(_M0, c0)
            hi1, lo1 = _mulhilo(_M1, c2)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0s[..., round_index], lo1, hi0 ^ c3 ^ k1s[..., round_index], lo0
        return c0, c1, c2, c3
    for round_index in range(_ROUNDS):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if round_index != _ROUNDS - 1:
            k0 = (k0 + _W0) & _MASK
            k1 = (k1 + _W1) & _MASK
    return c0, c1, c2, c3


_STEPS: dict[torch.device, torch.Tensor] = {}


def _steps(device: torch.device) -> torch.Tensor:
    """``[2, ROUNDS]``: what each round adds to the key's two words (``i * W0``, ``i * W1``), on ``device``."""
    made = _STEPS.get(device)
    if made is None:
        rounds = torch.arange(_ROUNDS, dtype=torch.int64, device=device)  # made on the device: no upload
        made = _STEPS[device] = torch.stack([rounds * _W0, rounds * _W1])
    return made


_PAIRS: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _pairs(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The multipliers' 16-bit halves as pairs ``(M0, M1)`` and the key schedule's steps ``[ROUNDS, 2]``
    (``i * W0``, ``i * W1``), made on ``device`` by device ops (no upload), once per device."""
    made = _PAIRS.get(device)
    if made is None:
        one = torch.arange(2, dtype=torch.int64, device=device)
        m_lo = one * ((_M1 & 0xFFFF) - (_M0 & 0xFFFF)) + (_M0 & 0xFFFF)
        m_hi = one * ((_M1 >> 16) - (_M0 >> 16)) + (_M0 >> 16)
        rounds = torch.arange(_ROUNDS, dtype=torch.int64, device=device)[:, None]
        steps = rounds * (one * (_W1 - _W0) + _W0)
        made = _PAIRS[device] = (m_lo, m_hi, steps)
    return made


def _philox_paired(counter: tuple[torch.Tensor, ...], key: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``_philox`` on tensors with the words in pairs, half the ops: ``a = (c0, c2)`` (both
    multiplied, one op per step of ``_mulhilo``) and ``b = (c3, c1)``; a round is ``lo -> b`` and
    ``a = flip(hi ^ b) ^ (k0, k1)`` (``hi``, ``lo`` the halves of ``a * (M0, M1)``). The same words,
    bit for bit; the four words come back broadcast to one shape."""
    c0, c1, c2, c3 = torch.broadcast_tensors(*counter)
    m_lo, m_hi, steps = _pairs(c0.device)
    a = torch.stack([c0, c2], dim=-1)
    b = torch.stack([c3, c1], dim=-1)
    schedule = (torch.stack(torch.broadcast_tensors(*key), dim=-1).unsqueeze(-2) + steps) & _MASK  # [..., ROUNDS, 2]
    for round_index in range(_ROUNDS):
        by_hi = a * m_hi
        low = a * m_lo + ((by_hi & 0xFFFF) << 16)
        hi = (by_hi >> 16) + (low >> 32)
        b_next = low & _MASK
        a = (hi ^ b).flip(-1) ^ schedule[..., round_index, :]
        b = b_next
    return a[..., 0], b[..., 1], a[..., 1], b[..., 0]


def _key_words(key: int) -> tuple[int, int]:
    if not 0 <= key <= MAX_KEY:
        raise ValueError(f"key: must be an integer in [0, 2**64 - 1]; got {'a negative' if key < 0 else 'a larger'} value")
    return key & _MASK, key >> 32


def context_state(key: int, context: Sequence[int]) -> tuple[int, int, int, int]:
    """The PRF state after absorbing ``context`` (ids, ``-1`` for "before the output"), on the
    host: ``ceil(len(context) / 4)`` Philox calls on Python integers."""
    k0, k1 = _key_words(key)
    width = len(context)
    state = (_CONTEXT_DOMAIN, width, 0, 0)
    for offset in range(0, width, 4):
        block = [int(context[offset + i]) & _MASK if offset + i < width else _MASK - i for i in range(4)]
        counter = (state[0] ^ block[0], state[1] ^ block[1], state[2] ^ block[2], state[3] ^ block[3])
        state = _philox(counter, ((k0 ^ offset) & _MASK, k1))
    return state


def _to_uniform(words: torch.Tensor) -> torch.Tensor:
    """vLLM's ``uint32_to_uniform``: the word's top 24 bits ``m`` -> ``float32((m + 1) / (2**24 + 1))``."""
    mantissa = (words & _MASK) >> 8
    return ((mantissa.to(torch.float64) + 1.0) / (2**24 + 1)).to(torch.float32)


def _select(outputs: tuple[torch.Tensor, ...], token_words: torch.Tensor) -> torch.Tensor:
    which = token_words & 3
    out = outputs[0]
    for index in range(1, 4):
        out = torch.where(which == index, outputs[index], out)
    return out


def uniform_from_state(key: int, state: tuple[int, int, int, int], token_ids: torch.Tensor) -> torch.Tensor:
    """The uniform value of each id in ``token_ids`` (any shape, int tensor, any device) for the
    context ``state`` (``context_state``) was absorbed from: float32, same shape and device. Only
    Python integers meet the tensor: no upload, no synchronization."""
    k0, k1 = _key_words(key)
    words = token_ids.to(torch.int64) & _MASK
    s0, s1, s2, s3 = state
    # The counter's last three words and both key words are host integers; the first word and,
    # from the first round on, half the state are tensors (``_philox`` mixes both kinds).
    first: torch.Tensor = words >> 2
    outputs = _philox_mixed((first, s0, s1, s2), ((k0 ^ s3) & _MASK, (k1 ^ _TOKEN_DOMAIN) & _MASK))
    return _to_uniform(_select(outputs, words))


def _philox_mixed(counter: tuple[torch.Tensor, int, int, int], key: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """``_philox`` where only the counter's first word is a tensor: the first round's
    ``mulhilo(M1, c2)`` is a host integer, so the round is split by hand (same arithmetic)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    hi0, lo0 = _mulhilo(_M0, c0)
    hi1, lo1 = _mulhilo(_M1, c2)
    n0: int = (hi1 ^ c1 ^ k0) & _MASK
    n1: int = lo1
    n2: torch.Tensor = hi0 ^ c3 ^ k1
    n3: torch.Tensor = lo0
    k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    # second round: c0 and c1 are host integers, c2 and c3 tensors
    hi0b, lo0b = _mulhilo(_M0, n0)
    hi1b, lo1b = _mulhilo(_M1, n2)
    m0 = hi1b ^ n1 ^ k0
    m1 = lo1b
    m2 = n3 ^ hi0b ^ k1
    m3 = torch.full_like(m0, lo0b)
    k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    out = (m0, m1, m2, m3)
    for round_index in range(2, _ROUNDS):
        a0, a1, a2, a3 = out
        h0, l0 = _mulhilo(_M0, a0)
        h1, l1 = _mulhilo(_M1, a2)
        out = (h1 ^ a1 ^ k0, l1, h0 ^ a3 ^ k1, l0)  # words below 2**32: no mask
        if round_index != _ROUNDS - 1:
            k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return out


def uniform_from_states(states: torch.Tensor, keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """``uniform_from_state`` for many rows at once over the ids ``0 .. vocab - 1``: ``states``
    ``[n, 4]`` (each row a ``context_state``, int64), ``keys`` ``[n, 2]`` (each row's key as its low
    and high 32-bit words, int64): ``[n, vocab]`` float32 on ``states``' device, row ``i``
    bit-identical to ``uniform_from_state(key_i, state_i, arange(vocab))``. One Philox call per
    four ids (ids ``4c .. 4c + 3`` share the counter ``c`` and take its words in order), tensor ops
    only."""
    s = states.to(torch.int64)
    k = keys.to(torch.int64)
    counters = _counters((vocab + 3) // 4, s.device)
    key = (k[:, 0:1] ^ s[:, 3:4], (k[:, 1:2] ^ _TOKEN_DOMAIN))
    outputs = _philox_paired((counters, s[:, 0:1], s[:, 1:2], s[:, 2:3]), key)
    words = torch.stack(outputs, dim=2).view(s.shape[0], -1)[:, :vocab]
    return (((words >> 8).to(torch.float64) + 1.0) / (2**24 + 1)).to(torch.float32)


_COUNTERS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _counters(n: int, device: torch.device) -> torch.Tensor:
    """``arange(n)`` as a ``[1, n]`` int64 row on ``device``, made once per width and device."""
    made = _COUNTERS.get((n, device))
    if made is None:
        if len(_COUNTERS) > 16:
            _COUNTERS.clear()
        made = _COUNTERS[(n, device)] = torch.arange(n, dtype=torch.int64, device=device)[None, :]
    return made


def context_block(ctx: torch.Tensor, zeros: torch.Tensor, widths: torch.Tensor | None, offset: int) -> list[torch.Tensor]:
    """The four words of ``ctx`` (``[n, W]``, masked to 32 bits) absorbed at ``offset``: a column
    past the context (``W``, or row ``i``'s ``widths[i]``) is the padding ``2**32 - 1 - i``
    (``zeros``: the caller's ``[n]`` int64 zeros, so the block adds no allocation op)."""
    width = ctx.shape[1]
    block = []
    for i in range(4):
        j = offset + i
        if j >= width:
            block.append(zeros + (_MASK - i))
        elif widths is None:
            block.append(ctx[:, j])
        else:
            block.append(torch.where(widths > j, ctx[:, j], _MASK - i))
    return block


def absorb(keys: torch.Tensor, contexts: torch.Tensor, widths: torch.Tensor | None = None) -> torch.Tensor:
    """``context_state`` for many rows on the device: ``keys`` ``[n, 2]`` (low, high words),
    ``contexts`` ``[n, W]`` (ids, ``-1`` before the output; row ``i``'s first ``widths[i]`` columns
    are its context, the rest ignored; ``widths`` ``None``: every row ``W``): ``[n, 4]`` int64."""
    k = keys.to(torch.int64)
    ctx = contexts.to(torch.int64) & _MASK
    n, width = ctx.shape
    zeros = torch.zeros_like(ctx[:, 0])
    state: tuple[torch.Tensor, ...] = (zeros + _CONTEXT_DOMAIN, zeros + width if widths is None else widths.to(torch.int64),
                                       zeros, zeros)
    for offset in range(0, width, 4):
        block = context_block(ctx, zeros, widths, offset)
        counter = tuple(state[i] ^ block[i] for i in range(4))
        new = _philox_paired(counter, (k[:, 0] ^ offset, k[:, 1]))
        if widths is None:
            state = new
        else:
            absorbs = widths > offset
            state = tuple(torch.where(absorbs, a, b) for a, b in zip(new, state))
    return torch.stack(state, dim=1)


def key_words(key: int) -> tuple[int, int]:
    """``key``'s low and high 32-bit words (``ValueError`` outside 64 bits, never quoting it)."""
    return _key_words(key)


def uniform(key: int, contexts: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """vLLM's ``PhiloxPRF(key).uniform(contexts, token_ids)``: ``contexts`` ``[..., width]`` (ids,
    ``-1`` before the output), ``token_ids`` broadcastable against ``[..., 1]``; float32 of the
    broadcast shape, on ``contexts``' device. All tensor ops (no synchronization on CUDA)."""
    k0, k1 = _key_words(key)
    ctx = contexts.to(torch.int64) & _MASK
    prefix = ctx.shape[:-1]
    width = ctx.shape[-1]
    device = ctx.device
    state: tuple[torch.Tensor, ...] = (
        torch.full(prefix, _CONTEXT_DOMAIN, dtype=torch.int64, device=device),
        torch.full(prefix, width, dtype=torch.int64, device=device),
        torch.zeros(prefix, dtype=torch.int64, device=device),
        torch.zeros(prefix, dtype=torch.int64, device=device),
    )
    for offset in range(0, width, 4):
        block = [ctx[..., offset + i] if offset + i < width else torch.full(prefix, _MASK - i, dtype=torch.int64, device=device)
                 for i in range(4)]
        counter = ((state[0] ^ block[0]) & _MASK, (state[1] ^ block[1]) & _MASK,
                   (state[2] ^ block[2]) & _MASK, (state[3] ^ block[3]) & _MASK)
        key0 = torch.full(prefix, (k0 ^ offset) & _MASK, dtype=torch.int64, device=device)
        key1 = torch.full(prefix, k1, dtype=torch.int64, device=device)
        state = _philox(counter, (key0, key1))
    shape = torch.broadcast_shapes(prefix + (1,), token_ids.shape)
    words = torch.broadcast_to(token_ids.to(device=device, dtype=torch.int64), shape) & _MASK
    s = [torch.broadcast_to(w.unsqueeze(-1), shape) for w in state]
    outputs = _philox((words >> 2, s[0], s[1], s[2]), ((s[3] ^ k0) & _MASK, torch.full(shape, (k1 ^ _TOKEN_DOMAIN) & _MASK, dtype=torch.int64, device=device)))
    return _to_uniform(_select(outputs, words))


def gumbel_noise(uniforms: torch.Tensor) -> torch.Tensor:
    """vLLM's Gumbel noise of the PRF's values: ``-log(-log(max(u, tiny)))`` in float32."""
    return -torch.log(-torch.log(uniforms.clamp_min(torch.finfo(torch.float32).tiny)))
