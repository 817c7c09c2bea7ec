"""``dry``'s lowering of float32 host logits in place (CPU steps of both runners: the V1 runner's
``DryGroup`` and Model Runner V2's ``dry_device.lower_window_``): the hosted processor's float32
results bit for bit, through views of the logits' memory kept per address (``host_f32_view``, a
Python-float loop with no tensor or numpy call for a few ids; ``host_f32_array``, a numpy array for
the V2 route, no ``Tensor.numpy`` call)."""

from __future__ import annotations

import ctypes
import struct
from operator import itemgetter
from typing import Any

import numpy as np
import torch

__all__ = ["HOST_LOOP_MAX", "ROUNDED_KEPT", "VIEWS_KEPT", "_lower_host_f32", "_lower_host_view", "host_f32_array",
           "host_f32_view"]

_F32_MAX = float(np.finfo(np.float32).max)
_F32_LOWEST = float(np.finfo(np.float32).min)
_NEG_INF = float("-inf")


#: float64 amount -> its float32 rounding (at most float32's largest), for ``_lower_host_f32``: a
#: step's amounts are a few objects of the shared tables, rounded once (cleared past ``ROUNDED_KEPT``)
_ROUNDED32: dict[float, float] = {}
ROUNDED_KEPT = 4096


def _round32(amount: float) -> float:
    """``amount`` at most float32's largest, rounded to float32 as numpy and torch round float64."""
    value: float = struct.unpack("f", struct.pack("f", amount if amount <= _F32_MAX else _F32_MAX))[0]
    if amount > 0.0:  # a key equal to no other of another sign (0.0 == -0.0)
        if len(_ROUNDED32) >= ROUNDED_KEPT:
            _ROUNDED32.clear()
        _ROUNDED32[amount] = value
    return value


#: Ids past which float32 host logits are lowered by numpy (a few calls, each a fixed cost after the
#: logits' copy evicted the cache) rather than element by element in Python floats.
HOST_LOOP_MAX = 256


def _lower_host_f32(logits: np.ndarray, flat: list[int], amounts: list[float]) -> None:
    """float32 host logits (flat): ``logits[i]`` lowered by its amount, rounded to float32 first,
    for each ``i`` of ``flat`` (distinct), as the hosted processor lowers them: a finite logit stays finite
    (at worst float32's lowest), ``-inf``, ``+inf`` and NaN stay. Up to ``HOST_LOOP_MAX`` ids in
    Python floats: a float32 difference computed in float64 and rounded to float32 on the store is
    the float32 difference (float64 holds over twice float32's precision), with no numpy or torch
    call (each one's first call after the logits' copy misses the cache); past it, numpy."""
    if len(flat) > HOST_LOOP_MAX:
        if max(amounts) > _F32_MAX:
            amounts = [a if a <= _F32_MAX else _F32_MAX for a in amounts]
        index = np.array(flat, dtype=np.int64)
        kept = logits[index]
        with np.errstate(over="ignore"):  # past float32's range: -inf, floored below
            lowered = kept - np.array(amounts, dtype=np.float32)
        np.maximum(lowered, np.minimum(kept, np.float32(_F32_LOWEST)), out=lowered)
        logits[index] = lowered
        return
    _lower_host_view(logits.data, flat, amounts)


#: (address, length) -> a float32 view of that host memory, for ``host_f32_view`` (cleared past it)
_VIEWS: dict[tuple[int, int], memoryview[float]] = {}
VIEWS_KEPT = 8


def host_f32_view(flat: torch.Tensor) -> memoryview[float]:
    """A float32 view (format ``f``) of the memory of ``flat``, a 1-D float32 CPU tensor with
    stride 1, for the length of the call that holds ``flat``: made through ``ctypes`` and kept per
    (address, length), so a step whose logits lie where an earlier step's lay makes no object (a
    kept view is only used while a tensor holds that memory: the caller's). No numpy or tensor
    conversion (``Tensor.numpy``'s first call after the logits' copy costs tens of µs)."""
    key = (flat.data_ptr(), flat.shape[0])
    view = _VIEWS.get(key)
    if view is None:
        if len(_VIEWS) >= VIEWS_KEPT:
            _VIEWS.clear()
        view = _VIEWS[key] = memoryview((ctypes.c_float * key[1]).from_address(key[0])).cast("B").cast("f")
    return view


#: (address, length) -> a float32 numpy array over that host memory, for ``host_f32_array``
_ARRAYS: dict[tuple[int, int], np.ndarray] = {}


def host_f32_array(address: int, length: int) -> np.ndarray:
    """The ``length`` float32 values at ``address`` (a contiguous float32 CPU tensor's
    ``data_ptr()`` and ``numel()``, which the caller holds while it uses them) as a numpy array,
    kept per (address, length) as ``host_f32_view``'s views are: no ``Tensor.numpy`` or tensor
    call per step."""
    key = (address, length)
    values = _ARRAYS.get(key)
    if values is None:
        if len(_ARRAYS) >= VIEWS_KEPT:
            _ARRAYS.clear()
        memory = memoryview((ctypes.c_float * length).from_address(address)).cast("B")
        values = _ARRAYS[key] = np.frombuffer(memory, dtype=np.float32)
    return values


def _lower_host_view(view: memoryview[Any], flat: list[int], amounts: list[float]) -> None:
    """``_lower_host_f32``'s Python-float loop on a float32 view (format ``f``) of the logits, for
    distinct ``flat`` indices: every one is read first, in one C-level pass (``itemgetter``: the
    reads' cache misses overlap, where the loop would take them one after the other), then each
    written once."""
    n = len(flat)
    if not n:
        return
    low, rounded = _F32_LOWEST, _ROUNDED32.get
    values = itemgetter(*flat)(view) if n > 1 else (view[flat[0]],)
    for i, amount, kept_i in zip(flat, amounts, values):
        penalty = rounded(amount)
        if penalty is None:
            penalty = _round32(amount)
        lowered_i = kept_i - penalty
        if lowered_i < low:  # past float32's range (``-inf`` there): the lowest, unless it was ``-inf``
            lowered_i = low if kept_i != _NEG_INF else kept_i
        view[i] = lowered_i
