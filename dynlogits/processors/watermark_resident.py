"""``watermark`` on the resident path: every member row of one entry position drawn in one batch.

A request whose sampling truncates nothing (no ``top_k``, ``top_p`` or ``min_p`` in effect) gets a
``WatermarkTemplate``; one that truncates keeps the hosted processor (per row, after its resident
entries). Its group (``WatermarkGroup``, window-decided: ``modes.WindowDecided``) runs after every
other group of the row: groups run in entry order and the watermark is its request's last acting
entry (admission refuses one after it).

* Host histories (vLLM's V1 runner): each member row's processor decides on the host, all rows in
  one pass (``WatermarkProcessor.state``: greedy, a placeholder or a repeated context skip the row;
  else the context's PRF state, four words); the firing rows, their slots and states go up in the
  step's one non-blocking upload; then one draw over those rows.
* No host histories (Model Runner V2): every row's span of its last ``MAX_HISTORY + width`` tokens is
  read on the device from the step's ``TokenWindow`` (committed tokens from the runner's
  ``all_token_ids``, this step's drafts from ``input_ids``), the context and its repeats within
  ``MAX_HISTORY`` positions are found there, and the state is absorbed
  (``watermark_compiled.fused_window_state``: on a device one fused op, the eager reference
  ``window_decisions`` with ``watermark_prf.absorb`` on the CPU); nothing is read back.

The draw: ``argmax(logits / T + G)`` per row, ``G`` the Gumbel noise of ``uniform_from_states`` over
the vocabulary (``[rows, vocab]``), then each firing row forced to its token keeping masks (``-inf``
over the row, the token ``0.0`` or its ``-inf``). On a device (``device.type != "cpu"``: CUDA, and
the CUDA model ``SimCuda``) the draw and the forcing are one fused op
(``watermark_compiled.fused_draw_force_``: two Triton kernels on CUDA, reading the rows, their
slots' temperatures and keys and the states where they lie) and Model Runner V2's window read,
context, repeat and absorb another (``fused_window_state``: one kernel reading the runner's token
matrix and drafts where they lie): a steady step is 3 launches on either runner (V1: the upload and
the two kernels; Model Runner V2: the three kernels, 6 with drafts, where the gathered layout adds
its own). On a real CUDA device the first use per device runs a probe
(``watermark_compiled.fused_ready``: a small batch through the kernels and the eager reference,
compared exactly, one host sync at group creation); without Triton, on a compile or launch error
or a difference, one warning and the eager path (the compiled functions of ``watermark_compiled``
where ``DYNLOGITS_WATERMARK_COMPILE=1``, else eager: ``listed_draw``, ``window_decisions``,
``batched_draw``, the reference). CPU tensors always take the eager path (no Triton). Bit for bit
the hosted processor's draw (``watermark.watermark_draw``) on the same row, history, key and
temperature, where the kernels' float ops match torch's (checked bit for bit in Triton's
interpreter for the integer part and against numpy for the float part; on a GPU by the probe and
``python -m dynlogits.testing.cuda.check --watermark-only``). Rows that skip are left untouched."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from dynlogits.kernels import watermark as watermark_kernels
from dynlogits.kernels.watermark import window_span

from .modes import Decider, WindowDecided
from .ops import fill_rows, row_runs
from .slots import GatheredRows, ListedRows, StepInputs, Template, force_device_decisions
from .uploads import StepUpload
from .watermark_compiled import (
    batched_draw,
    decide,
    draw,
    draw_listed,
    fused_draw_force_,
    fused_run,
    fused_window_state,
)
from .watermark_prf import key_words
from .window import TokenWindow

__all__ = ["MAX_HISTORY", "SAMPLING_EPS", "WatermarkGroup", "WatermarkTemplate", "batched_draw"]

#: vLLM's ``_SAMPLING_EPS``: a temperature below it is greedy.
SAMPLING_EPS = 1e-5
#: How far back a repeated context is looked for (vLLM's ``deduplicate_contexts_max_history``).
MAX_HISTORY = 8192


#: ``decide_from_window``'s answer when no member samples (``apply_device_decisions`` then does nothing)
_NOTHING = torch.empty(0, 5, dtype=torch.long)


class WatermarkGroup(WindowDecided):
    """``watermark`` entries at one position, drawn in one batch (see the module doc). Tables per
    slot: the key's two words, the context width and whether the request samples (``params``), and
    the temperature (``temperature``). It forces only a token the row keeps finite (a row the
    earlier groups emptied stays empty, and they report it), so it is neither restrictive nor a
    writer of ``-inf`` that could empty a row."""

    writes_neg_inf = False

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.params = self.table(torch.long, width=4)
        self.temperature = self.table(torch.float32, pad=0.0)
        self._widths: dict[int, int] = {}  # member slot -> its context width
        self._sampling: set[int] = set()  # member slots whose request samples (the others never draw)

    def _write(self, slot: int, template: WatermarkTemplate) -> None:
        low, high = key_words(template.key)
        samples = template.temperature is not None and template.temperature >= SAMPLING_EPS
        self.params.set(slot, [low, high, template.width, int(samples)])
        self.temperature.set(slot, [template.temperature if samples else 1.0])  # type: ignore[list-item]  # set where it samples
        self._widths[slot] = template.width
        if samples:
            self._sampling.add(slot)
        else:
            self._sampling.discard(slot)

    def assign(self, slot: int, template: Template | None) -> None:
        if template is None:
            self._widths.pop(slot, None)
            self._sampling.discard(slot)
        super().assign(slot, template)

    def reads_generated(self, rows: ListedRows) -> bool:
        return False

    # -- host histories (V1 runner) -----------------------------------------------------------------
    def decide_rows(self, deciders: list[Decider], histories: Sequence[Sequence[int]],
                    fail: Callable[[int, int, Exception], None]) -> np.ndarray:
        """``[firing, 6]``: row, slot and the four state words of each member row that draws this
        step (its processor's ``state``); a row whose processor raises is passed to ``fail``."""
        made: list[tuple[int, ...]] = []
        for row, slot, processor in deciders:
            try:
                state = processor.state(histories[row])
            except Exception as exc:  # a bug must not escape the sampler: this row alone
                fail(row, slot, exc)
                continue
            if state is not None:
                made.append((row, slot, *state))
        return np.asarray(made, dtype=np.int64).reshape(len(made), 6)

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, decisions: np.ndarray,
                             upload: StepUpload) -> None:
        """Draw and force the firing rows (``decide_rows``), their values in one upload."""
        n = len(decisions)
        if not n:
            return None
        buf = upload.buffer(6 * n)
        buf[:] = decisions.T.reshape(-1)
        values = upload.upload(6 * n).view(6, n)
        rows_dev = values[0]

        drawn = (step.logits, rows_dev, values[1], self.temperature.dev, self.params.dev, values[2:].T, None)

        def fused() -> None:  # the draw and the forcing: two Triton launches on CUDA
            fused_draw_force_(*drawn)

        def eager() -> None:
            index, value = draw_listed(step.logits, step.flat, rows_dev, values[1], self.temperature.dev,
                                       self.params.dev, values[2:].T, step.stride)
            # forced keeping masks, as ``slots.force_listed``: the row filled, then its token's value
            fill_rows(step.logits, row_runs(decisions[:, 0].tolist()), rows_dev)
            step.flat.index_copy_(0, index, value)

        fused_run(step.logits.device, fused, eager, watermark_kernels.draw_variant, *drawn, True)
        return None

    # -- token window (Model Runner V2) -------------------------------------------------------------
    def decide_from_window(self, rows: GatheredRows, window: TokenWindow) -> torch.Tensor:
        """Per row of the step: ``[rows, 5]``, the four state words and whether the row draws
        (a member that samples, with no placeholder in its tokens and a context not seen within
        ``MAX_HISTORY`` positions of its output). Where ``fused_ready``: the one fused op
        ``fused_window_state``; else the eager (or compiled) read and ``decide``, the same words."""
        if not self._sampling:  # greedy members only: nothing to draw, nothing on the device
            return _NOTHING
        slot_of_row = rows.slot_of_row
        widths = set(self._widths.values())
        wide = max(widths, default=1)
        every = len(widths) == 1

        state = (window.tokens, window.prompt_len, window.pos, window.input_ids, window.local_pos, slot_of_row,
                 rows.member, self.params.dev, wide, every, MAX_HISTORY)

        def fused() -> torch.Tensor:  # the read, the decisions and the absorb: one Triton launch on CUDA
            return fused_window_state(*state)

        def eager() -> torch.Tensor:
            params = self.params.dev[slot_of_row]
            slots = window.slots(slot_of_row)
            pos = window.pos.long()
            prompt = window.prompt_len[slots].long()
            span = window_span(window.tokens.shape[1], wide, MAX_HISTORY)  # columns past the start read as before it
            start = pos - (span - 1)  # the span's first column
            at = start[:, None] + self._span_offsets(span)
            tokens = window._read(slots, at.clamp(min=0)).long()
            return decide(tokens, at, prompt, pos, params, rows.member, self._span_offsets(wide), wide, every,
                          MAX_HISTORY)

        device = slot_of_row.device  # a client's context width picks the variant: compiled off the step
        return fused_run(device, fused, eager, watermark_kernels.window_variant, *state)

    def _rows(self, n: int) -> torch.Tensor:
        """``arange(n)`` on the device, made once per ``n`` (the step's rows, in order)."""
        made = self._cache.get(f"rows{n}")
        if made is None:
            made = self._cache[f"rows{n}"] = torch.arange(n, device=self.device)
        return made

    def _span_offsets(self, span: int) -> torch.Tensor:
        offsets = self._cache.get(f"span{span}")
        if offsets is None:
            offsets = self._cache[f"span{span}"] = torch.arange(span, device=self.device)[None, :]
        return offsets

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> None:
        """Draw every row and force those that draw (``decide_from_window``); the others untouched."""
        if decisions is _NOTHING:
            return None

        drawn = (step.logits, self._rows(len(decisions)), rows.slot_of_row, self.temperature.dev, self.params.dev,
                decisions[:, :4], decisions[:, 4])

        def fused() -> None:  # the draw and the forcing of the rows that draw: two Triton launches
            fused_draw_force_(*drawn)

        def eager() -> None:
            params = self.params.dev[rows.slot_of_row]
            tokens = draw(step.logits, self.temperature.dev[rows.slot_of_row, 0], decisions[:, :4], params[:, :2],
                          batched_draw)
            force_device_decisions(step, rows, torch.where(decisions[:, 4] > 0, tokens, -1))

        fused_run(step.logits.device, fused, eager, watermark_kernels.draw_variant, *drawn, True)
        return None


@dataclass(frozen=True, slots=True)
class WatermarkTemplate(Template):
    """Every step of a request that samples: the Gumbel-max draw with the key over the ``width``
    output tokens before it, at ``temperature``, no truncation (see the module doc). The key is
    the secret: never in a repr."""

    key: int = field(repr=False)
    width: int
    temperature: float | None
    group: ClassVar[type[WatermarkGroup]] = WatermarkGroup
    reads_tokens: ClassVar[bool] = True


def resident_template(key: int, width: int, temperature: float | None, top_k: int | None, top_p: float | None,
                      min_p: float | None) -> WatermarkTemplate | None:
    """The template of a request whose sampling truncates nothing, else ``None`` (hosted)."""
    if (top_k is not None and top_k > 0) or (top_p is not None and top_p < 1) or (min_p is not None and min_p > 0):
        return None
    return WatermarkTemplate(key, width, temperature)
