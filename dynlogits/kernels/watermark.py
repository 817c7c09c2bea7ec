"""Triton kernels of the ``watermark`` kind (vLLM 0.32's Philox Gumbel-max watermark): the draw
(and its forcing) and the context absorb, bit for bit ``processors.watermark_prf`` and the eager
draw where the float ops match (see below). Triton is imported when ``kernels()`` is first called
(by a CUDA implementation, or a test that set ``TRITON_INTERPRET=1`` first); this module imports
nothing from the rest of the package.

* ``draw(logits, rows, slots, temperature, params, states, fire, force)``: two launches. The first
  (grid rows x vocabulary blocks) computes, for each id ``t`` of row ``rows[i]``, the Philox word
  of ``(t >> 2, s0, s1, s2)`` under ``(key_lo ^ s3, key_hi ^ 0x574D544B)`` (uint32, ``umulhi``),
  word ``t & 3``; the uniform ``float32(float64(m + 1) / (2**24 + 1))`` of its top 24 bits ``m``;
  the score ``logit / T + (-log(-log(max(u, tiny))))`` in the eager draw's order (``div_rn`` and
  libdevice ``log``); and each block's maximum (NaN first, as ``torch.argmax``), its lowest index
  and the logit there. The second (same grid) reduces a row's block maxima to its token (the lowest
  index among ties, the first NaN if any: ``torch.argmax``'s), block ``0`` writes it, and where
  ``force`` and the row fires (``fire[i] != 0``, or every row when ``fire`` is ``None``) each block
  writes ``-inf`` over its part of the row and, at the token, ``0.0`` (or ``-inf`` where the logit
  there was ``-inf``: masks kept). The logit at the token comes from the first kernel, so no
  program reads what another overwrote.
* ``absorb(keys, contexts, widths)``: one launch, ``watermark_prf.absorb``.

What the interpreter (``TRITON_INTERPRET=1``, CPU) checks and what it does not: the integer work
(Philox, the absorb, the word choice, the 24-bit mantissa, the float64 division and its rounding
to float32, the argmax's ties and NaN) runs as numpy integer and IEEE float ops, so the uniforms and
states are checked bit for bit against the eager reference there. ``libdevice.log`` runs as
numpy's ``log`` in the interpreter, which differs from torch's CPU ``log`` in the last bit for many
inputs: on the CPU the scores are checked against the same formula in numpy float32, not against
torch. On a GPU the kernel's ``log`` is libdevice's ``__nv_logf`` and torch's CUDA ``log`` is the
CUDA math library's ``logf`` (the same code), ``x / T`` is ``div_rn`` as torch's; that the bits then
equal the eager CUDA draw is only checked on a GPU (``python -m dynlogits.testing.cuda.check
--watermark-only``, and the group's probe at its first use)."""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["BLOCK", "ROWS", "absorb", "draw", "kernels"]

#: ids per program of the draw (a power of two)
BLOCK = 1024
#: rows per program of the absorb
ROWS = 64


@functools.cache
def kernels() -> Any:
    """The jitted kernels' module (Triton imported here, once)."""
    from . import _watermark_triton

    return _watermark_triton


def draw(logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, temperature: torch.Tensor,
         params: torch.Tensor, states: torch.Tensor, fire: torch.Tensor | None, force: bool,
         scores: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The Gumbel-max token of each row ``rows[i]`` of ``logits`` (``[batch, vocab]``, last dim
    contiguous), at ``temperature[slots[i]]`` (a ``[slots, 1]`` table) with the key words
    ``params[slots[i], :2]`` (``[slots, 4]`` int64) and PRF state ``states[i]`` (``[n, 4]`` int64, any
    strides): ``[n]`` int64. ``scores`` (tests): two ``[n, vocab]`` float32 tensors that get every
    id's uniform and score. ``force``: each firing row (``fire[i] != 0``; ``None``: all) forced to
    its token in place, keeping masks. Two launches (see the module doc)."""
    k = kernels()
    n, vocab = rows.shape[0], logits.shape[1]
    tokens = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n == 0:
        return tokens
    nblocks = (vocab + BLOCK - 1) // BLOCK
    best = torch.empty(n, nblocks, dtype=torch.float32, device=logits.device)
    index = torch.empty(n, nblocks, dtype=torch.int32, device=logits.device)
    kept = torch.empty(n, nblocks, dtype=torch.float32, device=logits.device)
    assert logits.stride(1) == 1, "logits: the vocabulary dimension must be contiguous"
    grid = (n, nblocks)
    k.draw_blocks[grid](logits, logits.stride(0), rows, slots, temperature, temperature.stride(0), params,
                        params.stride(0), states, states.stride(0), states.stride(1), best, index, kept, vocab, nblocks,
                        *(scores if scores is not None else (best, best)), BLOCK=BLOCK, SCORES=scores is not None)
    nb = max(16, 1 << max(0, (nblocks - 1).bit_length()))
    k.draw_reduce[grid](logits, logits.stride(0), rows, fire if fire is not None else rows, best, index, kept, tokens,
                        vocab, nblocks, BLOCK=BLOCK, NB=nb, HAS_FIRE=fire is not None, FORCE=force)
    return tokens


def absorb(keys: torch.Tensor, contexts: torch.Tensor, widths: torch.Tensor | None) -> torch.Tensor:
    """``watermark_prf.absorb``: ``keys`` ``[n, 2]``, ``contexts`` ``[n, W]`` (ids, any strides), ``widths`` ``[n]`` or ``None``: ``[n, 4]`` int64. One launch."""
    k = kernels()
    n, width = contexts.shape
    out = torch.empty(n, 4, dtype=torch.int64, device=contexts.device)
    if n == 0:
        return out
    k.absorb_rows[((n + ROWS - 1) // ROWS,)](keys, keys.stride(0), keys.stride(1), contexts, contexts.stride(0),
                                            contexts.stride(1),
                                            widths if widths is not None else keys,
                                            widths.stride(0) if widths is not None else 0, out, n, WIDTH=width,
                                            HAS_WIDTHS=widths is not None, ROWS=ROWS)
    return out
