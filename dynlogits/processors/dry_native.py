"""``dry``'s host steps in C, for every row of a group at once (``dry_native_source``).

The V1 runner's ``DryGroup``: deciding a row in Python touches 15-20 objects (its state's lists and
dicts), each a cache miss right after the engine wrote the logits; this step keeps each row's window
in two flat buffers instead (its tokens, ``int32``, and the repeat length ending at each position,
``uint16``) and steps every row in one call (``dry_steps``): per row the new token is written, the
window is scanned for its earlier positions (each one's repeat is the one ending just before it,
one longer, capped, never reaching past the window's start: only positions whose token was the last
one hold a length, and a position is read only where its token was), the nearest single-token
breaker bounds the repeats (llama.cpp's ``rep_limit``), and each follower is emitted once, at its
longest repeat, with the amount of the processor's table: the same ids and amounts as
``DryProcessor.penalize_into`` (``tests/processors/test_dry_native.py`` holds it to the processor on
random histories). Before it, ``dry_read`` checks the rows' live lists and reads their new tokens
(CPython's C API, holding the GIL; ``reader``); after it, ``dry_lower`` lowers float32 host logits
at the hits (``lower_step``). Model Runner V2 on host memory: ``dry_window`` (``window_step``,
``dry_device.lower_window_``'s steps without drafts).

The libraries are compiled from ``dry_native_source`` with the system C compiler (``$CC``, else
``cc``) at the first call of ``library()``, on the kernels' compile thread
(``dynlogits.kernels.variants.COMPILER``), into a private temporary directory; until they have loaded,
and for good with ``DYN_DRY_NATIVE=0`` or where they cannot be built (no compiler, an error: one
warning), callers run the Python processors and numpy. The sources are constants: nothing a request
carries reaches the compiler."""

from __future__ import annotations

import ctypes
import logging
import operator
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from .dry_native_source import READ, SOURCE
from .modes import Decider
from .native_library import COMPILE_TIMEOUT_S, NativeLibrary

__all__ = ["COMPILE_TIMEOUT_S", "ENV_SWITCH", "MISSES", "SOURCE", "TAIL", "NativeHits", "NativeRow", "NativeStep", "library",
           "lower_step", "reader", "reset", "scratch_seen", "window_scratch", "window_step"]

log = logging.getLogger("dynlogits.processors.dry_native")

#: ``DYN_DRY_NATIVE=0`` keeps every ``dry`` row on the Python processors.
ENV_SWITCH = "DYN_DRY_NATIVE"


def _read_probe(functions: Mapping[str, Any]) -> bool:
    """``dry_read`` on a list that holds and on one rewritten ``TAIL`` tokens back (big ints too)."""
    read = functions["dry_read"]
    base = 1 << 20
    tok = np.arange(base, base + 40, dtype=np.int32)
    end = np.array([39], dtype=np.int64)
    tok_ptrs, end_ptrs = np.array([tok.ctypes.data], dtype=np.int64), np.array([end.ctypes.data], dtype=np.int64)
    new = np.zeros(1, dtype=np.int32)
    kept = [int(t) for t in tok[:39]] + [7]
    rewritten = [*kept[:39 - TAIL], 5, *kept[40 - TAIL:]]
    results = []
    for history in (kept, rewritten):
        rows, sources, lens = (np.array(v, dtype=np.int64) for v in ([0], [id(history)], [40]))
        results.append(read(1, [history], rows.ctypes.data, sources.ctypes.data, lens.ctypes.data,
                            tok_ptrs.ctypes.data, end_ptrs.ctypes.data, TAIL, new.ctypes.data))
        results.append(int(lens[0]))
    return results == [-1, 41, 0, 40] and int(new[0]) == 7


_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
#: ``dry_read``: loaded holding the GIL once its probe passed; else the lists are read in Python
_READER = NativeLibrary(
    "dry_read", READ, {"dry_read": (_I64, [_I64, ctypes.py_object, *[_PTR] * 5, _I64, _PTR])}, ENV_SWITCH, logger=log,
    built="dry: the rows' lists are checked and read in C ({cc})", failed_level=logging.INFO,
    failed="dry: the rows' lists are read in Python (the C reader: {why})", holds_gil=True, probe=_read_probe)
