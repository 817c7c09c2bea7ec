"""``dry`` decided on the device, from the step's ``TokenWindow`` (Model Runner V2: the rows'
histories live on the device): no history read back, no sync.

Per row of the step (gathered: every row, members masked), with the group's window ``W`` (its
members' largest look-back) and repeat bound ``C`` (their largest cap: ``allowed_length`` plus
llama.cpp's exponent clamp, at most ``W``):

1. the row's last ``W`` tokens (committed ones from ``all_token_ids``, this step's drafts from
   ``input_ids``); a column before the row's window (its look-back, or the prompt without
   ``include_prompt``) or holding a placeholder becomes a value of its own, equal to nothing;
2. breakers: each column's token looked up in the slot's sorted single-token breakers
   (``searchsorted``); the nearest one limits the repeats to the tokens after it;
3. match lengths: the window reversed and unfolded into ``[rows, W, C]`` (position ``p``'s ``C``
   tokens back from it) compared with the window's own last ``C`` tokens; the length is the first
   mismatch (``argmin`` over a trailing mismatch column), capped by the limit and the row's cap;
4. each position whose length is at least ``allowed_length`` penalizes the token after it (not a
   breaker, not a placeholder) by the slot's amount for that length (a table written at admission,
   ``multiplier * base ** exponent`` as llama.cpp computes it); every position's lowered value is
   computed as the host computes it and the rows take, per id, the lowest (``scatter_reduce_``
   ``amin``: the largest penalty, as the host's longest repeat), so a row equals the hosted path's.

Memory per step: ``rows * W * C`` bytes a few times (64 rows, ``W`` 2048, ``C`` 160: about 21 MB
each). Templates with multi-token breakers, or a cap above ``MAX_DEVICE_CAP`` (a base below about 1.42,
or no clamp at all, base 1, with a look-back above it), are hosted."""

from __future__ import annotations

import torch

from .window import TokenWindow

__all__ = ["MAX_DEVICE_CAP", "Constants", "MAX_DEVICE_SINGLES", "NO_BREAKER", "constants", "device_penalties", "lower_rows"]

#: The longest repeat measured on the device (``allowed_length`` plus the exponent clamp, at most the
#: look-back): base 1.75 with the default ``allowed_length`` is 160, base 1.5 is 220.
MAX_DEVICE_CAP = 256
#: Single-token breakers one slot may hold on the device (a breaker in many token texts, such as
#: ``"\n"``, matches thousands of ids).
MAX_DEVICE_SINGLES = 1 << 16
#: The value that pads a slot's sorted breakers (no token id reaches it).
NO_BREAKER = 1 << 62


Constants = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def constants(width: int, cap: int, device: torch.device) -> Constants:
    """What ``device_penalties`` reuses across steps for a window of ``width`` and a bound ``cap``:
    the columns ``0 .. width - 1`` and ``1 .. width``, the values standing for columns outside a
    window (``-1 - column``, each its own) and ``cap - 1`` more past them (padding the reversed
    window, equal to nothing)."""
    columns = torch.arange(width, device=device)
    return columns, columns + 1, -1 - columns, -1 - width - torch.arange(max(cap - 1, 0), device=device)


def device_penalties(window: TokenWindow, slot_of_row: torch.Tensor, member: torch.Tensor, params: torch.Tensor,
                     singles: torch.Tensor, amounts: torch.Tensor, width: int, cap: int,
                     consts: Constants) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the ids after each of its last ``width - 1`` positions (``[rows, width - 1]``, a
    placeholder or a column outside the window read as 0) and each one's penalty (float64, 0 where
    the position penalizes nothing). ``params`` ``[rows, 4]``: allowed length, look-back, whether the
    prompt counts, the row's own cap; ``singles`` ``[rows, S]`` sorted; ``amounts`` ``[rows, T]``."""
    columns, counted, outside, pad = consts
    slots = window.slots(slot_of_row)
    pos = window.pos.long()
    at = (pos - (width - 1))[:, None] + columns  # [rows, W] positions
    tokens = window._read(slots, at.clamp(min=0)).long()
    allowed, lookback, with_prompt, own_cap = params[:, 0], params[:, 1], params[:, 2], params[:, 3]
    start = torch.maximum(pos + 1 - lookback, torch.where(with_prompt > 0, 0, window.prompt_len[slots].long()))
    inside = (at >= start[:, None]) & (tokens >= 0)
    tokens = torch.where(inside, tokens, outside)  # each a value of its own
    found = torch.searchsorted(singles, tokens).clamp_(max=singles.shape[1] - 1)
    breaks = singles.gather(1, found) == tokens  # [rows, W]
    limit = torch.minimum(width - (counted * breaks).amax(1), own_cap)  # tokens after the nearest breaker (none: W)
    # lengths: the window reversed, unfolded ``cap`` back from every position, against its end
    backwards = torch.cat((tokens.flip(1), pad.expand(len(tokens), cap - 1)), 1)
    same = backwards.unfold(1, cap, 1) == backwards[:, None, :cap]  # [rows, W (q = W-1-p), C (k back)]
    stop = torch.cat((same, same.new_zeros(same.shape[0], width, 1)), 2).to(torch.uint8).argmin(2)
    lengths = torch.minimum(stop.flip(1), limit[:, None])[:, :-1]  # [rows, W-1]: positions before the end
    after = tokens[:, 1:]
    penalizes = (lengths >= allowed[:, None]) & (after >= 0) & ~breaks[:, 1:] & member[:, None]
    exponent = (lengths - allowed[:, None]).clamp_(0, amounts.shape[1] - 1)
    penalty = torch.where(penalizes, amounts.gather(1, exponent), 0.0)
    return after.clamp(min=0), penalty


def lower_rows(logits: torch.Tensor, ids: torch.Tensor, penalty: torch.Tensor) -> None:
    """Each row's logit at ``ids[r, j]`` lowered by ``penalty[r, j]`` as the hosted processor lowers
    it (at most the dtype's largest finite value, a finite logit kept finite, ``-inf`` kept), the
    largest penalty of an id winning (``amin`` over the lowered values)."""
    info = torch.finfo(logits.dtype)
    amount = penalty.clamp_max(info.max).to(logits.dtype)
    kept = logits.gather(1, ids)
    lowered = kept - amount
    torch.maximum(lowered, kept.clamp_max(info.min), out=lowered)
    logits.scatter_reduce_(1, ids, lowered, "amin")
