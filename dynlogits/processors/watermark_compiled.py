"""``watermark``'s tensor work as compiled functions on CUDA (eager everywhere else).

``draw`` (the batched Gumbel-max draw, both runners) and ``decide`` (Model Runner V2's context,
repeat and absorb step from the token window, ``window_decisions``) are what the resident group
calls. On a CUDA device each runs its pure function (``pure_draw``, ``window_decisions`` with
``pure_absorb``) through ``torch.compile(fullgraph=True, dynamic=True)`` (as vLLM compiles its own
Philox PRF): the ten Philox rounds, the uniform, the Gumbel noise, the temperature and the argmax
in a few generated kernels instead of about 150 eager ones. Anywhere else (the CPU, the CUDA model
``SimCuda``, every CPU test) each runs eagerly: ``watermark_resident.batched_draw`` and
``window_decisions`` with ``watermark_prf.absorb``, the reference.

The fused ops at the end of this module (``fused_draw_force_``, ``fused_window_state``,
``fused_absorb``: torch custom ops ``dynlogits::watermark_draw_force_``,
``dynlogits::watermark_window_state`` and ``dynlogits::watermark_absorb``, Triton kernels on CUDA
from ``dynlogits.kernels.watermark``, the eager reference elsewhere) take precedence on a device
where ``fused_ready`` says so (probe-checked on CUDA); the compiled functions below are then used
only where the probe failed. ``fused_window_state`` is Model Runner V2's whole decision step (the
window read, ``window_decisions`` and the absorb) in one launch; ``fused_absorb`` alone is no longer
on the resident path (kept, with its probe, for callers holding contexts).

* Each compiled once per process (``Lazy``), lazily, on its first call over CUDA tensors; never on
  the CPU path (``dynamic=True``: new batch sizes and vocabularies reuse it; a new widest context
  width or dtype recompiles). A failure to compile or run it (no Triton, a dynamo error) logs one
  line and the process runs that function eagerly from then on: a request never fails for it.
* Opt-in: compiled only where ``DYNLOGITS_WATERMARK_COMPILE=1`` (``ENV``). A first compile stalls
  the engine's step for seconds and the compiled bits are unchecked on a GPU so far, so by default
  every device runs the eager reference; the CUDA check turns it on for itself.
* No sync: the pure functions are tensor ops on their inputs (device tensors) and Python integers
  (shapes, the widest width, ``MAX_HISTORY``); no ``.item()``, no host read, no data-dependent
  Python branch, no cache lookup.
* The same bits as the eager path: the PRF and the window decisions are integer arithmetic and
  comparisons (exact on any backend); the uniform's float64 division by ``2**24 + 1`` (which
  Inductor turns into a multiplication by its reciprocal on CUDA) rounds to the same float32 for
  all ``2**24`` mantissas (checked exhaustively in ``tests/processors/test_watermark_compiled.py``);
  Inductor is asked for eager numerics where the running torch has the knob (``COMPILE_OPTIONS``:
  IEEE division for ``x / T``, no FMA contraction, the CUDA libdevice, no flush to zero). The
  CUDA check (``python -m dynlogits.testing.cuda.check --watermark-only``) compares both with
  their eager runs on the GPU and on the CPU, bit for bit; until it has run on a GPU, the CUDA
  bits, kernel counts and times are unmeasured.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .watermark_prf import (
    _CONTEXT_DOMAIN,
    _M0,
    _M1,
    _MASK,
    _ROUNDS,
    _TOKEN_DOMAIN,
    _W0,
    _W1,
    _mulhilo,
    absorb,
    context_block,
    gumbel_noise,
    uniform_from_states,
)
from .window import TokenWindow

__all__ = ["COMPILE_OPTIONS", "ENV", "DECIDE", "DRAW", "LISTED", "Lazy", "batched_draw", "draw_listed", "listed_draw", "compile_options", "compiled_draw", "decide", "draw", "pure_absorb",
           "pure_draw", "reset", "window_decisions", "fused_absorb", "fused_draw_force_", "fused_ready", "fused_window_state", "reset_fused"]

#: the environment switch that turns the compiled functions on (``"1"``); anything else: eager
ENV = "DYNLOGITS_WATERMARK_COMPILE"

log = logging.getLogger(__name__)

T = TypeVar("T")

Draw = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

#: Inductor settings that keep eager CUDA numerics, each set where the running torch has it
#: (names moved between versions).
COMPILE_OPTIONS: dict[str, bool] = {
    "emulate_precision_casts": True,  # also turns FMA contraction off in the generated Triton kernels
    "eager_numerics.division_rounding": True,  # x / T by div_rn, as eager (torch >= 2.12)
    "emulate_divison_rounding": True,  # the same knob's older name (sic)
    "eager_numerics.use_pytorch_libdevice": True,  # log from the CUDA toolkit's libdevice, as eager
    "eager_numerics.disable_ftz": True,  # keep denormals, as eager
}


def compile_options() -> dict[str, str | int | bool | Callable[..., Any]]:
    """``COMPILE_OPTIONS`` that the running torch's Inductor knows."""
    from torch._inductor import config

    known = config.get_config_copy()
    return {name: value for name, value in COMPILE_OPTIONS.items() if name in known}