_STEPS = NativeLibrary(
    "dry_steps", SOURCE,
    {"dry_steps": (_I64, [_I64, *[_PTR] * 12, _I64, *[_PTR] * 3]),
     "dry_window": (_I64, [_I64, _PTR, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _PTR,
                           _I64, _I64, _PTR, _PTR, _PTR, _PTR]),
     "dry_lower": (None, [_I64, _PTR, _PTR, _PTR])},
    ENV_SWITCH, logger=log, built="dry: the native host step is built ({cc}); it decides the rows it can step from now on",
    failed="dry: the native host step could not be built ({why}); the Python processors decide every row",
    companions=(_READER,))


def library(wait: bool = False) -> Any:
    """The compiled step (``dry_steps``), or ``None`` while it builds (the first call queues the
    build) and for good where it cannot be built or ``DYN_DRY_NATIVE=0``. ``wait``: build now on the
    caller's thread if not done yet (tests, an engine's load)."""
    return _STEPS.function("dry_steps", wait)


def window_step(wait: bool = False) -> Any:
    """The compiled window step (``dry_window``: Model Runner V2's ``lower_window_`` on host
    memory), under ``library``'s terms (``None`` while it builds, where it cannot, or switched off)."""
    return _STEPS.function("dry_window", wait)


def lower_step(wait: bool = False) -> Any:
    """The compiled lowering of float32 host logits (``dry_lower``), under ``library``'s terms."""
    return _STEPS.function("dry_lower", wait)


def reader() -> Any:
    """The compiled reader of the rows' lists (``dry_read``), where it loaded and passed its probe
    (built with ``library``'s functions, just before them)."""
    return _READER.function("dry_read") if library() is not None else None


def reset() -> None:
    """Forget the builds (tests)."""
    _STEPS.reset()


class NativeHits(NamedTuple):
    """A native step's decisions: ``n`` flat indices (distinct) and their amounts (float64) at
    the start of ``flat`` and ``amounts`` (the step's buffers: valid until its next call), and
    those buffers' addresses (``dry_lower``'s arguments)."""

    n: int
    flat: np.ndarray
    amounts: np.ndarray
    flat_at: int
    amounts_at: int

    @classmethod
    def of(cls, flat: list[int], amounts: list[float]) -> NativeHits:
        """Hits from lists (rows stepped one by one)."""
        f, a = np.array(flat, dtype=np.int64), np.array(amounts, dtype=np.float64)
        return cls(len(f), f, a, f.ctypes.data, a.ctypes.data)

    def lists(self) -> tuple[list[int], list[float]]:
        """The indices and amounts as lists."""
        return self.flat[: self.n].tolist(), self.amounts[: self.n].tolist()


class NativeRow:
    """One processor's window on the native step (``DryProcessor.native_row``, kept across layouts):
    ``tok`` and ``lens`` (room past the end), the end in ``meta[0]`` (the call advances it), ``p0``
    the buffer position of the history's first token (the prompt's tail before it; negative once
    the window has moved past it), the list it was read from, and how many
    steps in a row it could not be stepped (``misses``; past ``MISSES`` it stays on the Python
    processor)."""

    __slots__ = ("tok", "lens", "meta", "p0", "source", "misses")

    def __init__(self) -> None:
        self.tok = _EMPTY
        self.lens = _EMPTY16
        self.meta = np.zeros(1, dtype=np.int64)
        self.p0 = 0
        self.source: object = None
        self.misses = 0

    @property
    def end(self) -> int:
        return int(self.meta[0])

    def tail(self) -> list[int]:
        """The history's last ``TAIL`` tokens in the window (fewer where it holds fewer)."""
        end = self.end
        return self.tok[max(end - TAIL, self.p0):end].tolist()

    def steppable(self, history: Sequence[int]) -> bool:
        """Whether ``history`` is the list this window was read from, one token longer, its last
        ``TAIL`` earlier tokens the window's, its new one an id (not a placeholder, inside int32)."""
        known = self.end - self.p0
        return (history is self.source and len(history) == known + 1 and 0 <= history[-1] < _INT32
                and list(history[max(known - TAIL, 0):known]) == self.tail())


