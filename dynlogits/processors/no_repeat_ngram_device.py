"""``no_repeat_ngram`` decided on the device, from the step's ``TokenWindow`` (Model Runner V2: the
rows' histories live on the device): no history read back, no sync.

Per row of the step (gathered: every row, members masked), with a window of ``W`` tokens (the
engine's matrix width, vLLM's ``max_model_len``, or where every member's prompt and ``max_tokens``
are known the longest of those sums: ``NoRepeatNgramTemplate.positions``) and the group's largest
size ``S``:

1. the row's last ``W`` tokens, ending with the one it was fed (committed ones from
   ``all_token_ids``, this step's drafts from ``input_ids``); a column before the row's history
   (position 0 with ``include_prompt``, else the prompt's length; a non-member row's starts past
   every column) or holding a placeholder becomes a value of its own (``-1 - column``), equal to
   nothing, so no n-gram holding one matches and no token is taken from it;
2. the window unfolded into its ``S - 1``-token windows (a view), each compared with the row's last
   ``S - 1`` tokens, the columns before the row's own ``size - 1`` ignored: a window that matches
   bans the token after it (a token of the row's history: not a placeholder, not outside);
3. a prefill chunk's row (fed before the prompt's last token; vLLM discards its sample) bans
   nothing: its history start is moved past its own position;
4. every ban written with one ``scatter_reduce_`` (``amin``: ``-inf`` at a ban, ``+inf`` elsewhere,
   so repeats and non-members leave logits as they are).

The row equals ``banned_after(history, size)`` (transformers' ``NoRepeatNGramLogitsProcessor``),
``history`` the prompt and the output with ``include_prompt``, else the output.

Work per step (the device-work bound): ``rows * W * (S - 1)`` compares (bytes), ``S <= 8``, and a
few ``[rows, W]`` tensors (int64 and bool), e.g. 64 rows, ``W`` 8192, ``S`` 4: 1.5 MB of compares,
4 MB per int64 tensor; sizes above ``MAX_DEVICE_SIZE`` are hosted (``NoRepeatNgramGroup.fits_window``)."""

from __future__ import annotations

import torch

from .window import TokenWindow

__all__ = ["CHUNK", "MAX_DEVICE_SIZE", "NEVER", "Constants", "constants", "device_bans"]

#: The largest ``size`` decided on the device: each step compares ``rows * max_model_len * (size - 1)``
#: cells; common settings are 2 to 5 (transformers', TensorRT-LLM's). Larger sizes are hosted.
MAX_DEVICE_SIZE = 8
#: A non-member row's history start: past every column, so it bans nothing.
NEVER = 1 << 40
#: ``CHUNK * (prompt_len - 1 - pos)``: past every position where positive (a prefill chunk's row),
#: at most 0 otherwise.
CHUNK = 1 << 32

#: ``(offsets, outside, columns)``: a window's positions relative to the row's (``1 - W .. 0``), the
#: values standing for its columns outside the history (``-1 - column``), and ``0 .. S - 2``.
Constants = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def constants(width: int, size: int, device: torch.device) -> Constants:
    columns = torch.arange(width, device=device)
    return columns - (width - 1), -1 - columns, torch.arange(max(size - 1, 0), device=device)


def device_bans(window: TokenWindow, slots: torch.Tensor, start: torch.Tensor, chunk: torch.Tensor,
                unused: torch.Tensor | None, size: int, consts: Constants) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the token after each of its ``W - S + 1`` windows of ``S - 1`` tokens (negative where
    it is none: clamp before indexing) and whether it is banned (``[rows, W - S + 1]`` each). ``slots``: the rows' slots within
    the engine's; ``start``: each row's first history position (``NEVER``: not a member); ``chunk``:
    ``CHUNK * (prompt_len - 1)`` per row (a row fed before the prompt's last token is a prefill
    chunk's, whose sample the runner discards: it bans nothing, so it never leaves its row empty);
    ``unused`` ``[rows, S - 1]``: the columns before the row's own ``size - 1`` (``None``: every row's
    size is ``S``); ``size``: ``S``."""
    offsets, outside, _ = consts
    at = window.pos[:, None] + offsets  # [rows, W] positions, the last the row's own
    tokens = window._read(slots, at)  # a negative column wraps within the row: outside, replaced below
    start = torch.maximum(start, torch.sub(chunk, window.pos, alpha=CHUNK))  # a chunk's row: past its own position
    inside = (at >= start[:, None]) & (tokens >= 0)
    tokens = torch.where(inside, tokens, outside)
    followed, known = tokens[:, size - 1:], inside[:, size - 1:]  # the token after each window, whether it is one
    if size > 1:
        tail = tokens[:, tokens.shape[1] - size + 1:]
        windows = tokens[:, :-1].unfold(1, size - 1, 1)  # [rows, W - S + 1, S - 1]
        same = windows == tail[:, None, :]
        match = (same if unused is None else same | unused[:, None, :]).all(2) & known
    else:
        match = known
    return followed, match
