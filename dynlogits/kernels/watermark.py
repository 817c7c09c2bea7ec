"""Triton kernels of the ``watermark`` kind (vLLM 0.32's Philox Gumbel-max watermark): the draw
(and its forcing) and the context absorb, bit for bit ``processors.watermark_prf`` and the eager
draw where the float ops match (see below). Triton is imported when ``kernels()`` is first called
(by a CUDA implementation, or a test that set ``TRITON_INTERPRET=1`` first); this module imports
nothing from the rest of the package but ``kernels.variants``.

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
* ``window_state(tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member, params, wide,
  every, max_history)``: one launch, Model Runner V2's decisions (``watermark_compiled
  .fused_window_state``): each program takes ``WINDOW_ROWS`` rows, reads their spans from the token
  matrix (and this step's drafts from ``input_ids``, as ``TokenWindow._read``) in blocks of
  ``WINDOW_BLOCK`` columns, finds a placeholder and the context's repeats, then absorbs the context
  (``absorb``'s rounds) and writes the state and whether the row draws. Integer work only: the
  interpreter checks it bit for bit.

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
from collections.abc import Callable, Hashable
from typing import Any

import torch

from .variants import launch_variant, launches_variant, meta_scratch

__all__ = ["BLOCK", "ROWS", "WINDOW_BLOCK", "WINDOW_ROWS", "absorb", "draw", "draw_args", "draw_variant", "kernels",
           "window_args", "window_span", "window_state", "window_variant"]

#: ids per program of the draw (a power of two)
BLOCK = 1024
#: rows per program of the absorb
ROWS = 64
#: rows per program of the window decisions, and span columns per iteration of its scan (powers of
#: two): a row a program spreads a batch over the SMs, a wide block keeps a ``MAX_HISTORY`` span to
#: a few iterations
WINDOW_ROWS = 1
WINDOW_BLOCK = 1024


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
    assert logits.stride(1) == 1, "logits: the vocabulary dimension must be contiguous"
    nblocks = _blocks(vocab)
    best = torch.empty(n, nblocks, dtype=torch.float32, device=logits.device)
    index = torch.empty(n, nblocks, dtype=torch.int32, device=logits.device)
    kept = torch.empty(n, nblocks, dtype=torch.float32, device=logits.device)
    (blocks, blocks_constexprs), (reduce, reduce_constexprs) = draw_args(
        logits, rows, slots, temperature, params, states, fire, force, best, index, kept, tokens, scores)
    grid = (n, nblocks)
    k.draw_blocks[grid](*blocks, **blocks_constexprs)
    k.draw_reduce[grid](*reduce, **reduce_constexprs)
    return tokens


def _blocks(vocab: int) -> int:
    return (vocab + BLOCK - 1) // BLOCK


_Launch = tuple[tuple[Any, ...], dict[str, Any]]


def draw_args(logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, temperature: torch.Tensor,
              params: torch.Tensor, states: torch.Tensor, fire: torch.Tensor | None, force: bool, best: torch.Tensor,
              index: torch.Tensor, kept: torch.Tensor, tokens: torch.Tensor,
              scores: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[_Launch, _Launch]:
    """``draw_blocks``' and ``draw_reduce``'s positional arguments and constexprs for ``draw``'s
    arguments and scratch (the launches and their off-step compile, ``draw_variant``, take the same)."""
    vocab = logits.shape[1]
    nblocks = _blocks(vocab)
    blocks = (logits, logits.stride(0), rows, slots, temperature, temperature.stride(0), params, params.stride(0),
              states, states.stride(0), states.stride(1), best, index, kept, vocab, nblocks,
              *(scores if scores is not None else (best, best)))
    nb = max(16, 1 << max(0, (nblocks - 1).bit_length()))
    reduce = (logits, logits.stride(0), rows, fire if fire is not None else rows, best, index, kept, tokens, vocab,
              nblocks)
    return ((blocks, {"BLOCK": BLOCK, "SCORES": scores is not None}),
            (reduce, {"BLOCK": BLOCK, "NB": nb, "HAS_FIRE": fire is not None, "FORCE": force}))


def draw_variant(logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, temperature: torch.Tensor,
                 params: torch.Tensor, states: torch.Tensor, fire: torch.Tensor | None,
                 force: bool) -> tuple[Hashable, Callable[[], object]]:
    """``launches_variant`` of ``draw``'s two launches for these arguments (the scratch as meta
    tensors: only their dtypes are keyed). Both kernels key the logits' stride and width (vector
    loads), so a width's variant differs from another's."""
    scratch = meta_scratch(torch.float32)
    (blocks, blocks_constexprs), (reduce, reduce_constexprs) = draw_args(
        logits, rows, slots, temperature, params, states, fire, force, scratch, meta_scratch(torch.int32), scratch,
        meta_scratch(torch.int64))
    return launches_variant([
        launch_variant("watermark.draw_blocks", lambda: kernels().draw_blocks, logits.device, blocks, blocks_constexprs),
        launch_variant("watermark.draw_reduce", lambda: kernels().draw_reduce, logits.device, reduce,
                       reduce_constexprs)])


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


def window_span(columns: int, wide: int, max_history: int) -> int:
    """The columns of a row's window that the decisions read: its last ``max_history + wide``
    positions, at most the matrix's ``columns`` but at least ``wide + 1`` (positions before the
    sequence are read at column 0, as ``TokenWindow._read`` reads them)."""
    return max(min(max_history + wide, columns), wide + 1)


def window_state(tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor | None,
                 local_pos: torch.Tensor | None, slot_of_row: torch.Tensor, member: torch.Tensor, params: torch.Tensor,
                 wide: int, every: bool, max_history: int, *, rows_per_program: int = WINDOW_ROWS,
                 block: int = WINDOW_BLOCK) -> torch.Tensor:
    """Model Runner V2's window decisions of every row in one launch: ``[rows, 5]`` int64, the PRF
    state of its context and whether it draws (``watermark_compiled.fused_window_state``'s
    contract). ``tokens`` ``[slots, columns]`` (any strides), ``prompt_len`` per slot, ``pos``,
    ``slot_of_row``, ``member`` per row (contiguous), ``input_ids`` and ``local_pos`` (contiguous)
    only with drafts, ``params`` the ``[slots, 4]`` table (any strides). ``rows_per_program`` and
    ``block`` (powers of two; tests) change the tiling, never the result."""
    n = pos.shape[0]
    out = torch.empty(n, 5, dtype=torch.int64, device=tokens.device)
    if n == 0:
        return out
    args, constexprs = window_args(tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member, params, wide,
                                   every, max_history, out, rows_per_program, block)
    kernels().window_decide[((n + rows_per_program - 1) // rows_per_program,)](*args, **constexprs)
    return out


def window_args(tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor | None,
                local_pos: torch.Tensor | None, slot_of_row: torch.Tensor, member: torch.Tensor, params: torch.Tensor,
                wide: int, every: bool, max_history: int, out: torch.Tensor, rows_per_program: int = WINDOW_ROWS,
                block: int = WINDOW_BLOCK) -> _Launch:
    """``window_decide``'s positional arguments and constexprs for ``window_state``'s arguments and
    output (the launch and its off-step compile, ``window_variant``, take the same)."""
    drafts = input_ids is not None and local_pos is not None
    span = window_span(tokens.shape[1], wide, max_history)
    flags = member.view(torch.uint8) if member.dtype == torch.bool else member
    args = (tokens, tokens.stride(0), tokens.stride(1), tokens.shape[0], tokens.shape[1], prompt_len, pos,
            input_ids if drafts else pos, local_pos if drafts else pos, slot_of_row, flags, params, params.stride(0),
            params.stride(1), out, pos.shape[0], span, max_history)
    return args, {"WIDE": wide, "EVERY": every, "DRAFTS": drafts, "ROWS": rows_per_program, "BLOCK": block}


def window_variant(tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor | None,
                   local_pos: torch.Tensor | None, slot_of_row: torch.Tensor, member: torch.Tensor,
                   params: torch.Tensor, wide: int, every: bool,
                   max_history: int) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``window_state``'s launch for these arguments: the widest context
    (``WIDE``, a client's ``context_width`` where the operator lets clients send the kind) is a
    constexpr, so each width is its own variant."""
    args, constexprs = window_args(tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member, params, wide,
                                   every, max_history, meta_scratch(torch.int64))
    return launch_variant("watermark.window_decide", lambda: kernels().window_decide, tokens.device, args, constexprs)
