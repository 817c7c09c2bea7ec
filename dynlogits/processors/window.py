"""Each row's last tokens, read on the device, for groups decided from them (``modes.WindowDecided``)
on engines whose histories live on the device (Model Runner V2): no read back.

The engine gives, per step, every slot's tokens (``tokens[slot, position]``: prompt, then the
committed generated tokens), each slot's prompt length, and per row the position of the token it
was fed (``pos``). A row without drafts was fed its slot's last committed token; under speculative
decoding a request has one row per draft, row ``r`` with ``local_pos[r] = k`` drafts before it,
fed at rows ``r - k .. r`` the last committed token then its drafts (``input_ids``), so those
positions are read from ``input_ids``. This is vLLM's Model Runner V2 contract (0.32,
``vllm/v1/worker/gpu/sample/logits_processor/interface.py``, ``LogitsContext``: committed tokens
live in ``req_states.all_token_ids`` up to ``total_len``, this step's drafts only in ``input_ids``,
a row's exact length on the device is ``pos + 1``); ``post_update``
(``vllm/v1/worker/gpu/input_batch.py``) writes each step's sampled tokens into ``all_token_ids``
before the next step samples."""

from __future__ import annotations

import torch

__all__ = ["TokenWindow", "cached_arange"]

#: how many sizes ``cached_arange`` keeps before starting over
ARANGES_KEPT = 64


def cached_arange(cache: dict[int, torch.Tensor], n: int, device: torch.device) -> torch.Tensor:
    """``arange(n)`` on ``device``, kept in ``cache`` per ``n`` (started over past ``ARANGES_KEPT``
    sizes): one upload per new size, none per step."""
    made = cache.get(n)
    if made is None:
        if len(cache) > ARANGES_KEPT:
            cache.clear()
        made = cache[n] = torch.arange(n, device=device)
    return made


class TokenWindow:
    """The engine's token source, set for each step by ``at`` (see the module doc)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._columns: dict[int, torch.Tensor] = {}  # width -> offsets ``1 - width .. 0``, kept across steps
        self._rows: dict[int, torch.Tensor] = {}  # row count -> ``arange``
        self.tokens = self.prompt_len = self.pos = torch.empty(0, dtype=torch.long, device=self.device)
        self.input_ids: torch.Tensor | None = None
        self.local_pos: torch.Tensor | None = None

    def at(self, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
           input_ids: torch.Tensor | None = None, local_pos: torch.Tensor | None = None) -> TokenWindow:
        """This step's source: ``tokens`` ``[slots, max_len]``, ``prompt_len`` per slot, ``pos`` per
        row; ``input_ids``/``local_pos`` per row only when a request may have drafts."""
        self.tokens, self.prompt_len, self.pos = tokens, prompt_len, pos
        self.input_ids, self.local_pos = input_ids, local_pos
        return self

    def slots(self, slot_of_row: torch.Tensor) -> torch.Tensor:
        """``slot_of_row`` within the engine's slots (a sentinel row past them reads the last slot:
        callers mask such rows themselves)."""
        return slot_of_row.clamp(max=self.tokens.shape[0] - 1)

    def _offsets(self, width: int) -> torch.Tensor:
        offsets = self._columns.get(width)
        if offsets is None:
            offsets = self._columns[width] = torch.arange(1 - width, 1, device=self.device)
        return offsets

    def _arange(self, n: int) -> torch.Tensor:
        return cached_arange(self._rows, n, self.device)

    def tail(self, slots: torch.Tensor, width: int) -> torch.Tensor:
        """Per row, the ``width`` tokens ending with the one it was fed (``[rows, width]``, positions
        ``pos - width + 1 .. pos``). A column before the sequence's start holds an arbitrary token,
        so callers check positions against ``prompt_len`` themselves; a placeholder draft (``-1``, a
        request still in prefill, whose rows the runner discards) is read as it is.
        ``slots``: ``slots(slot_of_row)``."""
        return self._read(slots, self.pos[:, None] + self._offsets(width))

    def head(self, slots: torch.Tensor, width: int, first: torch.Tensor | None = None) -> torch.Tensor:
        """Per row, its first ``width`` generated tokens (``[rows, width]``, positions ``prompt_len ..
        prompt_len + width - 1``), or from ``first[r]`` on (int64 per row: a scoped entry's stretch);
        a column past the row's own position (``pos``) holds an arbitrary token, so callers check
        lengths themselves. ``slots``: ``slots(slot_of_row)``."""
        start = self.prompt_len[slots].long() if first is None else first
        columns = start[:, None] + self._arange(width)[None, :]
        return self._read(slots, torch.minimum(columns, self.pos[:, None]))

    def _read(self, slots: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """The tokens at ``columns`` (``[rows, width]``, each at most the row's ``pos``): committed ones
        from the matrix, the drafts fed before the row from ``input_ids``."""
        window = self.tokens[slots[:, None], columns]  # negative columns wrap within the row: arbitrary, as documented
        if self.input_ids is None or self.local_pos is None:
            return window
        back = self.pos[:, None] - columns  # how many positions before the row's own each column is
        fed = back <= self.local_pos.long()[:, None]  # fed at row r - back: the last committed token or a draft
        inputs = self.input_ids[(self._arange(len(self.pos))[:, None] - back).clamp(min=0)]
        return torch.where(fed, inputs.long(), window.long())
