"""The Triton kernels of ``forced.py`` (imported only by ``forced.kernels()``: importing this module
imports Triton). Contract and what checks it: ``dynlogits.kernels.forced``.

Specialization: the package rule (``dynlogits.kernels``): every runtime int in ``do_not_specialize``,
every pointer in ``do_not_specialize_on_alignment``."""

# ruff: noqa: ANN001, ANN202, N803
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["decide_rows", "fill_rows", "pick_decide_rows"]


@triton.jit(do_not_specialize=("picked_s0", "if_dead_s0", "chosen_s0", "n"), do_not_specialize_on_alignment=("flat_ptr",
            "picked_ptr", "if_dead_ptr", "stops_ptr", "chosen_ptr", "dead_ptr"))
def decide_rows(flat_ptr, picked_ptr, picked_s0, picked_s1, if_dead_ptr, if_dead_s0, if_dead_s1, stops_ptr, chosen_ptr,
                chosen_s0, chosen_s1, dead_ptr, n, PLANES: tl.constexpr, HAS_STOPS: tl.constexpr,
                BLOCK: tl.constexpr):
    """One program per ``BLOCK`` member rows: each row's forced logit read (``picked`` plane 0, a flat
    index), whether it is ``-inf`` stored in ``dead``, and per plane ``if_dead`` where it is (plane 0
    only where the row can stop, when ``HAS_STOPS``) else ``picked``, stored in ``chosen``."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    inside = i < n
    index = tl.load(picked_ptr + i * picked_s1, mask=inside, other=0)
    kept = tl.load(flat_ptr + index, mask=inside, other=0.0)
    dead = kept == float("-inf")
    if HAS_STOPS:
        stops = tl.load(stops_ptr + i, mask=inside, other=0) != 0
    else:
        stops = dead | True
    for plane in tl.static_range(PLANES):
        live = tl.load(picked_ptr + plane * picked_s0 + i * picked_s1, mask=inside, other=0)
        gone = tl.load(if_dead_ptr + plane * if_dead_s0 + i * if_dead_s1, mask=inside, other=0)
        swap = (dead & stops) if plane == 0 else dead
        tl.store(chosen_ptr + plane * chosen_s0 + i * chosen_s1, tl.where(swap, gone, live), mask=inside)
    tl.store(dead_ptr + i, dead, mask=inside)


@triton.jit(do_not_specialize=("stride", "vocab"), do_not_specialize_on_alignment=("logits_ptr", "rows_ptr",
            "chosen_ptr", "dead_ptr", "stops_ptr"))
def fill_rows(logits_ptr, stride, rows_ptr, chosen_ptr, chosen_s1, dead_ptr, stops_ptr, vocab, HAS_STOPS: tl.constexpr,
              BLOCK: tl.constexpr):
    """One program per (member row, block of ``BLOCK`` columns): the row's columns ``-inf`` but its
    target (``chosen`` plane 0, a flat index), which gets ``0.0``, or ``-inf`` where the row's token is
    masked and it cannot stop (``HAS_STOPS``)."""
    k = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + k).to(tl.int64)
    target = tl.load(chosen_ptr + k * chosen_s1) - row * stride
    value = 0.0
    if HAS_STOPS:
        masked = (tl.load(dead_ptr + k) != 0) & (tl.load(stops_ptr + k) == 0)
        value = tl.where(masked, float("-inf"), 0.0)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    out = tl.where(cols == target, value, float("-inf"))
    tl.store(logits_ptr + row * stride + cols, out.to(logits_ptr.dtype.element_ty), mask=cols < vocab)


@triton.jit(do_not_specialize=("bounds_s0", "width", "table_s0", "table_s1", "pick_s0", "chosen_s0", "n"),
            do_not_specialize_on_alignment=("flat_ptr", "rows_ptr", "values_ptr", "bounds_ptr", "table_ptr",
            "stops_ptr", "pick_ptr", "chosen_ptr", "dead_ptr"))
def pick_decide_rows(flat_ptr, rows_ptr, values_ptr, bounds_ptr, bounds_s0, bounds_s1, width, table_ptr, table_s0,
                     table_s1, table_s2, stops_ptr, pick_ptr, pick_s0, pick_s1, chosen_ptr, chosen_s0, chosen_s1,
                     dead_ptr, n, IDENTITY: tl.constexpr, HAS_STOPS: tl.constexpr, BLOCK: tl.constexpr,
                     WBLOCK: tl.constexpr):
    """``decide_rows`` after the pick: per member row ``i`` the column ``c`` = how many of its
    ``width`` bounds are at most its value (``values[i]``, or ``values[rows[i]]`` unless
    ``IDENTITY``), the six planes ``table[:, i, c]`` stored in ``pick``, then the three live planes
    (``0..2``) against the three masked ones (``3..5``) as ``decide_rows`` picks them."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    inside = i < n
    if IDENTITY:
        at = i
    else:
        at = tl.load(rows_ptr + i, mask=inside, other=0).to(tl.int64)
    value = tl.load(values_ptr + at, mask=inside, other=0).to(tl.int64)
    column = tl.zeros([BLOCK], tl.int64)
    for start in range(0, width, WBLOCK):
        j = start + tl.arange(0, WBLOCK).to(tl.int64)
        cell = inside[:, None] & (j[None, :] < width)
        bound = tl.load(bounds_ptr + i[:, None] * bounds_s0 + j[None, :] * bounds_s1, mask=cell, other=0).to(tl.int64)
        column += tl.sum((cell & (bound <= value[:, None])).to(tl.int64), axis=1)
    cell = table_ptr + i * table_s1 + column * table_s2
    index = tl.load(cell, mask=inside, other=0)
    kept = tl.load(flat_ptr + index, mask=inside, other=0.0)
    dead = kept == float("-inf")
    if HAS_STOPS:
        stops = tl.load(stops_ptr + i, mask=inside, other=0) != 0
    else:
        stops = dead | True
    for plane in tl.static_range(3):
        live = tl.load(cell + plane * table_s0, mask=inside, other=0)
        gone = tl.load(cell + (plane + 3) * table_s0, mask=inside, other=0)
        tl.store(pick_ptr + plane * pick_s0 + i * pick_s1, live, mask=inside)
        tl.store(pick_ptr + (plane + 3) * pick_s0 + i * pick_s1, gone, mask=inside)
        swap = (dead & stops) if plane == 0 else dead
        tl.store(chosen_ptr + plane * chosen_s0 + i * chosen_s1, tl.where(swap, gone, live), mask=inside)
    tl.store(dead_ptr + i, dead, mask=inside)
