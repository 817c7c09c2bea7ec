"""``dry`` on the resident path, where the adapter gives the rows' histories on the host (vLLM's V1
runner): ``DryTemplate`` names ``DryGroup``, a decided group with no device tables.

Each step every member row is decided on the host: by one call of the native step for every row it
can step (``dry_native.NativeStep``, built at the first step; the same ids and amounts), the others
by their own processor (``DryProcessor.penalize_into``: the ids the row penalizes and each one's
amount, from the row's state kept across steps); the flat indices (``row * width + id``) and the amounts, converted to the
logits' dtype on the host and packed into 64-bit words behind the indices, go up in one
non-blocking upload, and the rows are lowered with a read, a subtraction and a write back: the
same arithmetic as the hosted processor's (a penalty is at most the dtype's largest finite value, a
finite logit stays finite, at worst the dtype's lowest, and ``-inf``, ``+inf`` and NaN stay as they
are), so the rows equal the hosted path's bit for bit. On an accelerator a steady step that penalizes is six device
ops (the upload's ``copy_``, ``index_select``, ``sub``, ``clamp_max``, ``maximum``, ``index_copy_``);
one that finds nothing to penalize, none; on the CPU, float32 logits (vLLM's sampler's) are lowered
in place element by element in Python floats (``_lower_host_view``, through a float32 view of the
tensor's memory kept per address: ``host_f32_view``), the same float32 results bit for bit without a
tensor conversion or numpy call per step (each one's first call after the sampler's copy of the
logits misses the cache: ``Tensor.numpy`` cost about 25 µs a step there). A row whose processor raises fails its request alone.

Without host histories (Model Runner V2) decided and lowered on the device from the token window
(``DryGroup``'s window methods, ``dry_device``) where the template fits, else hosted.

Scoped to a phase (``scope.ScopedDecided``: ``scopable``, ``neutral_history``; ``floored``,
``apply_floored``), a row is decided from its phase's stretch alone, as the hosted path's ``_own``
(``dry.factory`` drops the prompt with a scope): on the host from the stretch of its live list (a
row out of phase from the empty history: nothing), on the device by the same fused op with a
per-row floor (``FloorScopeTables``: the stretch's start; past every position out of phase)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from dynlogits.kernels import dry as dry_kernels

from . import dry_native
from .dry_device import (
    MAX_DEVICE_CAP,
    MAX_DEVICE_SINGLES,
    NO_BREAKER,
    Constants,
    HostRows,
    constants,
    device_penalties,
    fused_lower_,
    fused_ready,
    fused_run,
    host_rows,
    lower_rows,
    lower_window_,
)
from .dry_lowering import _F32_MAX, HOST_LOOP_MAX, _lower_host_f32, _lower_host_view, host_f32_view
from .modes import Decider, WindowDecided
from .slots import GatheredRows, Group, ListedRows, StepInputs, Template
from .uploads import StepUpload, on_accelerator
from .window import TokenWindow

logger = logging.getLogger("dynlogits.processors.dry")

__all__ = ["DryGroup", "DryTemplate", "pack_amounts", "packed_amounts", "packed_words"]

#: each logits dtype's lowest finite value
_LOWEST: dict[torch.dtype, float] = {}

#: a step's decisions: the flat indices the member rows lower and each one's amount (float64), as
#: lists, or as the native step's buffers where it decided every row that lowers anything
Decisions = tuple[list[int], list[float]] | dry_native.NativeHits


def pack_amounts(amounts: list[float], dtype: torch.dtype, out: np.ndarray) -> None:
    """``amounts`` (each at most ``dtype``'s largest finite value) in ``dtype``, as the hosted
    processor converts them, into the 64-bit words ``out`` (``packed_words(len(amounts), dtype)`` of
    them; the last one padded). float32, vLLM's sampler's logits: numpy's conversion from float64
    (IEEE rounding, as torch's); other dtypes through torch."""
    n = len(amounts)
    if dtype == torch.float32:
        if max(amounts) > _F32_MAX:
            amounts = [a if a <= _F32_MAX else _F32_MAX for a in amounts]
        out.view(np.float32)[:n] = amounts
        return
    words, _ = packed_amounts(amounts, dtype)
    out[:] = words


def packed_words(n: int, dtype: torch.dtype) -> int:
    """How many 64-bit words ``n`` values of ``dtype`` take."""
    per_word = 8 // dtype.itemsize
    return -(-n // per_word)


def packed_amounts(amounts: Sequence[float], dtype: torch.dtype) -> tuple[np.ndarray, int]:
    """``amounts`` (at most ``dtype``'s largest finite value each) in ``dtype``, converted as the
    hosted processor converts them (``torch`` from float64), as 64-bit words (the last one padded)
    and how many words they take."""
    limit = torch.finfo(dtype).max
    values = torch.from_numpy(np.minimum(np.asarray(amounts, dtype=np.float64), limit)).to(dtype)
    per_word = 8 // values.element_size()
    pad = -len(values) % per_word
    if pad:
        values = torch.cat((values, values.new_zeros(pad)))
    words = values.view(torch.int64).numpy()
    return words, len(words)


class DryGroup(WindowDecided):
    """``dry`` entries at one position. Where the adapter passes host histories
    (``SlotBatch(host_histories=True)``): every member row decided on the host by its processor in
    one pass, the rows lowered with one upload and one read, subtract, write (see the module doc).
    From the token window (Model Runner V2): every row decided and lowered on the device by one
    fused op (``dry_device.fused_lower_``; on the CPU ``dry_device.lower_window_``) from its slot's
    tables (``params``: allowed length, look-back, whether the prompt counts, the cap; ``singles``:
    the sorted single-token breakers; ``amounts``: the penalty per exponent), for templates that fit
    (``fits_window``). Lowers by finite amounts
    only: never writes ``-inf``, never leaves a row empty."""

    writes_neg_inf = False
    #: a row out of a scoped entry's phase (``scope.ScopedDecided``): no history, nothing penalized
    neutral_history: Sequence[int] = ()

    @classmethod
    def fits_window(cls, template: Template, group: Group | None) -> bool:
        """Single-token breakers only (at most ``MAX_DEVICE_SINGLES``), a cap of at most ``MAX_DEVICE_CAP``."""
        assert isinstance(template, DryTemplate)
        return not template.tails and template.cap <= MAX_DEVICE_CAP and len(template.singles) <= MAX_DEVICE_SINGLES

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.params = self.table(torch.long, pad=0, width=4)
        self.singles = self.table(torch.long)
        self.amounts = self.table(torch.float64)
        self._dims: dict[int, tuple[int, int]] = {}  # member slot -> (look-back, cap), window groups
        self._bounds: tuple[int, int] | None = None  # the members' largest look-back and cap (None: changed)
        self._consts: dict[tuple[int, int], Constants] = {}  # kept across steps
        self._host = not on_accelerator(device)  # the logits live in host memory
        self._native_off = False  # the native host step failed once: the Python processors for good

    def _write(self, slot: int, template: DryTemplate) -> None:
        if not self.from_window:
            return None  # decided on the host: everything it reads is the row's history and its processor's state
        self.params.set(slot, [template.allowed, template.lookback, int(template.include_prompt), template.cap])
        self.singles.set(slot, sorted(template.singles) or [NO_BREAKER])
        top = max(template.cap - template.allowed, 0)
        self.amounts.set(slot, [template.multiplier * template.base ** e for e in range(top + 1)])
        self._dims[slot] = (template.lookback, template.cap)
        self._bounds = None
        return None

    def assign(self, slot: int, template: Template | None) -> None:
        if template is None and self._dims.pop(slot, None) is not None:
            self._bounds = None
        super().assign(slot, template)

    def reads_generated(self, rows: ListedRows) -> bool:
        return False

    # -- a scoped entry (``scope.ScopedDecided``) ---------------------------------------------------
    @classmethod
    def scopable(cls, template: Template) -> bool:
        """A scoped entry is resident with host histories: a row decides from any history (its
        phase's stretch), and the empty one (``neutral_history``) penalizes nothing without the
        prompt's tail (``include_prompt``, which ``dry.factory`` drops with a scope)."""
        assert isinstance(template, DryTemplate)
        return not template.include_prompt

    floored = True
    #: a slot's breakers may be thousands of ids: written only once a scoped group decides from the window
    tables_at_first_window = True

    def apply_floored(self, step: StepInputs, rows: GatheredRows, window: TokenWindow, floor: torch.Tensor) -> None:
        """Every row decided and lowered from ``window`` as ``decide_from_window`` and
        ``apply_device_decisions`` do, no position below ``floor[r]`` counted (the fused op's
        ``floor``: a row's window starts at ``max(start, floor)``), so a row's repeats are those of
        its stretch alone, as the hosted path's ``_own``."""
        self.apply_device_decisions(step, rows, self._decide(rows, window, floor))

    # -- token window (Model Runner V2) -------------------------------------------------------------
    def decide_from_window(self, rows: GatheredRows, window: TokenWindow) -> torch.Tensor:
        """Keeps the step's window for ``apply_device_decisions`` (the whole step is one fused op,
        which reads the logits too) and returns ``rows.member``; on a CUDA device where the fused
        op's probe failed, each position's penalty (``[rows, W - 1]``, float64, ``device_penalties``),
        the ids it lowers kept."""
        return self._decide(rows, window, None)

    def _decide(self, rows: GatheredRows, window: TokenWindow, floor: torch.Tensor | None) -> torch.Tensor:
        """``decide_from_window``, each row's positions from ``floor[r]`` on only (``None``: all)."""
        bounds = self._bounds
        if bounds is None:
            bounds = self._bounds = (max((lookback for lookback, _ in self._dims.values()), default=1),
                                     max((c for _, c in self._dims.values()), default=1))
        width = max(min(bounds[0], window.tokens.shape[1]), 2)
        cap = max(min(bounds[1], width), 1)
        if self.device.type == "cuda" and not fused_ready(self.device):
            ids, penalty = self._penalties(rows, window, width, cap, floor)
            self._cache["ids"] = ids
            return penalty
        self._cache["window"] = (window, width, cap, floor)
        return rows.member

    def _penalties(self, rows: GatheredRows, window: TokenWindow, width: int, cap: int,
                   floor: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager device decision (``device_penalties``): each position's id and penalty."""
        consts = self._consts.get((width, cap))
        if consts is None:
            if len(self._consts) > 16:
                self._consts.clear()
            consts = self._consts[(width, cap)] = constants(width, cap, self.device)
        slot_of_row = rows.slot_of_row
        return device_penalties(window, slot_of_row, rows.member, self.params.dev[slot_of_row],
                                self.singles.dev[slot_of_row], self.amounts.dev[slot_of_row], width, cap, consts, floor)

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> None:
        """The rows lowered: on the CPU by ``lower_window_`` (host arrays, shapes following the data),
        elsewhere by the fused op ``fused_lower_`` (two launches on CUDA; the CUDA model counts them),
        or by ``lower_rows`` after the eager decision (CUDA without the fused kernels)."""
        kept = self._cache.pop("window", None)
        if kept is None:
            lower_rows(step.logits, self._cache.pop("ids"), decisions)
            return None
        window, width, cap, floor = kept
        args = (step.logits, window.tokens, window.prompt_len, window.pos, window.input_ids, window.local_pos,
                rows.slot_of_row, rows.member, self.params.dev, self.singles.dev, self.amounts.dev, width, cap)
        if self._host:
            host = self._host_rows(rows, width, cap, window.tokens)
            if host is not None:
                lower_window_(*args, floor, host)
        else:  # on CUDA a new variant (look-back and breaker buckets, drafts, floor, dtypes) compiles off
            # the step, the eager decision answering until it lands (or for good if it fails to compile)
            fused_run(self.device, lambda: fused_lower_(*args, floor),
                      lambda: lower_rows(step.logits, *self._penalties(rows, window, width, cap, floor)),
                      dry_kernels.variant, *args, floor)
        return None

    def _host_rows(self, rows: GatheredRows, width: int, cap: int, tokens: torch.Tensor) -> HostRows | None:
        """``lower_window_``'s reads of the tables for ``rows`` (``None``: no member row), kept while
        the layout's rows are the same object (``every_row``) and the tables unchanged (a flush
        clears the cache), for one ``(W, C)`` and token matrix shape."""
        shape = (width, cap, *tokens.shape)
        kept = self._cache.get("host")
        if kept is None or kept[0] is not rows or kept[1] != shape:
            made = host_rows(rows.member, rows.slot_of_row, self.params.dev, self.singles.dev, self.amounts.dev, width,
                             cap, (tokens.shape[0], tokens.shape[1]))
            kept = self._cache["host"] = (rows, shape, made)
        host: HostRows | None = kept[2]
        return host

    def prepare(self, rows: ListedRows, stride: int) -> None:
        """Per layout: the row width (host)."""
        super().prepare(rows, stride)
        self._cache["width"] = stride

    def decide_rows(self, deciders: list[Decider], histories: Sequence[Sequence[int]],
                    fail: Callable[[int, int, Exception], None]) -> Decisions:
        """The flat indices the member rows lower this step and the amounts; a row whose processor
        raises is passed to ``fail`` and lowers nothing."""
        width = self._cache["width"]
        flat: list[int] = []
        amounts: list[float] = []
        native = self._native_step(deciders, width)
        hits = None
        if native is not None:
            try:
                deciders, hits = native.decide(histories)
            except Exception:  # a bug of the native step must not fail a request: the Python processors, for good
                logger.exception("dry: the native host step failed; the Python processors decide this group's rows")
                self._native_off = True
        for row, slot, processor in deciders:
            try:  # the row's start computed here, not read from a list of objects the cache may have lost
                processor.penalize_into(histories[row], width, row * width, flat, amounts)
            except Exception as exc:  # a bug must not escape the sampler: this row alone
                fail(row, slot, exc)
                kept = min(len(flat), len(amounts), self._rows_before(flat, row * width))
                del flat[kept:], amounts[kept:]
        if hits is not None and hits.n:
            if not flat:  # every row that lowers anything was stepped natively: its buffers as they are
                return hits
            native_flat, native_amounts = hits.lists()
            flat += native_flat
            amounts += native_amounts
        return flat, amounts

    def _native_step(self, deciders: list[Decider], width: int) -> dry_native.NativeStep | None:
        """The layout's native step (``dry_native``), kept while its deciders are the same object
        (a flush clears it); ``None`` while the library builds, where it cannot, or after a failure."""
        if self._native_off:
            return None
        kept: dry_native.NativeStep | None = self._cache.get("native")
        if kept is None or kept.deciders is not deciders or kept.width != width:
            fn = dry_native.library()
            if fn is None:
                return None
            kept = self._cache["native"] = dry_native.NativeStep(fn, deciders, width)
        return kept

    @staticmethod
    def _rows_before(flat: list[int], base: int) -> int:
        """How many of ``flat``'s indices belong to rows before the one starting at ``base`` (rows
        are decided in order, so their indices come first and lie below ``base``)."""
        kept = len(flat)
        while kept and flat[kept - 1] >= base:
            kept -= 1
        return kept

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, decisions: Decisions,
                             upload: StepUpload) -> None:
        dtype = step.flat.dtype
        if isinstance(decisions, dry_native.NativeHits):
            if self._host and dtype is torch.float32 and step.flat.stride(0) == 1:
                lower = dry_native.lower_step()
                if lower is not None:  # the native step's buffers lowered by one C call: no list, no Python loop
                    lower(decisions.n, decisions.flat_at, decisions.amounts_at, step.flat.data_ptr())
                    return None
            decisions = decisions.lists()
        flat, amounts = decisions
        n = len(flat)
        if not n:
            return None
        if self._host and dtype is torch.float32:  # the logits are host memory: lowered in place, element by element
            if n <= HOST_LOOP_MAX and step.flat.stride(0) == 1:
                _lower_host_view(host_f32_view(step.flat), flat, amounts)
            else:
                _lower_host_f32(step.flat.numpy(), flat, amounts)
            return None
        m = packed_words(n, dtype)
        buf = upload.buffer(n + m)
        buf[:n] = flat
        pack_amounts(amounts, dtype, buf[n:])
        lowest = _LOWEST.get(dtype)
        if lowest is None:
            lowest = _LOWEST[dtype] = torch.finfo(dtype).min
        values = upload.upload(n + m)
        index, penalty = values[:n], values[n:].view(dtype)[:n]
        kept = step.flat.index_select(0, index)
        lowered = kept - penalty
        torch.maximum(lowered, kept.clamp_max(lowest), out=lowered)  # finite stays finite, -inf stays
        step.flat.index_copy_(0, index, lowered)
        return None


@dataclass(frozen=True, slots=True)
class DryTemplate(Template):
    """Every step: the ids that would extend a repeat of the row's window, each lowered by its
    penalty (decided per row on the host from histories, else on the device from the token window):
    what the device needs of the entry (``cap``: the longest repeat measured; ``singles``: the ids
    that break a repeat alone; ``tails``: whether multi-token breakers apply)."""

    multiplier: float = 0.0
    base: float = 1.0
    allowed: int = 1
    lookback: int = 0
    include_prompt: bool = True
    cap: int = 1
    singles: tuple[int, ...] = field(default=(), repr=False)
    tails: bool = False
    group: ClassVar[type[DryGroup]] = DryGroup
    reads_tokens: ClassVar[bool] = True