def pure_draw(rows: torch.Tensor, temperatures: torch.Tensor, states: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``batched_draw`` as pure tensor code (what is compiled): ``rows`` ``[n, vocab]``,
    ``temperatures`` ``[n]``, ``states`` ``[n, 4]`` and ``keys`` ``[n, 2]`` int64; ``[n]`` int64.
    The same arithmetic as ``watermark_prf.uniform_from_states`` word-wise (the key schedule from
    Python integers, the counters made in the graph), then ``argmax(rows / T + G)``."""
    vocab = rows.shape[1]
    s = states.to(torch.int64)
    k = keys.to(torch.int64)
    c0 = torch.arange((vocab + 3) // 4, dtype=torch.int64, device=rows.device)[None, :]
    c1, c2, c3 = s[:, 0:1], s[:, 1:2], s[:, 2:3]
    k0 = k[:, 0:1] ^ s[:, 3:4]
    k1 = k[:, 1:2] ^ _TOKEN_DOMAIN
    for round_index in range(_ROUNDS):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = (hi1 ^ c1 ^ ((k0 + round_index * _W0) & _MASK), lo1,
                          hi0 ^ c3 ^ ((k1 + round_index * _W1) & _MASK), lo0)
    words = torch.stack(torch.broadcast_tensors(c0, c1, c2, c3), dim=2).reshape(rows.shape[0], -1)[:, :vocab]
    uniforms = (((words >> 8).to(torch.float64) + 1.0) / (2**24 + 1)).to(torch.float32)
    noise = -torch.log(-torch.log(uniforms.clamp_min(torch.finfo(torch.float32).tiny)))
    x = rows.to(torch.float32) / temperatures[:, None]
    return torch.argmax(x + noise, dim=1)


def batched_draw(rows: torch.Tensor, temperatures: torch.Tensor, states: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The Gumbel-max draw of every row of ``rows`` (``[n, vocab]``): ``temperatures`` ``[n]``
    float32, ``states`` ``[n, 4]`` and ``keys`` ``[n, 2]`` int64 (``watermark_prf``); ``[n]`` int64
    on the device. Row ``i`` is ``watermark_draw`` of row ``i`` with no truncation. The eager
    reference (cached counters and multiplier pairs: fewer eager ops). On the CPU the rows go
    through in chunks of at most ``CPU_CHUNK`` ids (the same values: every op is per row), so the
    Philox words stay in the cache instead of streaming ``[n, vocab]`` int64 tensors through memory."""
    n, width = rows.shape
    if rows.device.type == "cpu" and n > 1 and n * width > CPU_CHUNK:
        step = max(1, CPU_CHUNK // width)
        return torch.cat([_draw(rows[i:i + step], temperatures[i:i + step], states[i:i + step], keys[i:i + step])
                          for i in range(0, n, step)])
    return _draw(rows, temperatures, states, keys)


#: ids per chunk of the CPU draw (int64 words: a few MiB per live tensor)
CPU_CHUNK = 1 << 17


def _draw(rows: torch.Tensor, temperatures: torch.Tensor, states: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    x = rows.to(torch.float32) / temperatures[:, None]
    return torch.argmax(x + gumbel_noise(uniform_from_states(states, keys, rows.shape[1])), dim=1)


def listed_draw(logits: torch.Tensor, flat: torch.Tensor, rows_dev: torch.Tensor, slots: torch.Tensor,
                temperature_table: torch.Tensor, params_table: torch.Tensor, states: torch.Tensor, stride: int,
                pure: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The V1 runner's draw of the firing rows ``rows_dev`` (their ``slots`` and PRF ``states``
    ``[n, 4]``), the slots' tables (``[slots, 1]`` temperatures, ``[slots, 4]`` params): the flat
    index of each row's token in ``flat`` (``logits`` flat, rows ``stride`` apart) and the value to
    write there once the row is filled with ``-inf`` (the logit kept where it is ``-inf``, else
    0.0). ``pure``: ``pure_draw`` (the compiled function) instead of ``batched_draw``."""
    params = params_table[slots]
    tokens = (pure_draw if pure else batched_draw)(logits.index_select(0, rows_dev), temperature_table[slots, 0],
                                                   states, params[:, :2])
    index = rows_dev * stride + tokens
    kept = flat.index_select(0, index)
    return index, torch.where(torch.isneginf(kept), kept, 0.0)


def _pure_listed_draw(logits: torch.Tensor, flat: torch.Tensor, rows_dev: torch.Tensor, slots: torch.Tensor,
                      temperature_table: torch.Tensor, params_table: torch.Tensor, states: torch.Tensor,
                      stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    return listed_draw(logits, flat, rows_dev, slots, temperature_table, params_table, states, stride, pure=True)


def pure_absorb(keys: torch.Tensor, contexts: torch.Tensor, widths: torch.Tensor | None = None) -> torch.Tensor:
    """``watermark_prf.absorb`` word-wise with Python-integer constants and no cached tensors
    (what is compiled): the same words, bit for bit."""
    k = keys.to(torch.int64)
    ctx = contexts.to(torch.int64) & _MASK
    width = ctx.shape[1]
    zeros = torch.zeros_like(ctx[:, 0])
    state: tuple[torch.Tensor, ...] = (zeros + _CONTEXT_DOMAIN, zeros + width if widths is None else widths.to(torch.int64),
                                       zeros, zeros)
    for offset in range(0, width, 4):
        block = context_block(ctx, zeros, widths, offset)
        c0, c1, c2, c3 = (state[i] ^ block[i] for i in range(4))
        k0, k1 = k[:, 0] ^ offset, k[:, 1]
        for round_index in range(_ROUNDS):
            hi0, lo0 = _mulhilo(_M0, c0)
            hi1, lo1 = _mulhilo(_M1, c2)
            c0, c1, c2, c3 = (hi1 ^ c1 ^ ((k0 + round_index * _W0) & _MASK), lo1,
                              hi0 ^ c3 ^ ((k1 + round_index * _W1) & _MASK), lo0)
        new = (c0, c1, c2, c3)
        if widths is None:
            state = new
        else:
            absorbs = widths > offset
            state = tuple(torch.where(absorbs, a, b) for a, b in zip(new, state))
    return torch.stack(state, dim=1)


def window_decisions(tokens: torch.Tensor, at: torch.Tensor, prompt: torch.Tensor, pos: torch.Tensor,
                     params: torch.Tensor, member: torch.Tensor, offsets: torch.Tensor, wide: int, every: bool,
                     max_history: int, pure: bool = False) -> torch.Tensor:
    """``WatermarkGroup.decide_from_window``'s tensor part: per row ``[rows, 5]``, the four state
    words and whether the row draws. ``tokens`` ``[rows, span]`` the rows' last ``span`` tokens
    (columns ``at``), ``prompt`` and ``pos`` per row, ``params`` the slots' key words, width and
    whether they sample, ``member`` per row, ``offsets`` ``arange(wide)[None, :]``, ``wide`` the
    widest context, ``every`` whether every member has that width. ``pure``: ``pure_absorb`` (the
    compiled function) instead of ``absorb`` (the same words)."""
    span = tokens.shape[1]
    output = at >= prompt[:, None]  # a column of the output (not the prompt, not before it)
    placeholder = ((tokens < 0) & output).any(1)
    # the context: the last ``wide`` columns, -1 where they precede the output
    context = torch.where(output[:, span - wide:], tokens[:, span - wide:], -1)
    width = None if every else params[:, 2]
    if width is not None:  # left-align each row's own width
        shift = (wide - width)[:, None] + offsets
        context = context.gather(1, shift.clamp(0, wide - 1))  # a non-member row may be wider: masked later
    states = (pure_absorb if pure else absorb)(params[:, :2], context, width)
    # a repeat: a window of the output ending at ``k`` (before the last column, at least
    # ``pos - max_history``) equal to the context
    ends = span - wide  # window ends ``wide - 1 .. span - 2``
    same = torch.ones_like(tokens[:, :ends], dtype=torch.bool)
    for back in range(wide):
        equal = tokens[:, wide - 1 - back : wide - 1 - back + ends] == tokens[:, span - 1 - back : span - back]
        if width is not None:
            equal |= (width <= back)[:, None]
        same &= equal
    end = at[:, wide - 1 : span - 1]
    first = prompt + ((wide if width is None else width) - 1)
    valid = (end >= first[:, None]) & (end >= (pos - max_history)[:, None])
    repeated = (same & valid).any(1)
    draws = member & (params[:, 3] > 0) & ~placeholder & ~repeated
    return torch.cat([states, draws[:, None].long()], dim=1)


def _pure_window_decisions(tokens: torch.Tensor, at: torch.Tensor, prompt: torch.Tensor, pos: torch.Tensor,
                           params: torch.Tensor, member: torch.Tensor, offsets: torch.Tensor, wide: int, every: bool,
                           max_history: int) -> torch.Tensor:
    return window_decisions(tokens, at, prompt, pos, params, member, offsets, wide, every, max_history, pure=True)


class Lazy:
    """``fn`` compiled on first use (``torch.compile(fullgraph=True, dynamic=True)``, Inductor's
    eager-numerics options); after a failure to compile or run, ``None`` for good (one log line)."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name, self.fn = name, fn
        self.compiled: Callable[..., Any] | None = None
        self.failed = False
        self._lock = threading.Lock()

    def get(self) -> Callable[..., Any] | None:
        if self.failed or os.environ.get(ENV) != "1":
            return None
        if self.compiled is None:
            with self._lock:
                if self.compiled is None and not self.failed:
                    try:
                        self.compiled = torch.compile(self.fn, fullgraph=True, dynamic=True, options=compile_options())
                    except Exception as exc:  # no compiler here: eager
                        self.give_up(exc)
        return self.compiled

    def give_up(self, exc: BaseException) -> None:
        self.failed = True
        message = str(exc).splitlines()[0][:200] if str(exc) else ""
        log.warning("watermark: the compiled %s failed (%s: %s); running it eagerly from now on", self.name,
                    type(exc).__name__, message)

    def call(self, on_cuda: bool, eager: Callable[..., Any], *args: object) -> Any:
        """The compiled function of ``args`` where ``on_cuda`` and it compiles, else ``eager(*args)``."""
        if on_cuda:
            fn = self.get()
            if fn is not None:
                try:
                    return fn(*args)
                except Exception as exc:  # a compile or run failure must not fail a request
                    self.give_up(exc)
        return eager(*args)

    def reset(self) -> None:
        with self._lock:
            self.compiled, self.failed = None, False


DRAW = Lazy("draw", pure_draw)
LISTED = Lazy("listed draw", _pure_listed_draw)
DECIDE = Lazy("window decisions", _pure_window_decisions)


def compiled_draw() -> Draw | None:
    """The compiled ``pure_draw`` (made on the first call; ``torch.compile`` compiles it on its
    first run), or ``None`` where it failed or is turned off."""
    return DRAW.get()


def _wants_compiled(rows: torch.Tensor) -> bool:
    return rows.device.type == "cuda"


def draw(rows: torch.Tensor, temperatures: torch.Tensor, states: torch.Tensor, keys: torch.Tensor, eager: Draw) -> torch.Tensor:
    """``eager(rows, temperatures, states, keys)``, through the compiled function where ``rows``
    are on a CUDA device and it compiled (see the module doc)."""
    return DRAW.call(_wants_compiled(rows), eager, rows, temperatures, states, keys)


def draw_listed(logits: torch.Tensor, flat: torch.Tensor, rows_dev: torch.Tensor, slots: torch.Tensor,
                temperature_table: torch.Tensor, params_table: torch.Tensor, states: torch.Tensor,
                stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``listed_draw``, compiled where ``logits`` are on a CUDA device and it compiled."""
    out: tuple[torch.Tensor, torch.Tensor] = LISTED.call(_wants_compiled(logits), listed_draw, logits, flat, rows_dev,
                                                         slots, temperature_table, params_table, states, stride)
    return out


def decide(tokens: torch.Tensor, at: torch.Tensor, prompt: torch.Tensor, pos: torch.Tensor, params: torch.Tensor,
           member: torch.Tensor, offsets: torch.Tensor, wide: int, every: bool, max_history: int) -> torch.Tensor:
    """``window_decisions``, compiled where ``tokens`` are on a CUDA device and it compiled."""
    return DECIDE.call(_wants_compiled(tokens), window_decisions, tokens, at, prompt, pos, params, member, offsets,
                       wide, every, max_history)


def reset() -> None:
    """Forget the compiled functions and any failure (tests)."""
    DRAW.reset()
    LISTED.reset()
    DECIDE.reset()


# -- fused ops (``dynlogits.kernels``): the draw, its forcing and the absorb as Triton kernels on CUDA --

from dynlogits.kernels.fused import fused_op  # noqa: E402
from dynlogits.kernels.probe import FusedGate  # noqa: E402  # declared after the eager references they run on the CPU
from dynlogits.kernels.variants import VariantOf  # noqa: E402
from dynlogits.kernels.watermark import window_span  # noqa: E402  # no Triton import


@fused_op("watermark_draw_force_", launches=2, mutates_args=("logits",))
def fused_draw_force_(logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, temperature: torch.Tensor,
                      params: torch.Tensor, states: torch.Tensor, fire: torch.Tensor | None) -> torch.Tensor:
    """Draw row ``rows[i]`` of ``logits`` (``[batch, vocab]``) at ``temperature[slots[i], 0]`` with
    the key ``params[slots[i], :2]`` and state ``states[i]``, then force each firing row
    (``fire[i] != 0``; ``None``: every row) to its token in place, keeping masks (``-inf`` over the
    row, the token ``0.0`` or its ``-inf``); the tokens ``[n]``. The eager reference (every device
    but CUDA): ``batched_draw`` then a gather, a fill and a scatter. On CUDA: two Triton launches
    (``dynlogits.kernels.watermark.draw``)."""
    tokens = batched_draw(logits.index_select(0, rows), temperature[slots, 0], states, params[slots, :2])
    index = tokens[:, None]
    picked = logits.index_select(0, rows)
    kept = picked.gather(1, index)
    value = torch.where(torch.isneginf(kept), kept, 0.0)
    forced = torch.full_like(picked, float("-inf")).scatter_(1, index, value)
    if fire is not None:
        forced = torch.where(fire[:, None] != 0, forced, picked)
    logits.index_copy_(0, rows, forced)
    return tokens


@fused_draw_force_.cuda
def _fused_draw_force_cuda(logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, temperature: torch.Tensor,
                           params: torch.Tensor, states: torch.Tensor, fire: torch.Tensor | None) -> torch.Tensor:
    from dynlogits.kernels import watermark as kernels

    return kernels.draw(logits, rows, slots, temperature, params, states, fire, True)


@fused_op("watermark_window_state", launches=1)
def fused_window_state(tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor | None,
                       local_pos: torch.Tensor | None, slot_of_row: torch.Tensor, member: torch.Tensor,
                       params: torch.Tensor, wide: int, every: bool, max_history: int) -> torch.Tensor:
    """Model Runner V2's window decisions of every row: ``[rows, 5]`` int64, the four PRF state
    words of its context and whether it draws (``WatermarkGroup.decide_from_window``). The window
    is ``TokenWindow.at(tokens, prompt_len, pos, input_ids, local_pos)``; row ``r``'s slot is
    ``slot_of_row[r]`` (``params``, the ``[slots, 4]`` table, read there; the window at it clamped
    into the matrix), ``member[r]`` whether it belongs to the group; ``wide`` the widest context,
    ``every`` whether every member has it. The eager reference (every device but CUDA): the span
    read with ``TokenWindow._read``, then ``window_decisions`` with ``watermark_prf.absorb``. On
    CUDA: one Triton launch (``dynlogits.kernels.watermark.window_state``), the read included."""
    window = TokenWindow(tokens.device).at(tokens, prompt_len, pos, input_ids, local_pos)
    slots = window.slots(slot_of_row)
    span = window_span(tokens.shape[1], wide, max_history)
    columns = torch.arange(span, device=tokens.device)[None, :]
    at = (pos.long() - (span - 1))[:, None] + columns
    read = window._read(slots, at.clamp(min=0)).long()
    return window_decisions(read, at, prompt_len[slots].long(), pos.long(), params[slot_of_row], member,
                            columns[:, :wide], wide, every, max_history)


@fused_window_state.cuda
def _fused_window_state_cuda(tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                             input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, slot_of_row: torch.Tensor,
                             member: torch.Tensor, params: torch.Tensor, wide: int, every: bool,
                             max_history: int) -> torch.Tensor:
    from dynlogits.kernels import watermark as kernels

    return kernels.window_state(tokens, prompt_len.contiguous(), pos.contiguous(),
                                None if input_ids is None else input_ids.contiguous(),
                                None if local_pos is None else local_pos.contiguous(), slot_of_row.contiguous(),
                                member.contiguous(), params, wide, every, max_history)


@fused_op("watermark_absorb", launches=1)
def fused_absorb(keys: torch.Tensor, contexts: torch.Tensor, widths: torch.Tensor | None) -> torch.Tensor:
    """``watermark_prf.absorb`` (the eager reference on every device but CUDA; one Triton launch there)."""
    return absorb(keys, contexts, widths)


@fused_absorb.cuda
def _fused_absorb_cuda(keys: torch.Tensor, contexts: torch.Tensor, widths: torch.Tensor | None) -> torch.Tensor:
    from dynlogits.kernels import watermark as kernels

    return kernels.absorb(keys, contexts, widths)


def fused_ready(device: torch.device) -> bool:
    """Whether the watermark's fused ops run on ``device`` (``dynlogits.kernels.probe.FusedGate``):
    never on the CPU, always in the CUDA model, on CUDA once ``_probe`` passed (a small batch through
    the Triton kernels and the eager reference, random states, keys, contexts, logits with ties and
    ``-inf``, a token window with repeats, placeholders and drafts, compared exactly: tokens, forced
    rows, states, window decisions); else one warning and eager for good."""
    return _GATE.ready(device)


def fused_run(device: torch.device, fused: Callable[[], T], eager: Callable[[], T], variant_of: VariantOf,
              *args: Any) -> T:
    """``fused()`` where ``fused_ready(device)``, else ``eager()``; on CUDA, named by its launches'
    ``variant_of(*args)`` (``kernels.watermark.draw_variant``, ``window_variant``), ``eager()`` until
    that variant's compile has landed off the step (``FusedGate.run_named``)."""
    return _GATE.run_named(device, fused, eager, variant_of, *args)


def _probe(device: torch.device) -> bool:
    """The fused ops against the eager reference on ``device``, exactly (see ``fused_ready``)."""
    g = torch.Generator().manual_seed(20260128)
    n, vocab, width = 6, 1000, 6
    logits = torch.randn(n + 1, vocab, generator=g)
    logits[1, :] = 0.0  # ties everywhere: the lowest index
    logits[2, 1::3] = float("-inf")
    states = torch.randint(0, 2**32, (n, 4), generator=g, dtype=torch.int64)
    params = torch.randint(0, 2**32, (n + 2, 4), generator=g, dtype=torch.int64)
    temperature = torch.rand(n + 2, 1, generator=g) + 0.25
    rows, slots = torch.arange(1, n + 1), torch.arange(2, n + 2)
    fire = torch.tensor([1, 0, 1, 1, 0, 1])
    contexts = torch.randint(-1, 150000, (n, width), generator=g)
    widths = torch.randint(0, width + 1, (n,), generator=g)
    dev = [t.to(device) for t in (logits, rows, slots, temperature, params, states, fire, contexts, widths)]
    d_logits, d_rows, d_slots, d_temp, d_params, d_states, d_fire, d_ctx, d_widths = dev
    eager_logits = d_logits.clone()
    eager_tokens = fused_draw_force_.eager(eager_logits, d_rows, d_slots, d_temp, d_params, d_states, d_fire)
    fused_tokens = _fused_draw_force_cuda(d_logits, d_rows, d_slots, d_temp, d_params, d_states, d_fire)
    same = [torch.equal(eager_tokens, fused_tokens), torch.equal(eager_logits.isneginf(), d_logits.isneginf()),
            torch.equal(torch.nan_to_num(eager_logits, neginf=-1.0), torch.nan_to_num(d_logits, neginf=-1.0))]
    for w in (None, d_widths):
        same.append(torch.equal(absorb(d_params[:n, :2], d_ctx, w), _fused_absorb_cuda(d_params[:n, :2], d_ctx, w)))
    # the window decisions: a small matrix of three ids (repeats), placeholders, prompts ending
    # anywhere, drafts or none, mixed widths or one, a sentinel row past the matrix
    num_slots, columns = 5, 40
    tokens = torch.randint(0, 3, (num_slots, columns), generator=g, dtype=torch.int32)
    tokens[torch.rand(num_slots, columns, generator=g) < 0.01] = -1
    prompt_len = torch.randint(0, columns, (num_slots,), generator=g, dtype=torch.int32)
    slot_of_row = torch.tensor([0, 0, 0, 3, 3, 1, 4, 2, num_slots])
    pos = torch.tensor([20, 21, 22, 37, 38, 5, 39, 30, 10], dtype=torch.int32)
    local_pos = torch.tensor([0, 1, 2, 0, 1, 0, 0, 0, 0], dtype=torch.int32)
    input_ids = torch.randint(-1, 3, (9,), generator=g, dtype=torch.int32)
    member = torch.tensor([True] * 8 + [False])
    window_params = torch.cat([params[: num_slots + 1, :2], torch.randint(1, 7, (num_slots + 1, 1), generator=g),
                               torch.ones(num_slots + 1, 1, dtype=torch.int64)], dim=1)
    w_tokens, w_prompt, w_pos, w_inputs, w_local, w_slots, w_member, w_params = (
        t.to(device) for t in (tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member, window_params))
    # vLLM's default width 4 with and without drafts (compiled here, not at a first step), and mixed widths
    for drafts, every, wide in ((False, True, 4), (True, True, 4), (True, False, 6)):
        inputs, local = (w_inputs, w_local) if drafts else (None, None)
        args = (w_tokens, w_prompt, w_pos, inputs, local, w_slots, w_member, w_params, wide, every, 12)
        same.append(torch.equal(fused_window_state.eager(*args), _fused_window_state_cuda(*args)))
    return all(same)


#: the probe-at-first-use gate (``_probe`` looked up at call time)
_GATE = FusedGate("watermark", lambda device: _probe(device), widen=lambda device, vocab: _widen(device, vocab))


def reset_fused() -> None:
    """Forget every device's probe (tests)."""
    _GATE.reset()


def _widen(device: torch.device, vocab: int) -> None:
    """Compile the draw kernels for logits ``vocab`` wide on ``device`` (its ``draw_reduce`` takes a
    constexpr from the width, and both key the logits' stride, width and address for vector loads):
    one float32 row, a firing row forced, as this module's step calls ``watermark.draw``."""
    from dynlogits.kernels import watermark

    logits = torch.zeros(1, vocab, dtype=torch.float32, device=device)
    one = torch.zeros(1, dtype=torch.int64, device=device)
    table = torch.zeros(1, 4, dtype=torch.int64, device=device)
    temperature = torch.ones(1, 1, dtype=torch.float32, device=device)
    watermark.draw(logits, one, one, temperature, table, table.clone(), one + 1, True)