_EMPTY = np.zeros(0, dtype=np.int32)
_EMPTY16 = np.zeros(0, dtype=np.uint16)
_INT32 = 1 << 31
#: Steps in a row a history could not be stepped natively (another list, a placeholder, a rewrite)
#: before its row stays on the Python processor (a scoped row's stretch, a fresh list each step).
MISSES = 2
#: Earlier tokens of a history compared with the window's each step (``dry.TAIL_CHECKED``, the
#: Python processors' own): engines append to a row's list and rewrite at most its newest tokens.
TAIL = 16
_last, _is, _plus1 = itemgetter(-1), operator.is_, (1).__add__
_before_last, _tail = itemgetter(slice(-TAIL - 1, -1)), itemgetter(slice(-TAIL, None))


_SEEN = threading.local()  # per thread: width -> the call's scratch


def scratch_seen(width: int) -> np.ndarray:
    """The call's scratch for ``width`` ids (all -1, as every call leaves it), one per width and
    thread: a layout change makes no new one (at vocab 151936 it is 600 kB)."""
    kept: dict[int, np.ndarray] | None = getattr(_SEEN, "by_width", None)
    if kept is None:
        kept = _SEEN.by_width = {}
    scratch = kept.get(width)
    if scratch is None:
        if len(kept) >= 8:
            kept.clear()
        scratch = kept[width] = np.full(width, -1, dtype=np.int32)
    return scratch


def window_scratch(width: int, w: int) -> tuple[int, int, int, int]:
    """The addresses of ``dry_window``'s scratch for logits ``width`` ids wide and windows up to
    ``w`` columns (``scratch_seen``'s, then the Z-values, the hit ids and amounts), one set per
    thread, grown as needed."""
    kept: tuple[int, int, tuple[int, int, int, int], tuple[np.ndarray, ...]] | None = getattr(_SEEN, "window", None)
    if kept is None or kept[0] != width or kept[1] < w:
        n = max(w, 256)
        arrays = (scratch_seen(width), np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.float64))
        addresses = (arrays[0].ctypes.data, arrays[1].ctypes.data, arrays[2].ctypes.data, arrays[3].ctypes.data)
        kept = _SEEN.window = (width, n, addresses, arrays)
    return kept[2]


