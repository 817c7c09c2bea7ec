"""``no_repeat_ngram``'s fused Model Runner V2 step on host memory in C (``ban_native``): the bans of
``no_repeat_ngram_device._ban_rows`` for a step without drafts, each row's window scanned once
(positions whose token before them is the row's last token, then the rest of its n-gram), where
numpy compares every window position for every size. Built with ``native_library.NativeLibrary`` at
its first use; until it has loaded, with ``DYN_NO_REPEAT_NGRAM_NATIVE=0`` or where it cannot be
built (one warning), and for steps with drafts or other dtypes, ``_ban_rows`` (numpy) runs, with the
same bans (``tests/processors/test_no_repeat_ngram_fused_step.py`` runs every case on both)."""

from __future__ import annotations

import ctypes
import logging

import numpy as np
import torch

from .native_library import NativeLibrary

__all__ = ["ENV_SWITCH", "SOURCE", "ban_native", "library", "reset"]

log = logging.getLogger("dynlogits.processors.no_repeat_ngram_native")

#: ``DYN_NO_REPEAT_NGRAM_NATIVE=0`` keeps the numpy step.
ENV_SWITCH = "DYN_NO_REPEAT_NGRAM_NATIVE"

SOURCE = r"""#include <math.h>
#include <stdint.h>

/* n rows; rows[4 * i ..]: the row's size, its row of the token matrix, its history's first position
   (past every position: none) and the first position it decides at. Row i's window is its last w
   positions up to pos[i] (int64 where pos64, else int32); a position counts where it is at least
   the history's first (and floor[i], where floor is given) and its token is not negative. Each
   position q of the window at least s - 1 columns in (s: the group's largest size) whose token is
   an id below width, and whose size - 1 tokens before it are the row's last size - 1 tokens, all
   counting, bans its token: -inf in the row's float32 logits (stride apart). Returns the bans. */
int64_t ngram_ban(int64_t n, const int64_t *rows, int64_t w, int64_t s, const int32_t *tok, int64_t tok_cols,
                  const void *pos, int64_t pos64, const int64_t *floor, int64_t never, float *logits, int64_t stride,
                  int64_t width) {
    int64_t bans = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t *row = rows + 4 * i;
        int64_t m = row[0] - 1, start = row[2];
        int64_t p = pos64 ? ((const int64_t *)pos)[i] : ((const int32_t *)pos)[i];
        if (p < 0 || p >= tok_cols || p < row[3])
            continue;
        if (floor) {
            int64_t f = floor[i] < never ? floor[i] : never;
            if (f > start)
                start = f;
        }
        const int32_t *T = tok + row[1] * tok_cols;
        int64_t q = p - w + s;
        if (q < start + m) /* the n-gram before q inside the history: so is the tail, before p + 1 */
            q = start + m;
        if (q > p)
            continue;
        int ok = 1;
        for (int64_t k = 1; k <= m; k++)
            if (T[p + 1 - k] < 0) /* a placeholder in the tail equals nothing */
                ok = 0;
        if (!ok)
            continue;
        float *out = logits + i * stride;
        int32_t last = m > 0 ? T[p] : 0;
        for (; q <= p; q++) {
            int32_t f = T[q];
            if (f < 0 || f >= width || (m > 0 && T[q - 1] != last))
                continue;
            int64_t k = 2;
            while (k <= m && T[q - k] == T[p + 1 - k])
                k++;
            if (k > m) {
                out[f] = -INFINITY;
                bans++;
            }
        }
    }
    return bans;
}
"""

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_LIBRARY = NativeLibrary(
    "no_repeat_ngram_ban", SOURCE,
    {"ngram_ban": (_I64, [_I64, _PTR, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _I64, _PTR, _I64, _I64])}, ENV_SWITCH,
    logger=log, built="no_repeat_ngram: the native host step is built ({cc})",
    failed="no_repeat_ngram: the native host step could not be built ({why}); numpy bans every row")


def library(wait: bool = False) -> object:
    """The compiled step (``ngram_ban``), or ``None`` while it builds (the first call queues the
    build) and for good where it cannot be built or is switched off."""
    fn: object = _LIBRARY.function("ngram_ban", wait)
    return fn


def reset() -> None:
    """Forget the build (tests)."""
    _LIBRARY.reset()


def ban_native(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, rows: np.ndarray, rows_at: int,
               floor: torch.Tensor | None, never: int, width: int, size: int) -> bool:
    """The bans of ``_ban_rows`` without drafts (``rows``: ``[rows, 4]`` int64 at ``rows_at``: each
    row's size, matrix row, history's first position, first position decided at), compiled; ``False``
    (nothing done) until it has loaded or where it cannot run: float32 contiguous logits without
    grad, an int32 token matrix, int32/int64 positions, int64 floors, all contiguous."""
    fn = _LIBRARY.function("ngram_ban")
    if (fn is None or logits.dtype != torch.float32 or not logits.is_contiguous() or logits.requires_grad
            or tokens.dtype != torch.int32 or not tokens.is_contiguous() or pos.dtype not in (torch.int32, torch.int64)
            or not pos.is_contiguous() or (floor is not None and (floor.dtype != torch.int64 or not floor.is_contiguous()))):
        return False
    fn(len(rows), rows_at, width, size, tokens.data_ptr(), tokens.shape[1], pos.data_ptr(), pos.dtype == torch.int64,
       0 if floor is None else floor.data_ptr(), never, logits.data_ptr(), logits.stride(0), logits.shape[1])
    return True