class NativeStep:
    """The native rows of one ``DryGroup`` layout (``deciders``, logits rows ``width`` apart), each
    row's window kept on its processor (``NativeRow``) across layouts. Each step ``decide(histories)``
    steps every row whose history is the list it last read, one token longer, its last ``TAIL``
    earlier tokens unchanged (a rewrite deeper in the same list goes unseen, as on the Python
    processors) and its new token no placeholder, in one
    call of ``fn`` (``library()``), and returns the deciders the Python processors decide this step
    (in row order: multi-token breakers, a processor deciding two rows of the layout, a history
    that is not steppable, a row past ``MISSES``)
    with the native rows' flat indices and amounts. A row it could not step is set up again from
    its history (O(window)) at its next step."""

    def __init__(self, fn: Any, deciders: list[Decider], width: int) -> None:
        self.fn, self.deciders, self.width = fn, deciders, width
        self.python: list[Decider] = []
        self.native: list[Decider] = []
        # a processor holds one window: one that decides two rows of the layout stays on Python
        shared = {key for key, n in Counter(id(d[2]) for d in deciders).items() if n > 1}
        for decider in deciders:
            native = decider[2].native_params() is not None and id(decider[2]) not in shared
            (self.native if native else self.python).append(decider)
        self.states: list[NativeRow] = []
        for _, _, processor in self.native:
            if processor.native_row is None:
                processor.native_row = NativeRow()
            self.states.append(processor.native_row)
        self.stale = True  # the arrays below are made again before the next call
        self.seen = scratch_seen(width)
        self.read = reader()

    def _pack(self, histories: Sequence[Sequence[int]]) -> None:
        """Rows not set up, set up from ``histories`` (where they can be); the arrays of a call over
        the rows set up, and the deciders left to the Python processors."""
        left = list(self.python)
        active: list[int] = []
        for i, st in enumerate(self.states):
            if not len(st.tok) and st.misses <= MISSES and not self._setup(i, histories[self.native[i][0]]):
                st.misses += 1
            if len(st.tok) and st.misses <= MISSES:
                active.append(i)
            else:
                left.append(self.native[i])
        self.left = sorted(left, key=lambda d: d[0])  # the Python processors' deciders, in row order
        params = [self.native[i][2].native_params() for i in active]
        states = [self.states[i] for i in active]
        self.a_deciders = [self.native[i] for i in active]
        self.a_rows = [self.native[i][0] for i in active]
        self.a_states = states
        i64 = np.int64
        self.tok_ptrs = np.array([st.tok.ctypes.data for st in states], dtype=i64)
        self.len_ptrs = np.array([st.lens.ctypes.data for st in states], dtype=i64)
        self.end_ptrs = np.array([st.meta.ctypes.data for st in states], dtype=i64)
        self.new = np.zeros(len(states), dtype=np.int32)
        self.lookback = np.array([p.lookback for p in params], dtype=i64)
        self.cap = np.array([p.cap for p in params], dtype=i64)
        self.allowed = np.array([p.allowed for p in params], dtype=i64)
        self.cap_exp = np.array([p.cap_exp for p in params], dtype=i64)
        self.table_ptrs = np.array([p.amounts.ctypes.data for p in params], dtype=i64)
        self.mask_ptrs = np.array([p.singles.ctypes.data if len(p.singles) else 0 for p in params], dtype=i64)
        self.mask_lens = np.array([len(p.singles) for p in params], dtype=i64)
        self.bases = np.array([row * self.width for row in self.a_rows], dtype=i64)
        self.keep = params  # the tables' memory, while the arrays point at it
        self.slack = min((len(st.tok) - st.end - 1 for st in states), default=0)
        room = sum(min(p.lookback, len(st.tok)) for p, st in zip(params, states))
        self.out_flat = np.zeros(max(room, 1), dtype=i64)
        self.out_amount = np.zeros(max(room, 1), dtype=np.float64)
        self.sources = [st.source for st in states]
        known = [st.end - st.p0 for st in states]
        self.expected = [k + 1 for k in known]
        #: every row's last ``TAIL`` history tokens, as the next step's history must hold them before its new one
        self.tails = [st.tail() for st in states]
        self.recovering = [st for st in states if st.misses]  # their misses end at their next step
        #: the call's array arguments as addresses (``ndarray.ctypes`` makes an object per read)
        self.args = tuple(a.ctypes.data for a in (self.tok_ptrs, self.len_ptrs, self.end_ptrs, self.new, self.lookback,
                                                   self.cap, self.allowed, self.cap_exp, self.table_ptrs, self.mask_ptrs,
                                                   self.mask_lens, self.bases))
        self.scratch = tuple(a.ctypes.data for a in (self.seen, self.out_flat, self.out_amount))
        #: the C reader checks the rows' lists and reads their new tokens (every history a list)
        self.reads = self.read is not None and all(type(source) is list for source in self.sources)
        if self.reads:
            self.r_arrays = (np.array(self.a_rows, dtype=i64), np.array([id(src) for src in self.sources], dtype=i64),
                             np.array(self.expected, dtype=i64))
            self.read_args = (*(a.ctypes.data for a in self.r_arrays), self.args[0], self.args[2], TAIL, self.args[3])
        self.stale = False

    def _setup(self, i: int, history: Sequence[int]) -> bool:
        """Row ``i``'s window from ``history`` but its newest token (the step adds it); ``False``
        where it cannot be stepped natively (empty, a placeholder, an id past int32)."""
        st, processor = self.states[i], self.native[i][2]
        if not history or min(history) < 0 or max(history) >= _INT32:
            return False
        st.tok, st.lens, n = processor.native_window(history[:-1])
        st.meta[0] = n
        st.p0 = n - (len(history) - 1)
        st.source = history
        return True

    def _grow(self) -> None:
        """Every row set up with no room for the next token: where the tokens before its window (and
        its last ``TAIL``) fill half its buffers, the window moved to their start, so a buffer stays
        within four times the look-back whatever the history's length; else buffers twice as long.
        The arrays are made again."""
        for st, params in zip(self.a_states, self.keep):
            end = st.end
            if end + 1 < len(st.tok):
                continue
            keep = max(params.lookback, TAIL) + 1
            drop = end - keep
            if drop >= len(st.tok) // 2:
                st.tok[:keep] = st.tok[drop:end]
                st.lens[:keep] = st.lens[drop:end]
                st.meta[0] = keep
                st.p0 -= drop  # (negative once the prompt's tail is gone: ``end - p0`` stays the history's length)
            else:
                st.tok = np.concatenate((st.tok, np.zeros(len(st.tok), dtype=np.int32)))
                st.lens = np.concatenate((st.lens, np.zeros(len(st.lens), dtype=np.uint16)))
        self.stale = True

    # -- one step --------------------------------------------------------------------------------
    def decide(self, histories: Sequence[Sequence[int]]) -> tuple[list[Decider], NativeHits]:
        """See the class doc: ``(deciders for the Python processors, the native rows' hits)``."""
        if self.stale:
            self._pack(histories)
        if self.slack <= 0:
            self._grow()
            self._pack(histories)
        if not self.a_states:
            return self.left, NativeHits.of([], [])
        if self.reads:  # the lists checked and read in C, the rows' loads overlapping
            if type(histories) is list and self.read(len(self.a_states), histories, *self.read_args) < 0:
                return self._stepped()
            return self._one_by_one(list(map(histories.__getitem__, self.a_rows)))
        hs = list(map(histories.__getitem__, self.a_rows))
        lens = list(map(len, hs))
        if (lens == self.expected and all(map(_is, hs, self.sources))
                and list(map(_before_last, hs)) == self.tails):
            toks = list(map(_last, hs))
            if min(toks) >= 0 and max(toks) < _INT32:
                self.expected = list(map(_plus1, lens))
                self.tails = list(map(_tail, hs))
                self.new[:] = toks
                return self._stepped()
        return self._one_by_one(hs)

    def _stepped(self) -> tuple[list[Decider], NativeHits]:
        """Every row stepped by one call (their new tokens in ``new``)."""
        self.slack -= 1
        count = self.fn(len(self.a_states), *self.args, self.width, *self.scratch)
        if self.recovering:
            for st in self.recovering:
                st.misses = 0
            self.recovering = []
        return self.left, NativeHits(count, self.out_flat, self.out_amount, *self.scratch[1:])

    def _one_by_one(self, hs: list[Sequence[int]]) -> tuple[list[Decider], NativeHits]:
        """The rows one at a time: each steppable one stepped by a call of its own; the others to
        the Python processors, set up again at their next step."""
        left = list(self.left)
        flat: list[int] = []
        amounts: list[float] = []
        self.slack -= 1
        for j, (h, st) in enumerate(zip(hs, self.a_states)):
            if not st.steppable(h):
                left.append(self.a_deciders[j])
                st.misses += 1
                st.tok, st.lens = _EMPTY, _EMPTY16
                continue
            st.misses = 0
            self.new[j] = h[-1]
            row_args = [a + (4 if k == 3 else 8) * j for k, a in enumerate(self.args)]  # ``new`` is int32
            count = self.fn(1, *row_args, self.width, *self.scratch)
            flat += self.out_flat[:count].tolist()
            amounts += self.out_amount[:count].tolist()
        self.stale = True
        left.sort(key=lambda d: d[0])
        return left, NativeHits.of(flat, amounts)
