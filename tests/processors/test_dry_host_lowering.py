"""``dry``'s lowering of float32 host logits (vLLM's V1 runner on the CPU) element by element in
Python floats equals the float32 arithmetic of the tensor path bit for bit: a float32 difference
computed in float64 and rounded on the store, a finite logit kept finite, non-finite ones kept; the
V1 runner's group reads the tensor's own memory through a kept float32 view (``host_f32_view``);
the native step's C lowering (``dry_native``'s ``dry_lower``) gives the same bits."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from dynlogits.processors import dry_native
from dynlogits.processors.dry_lowering import HOST_LOOP_MAX, _lower_host_f32, _lower_host_view, host_f32_view

F32 = np.finfo(np.float32)


def _float32_reference(logits: np.ndarray, flat: np.ndarray, amounts: np.ndarray) -> np.ndarray:
    """The tensor path's arithmetic, in numpy float32: subtract, then floor at the lowest unless ``-inf``."""
    out = logits.copy()
    kept = out[flat]
    penalty = np.minimum(amounts, float(F32.max)).astype(np.float32)
    with np.errstate(over="ignore"):  # a difference past float32's range is -inf, as on the tensor path
        lowered = kept - penalty
    np.maximum(lowered, np.minimum(kept, F32.min), out=lowered)
    out[flat] = lowered
    return out


def _edge_logits(rng: np.random.Generator, n: int) -> np.ndarray:
    values = rng.standard_normal(n).astype(np.float32) * np.float32(rng.choice([1.0, 1e3, 1e30]))
    edges = np.array([np.inf, -np.inf, np.nan, F32.min, F32.max, -0.0, 0.0, F32.tiny, -F32.tiny,
                      np.float32(1e-45), F32.min / 2, np.float32(-3.3e38)], dtype=np.float32)
    at = rng.choice(n, size=min(n, len(edges) * 3), replace=False)
    values[at] = rng.choice(edges, size=len(at))
    return values


@pytest.mark.parametrize("ids", [HOST_LOOP_MAX, 3 * HOST_LOOP_MAX])  # element by element, numpy
@pytest.mark.parametrize("seed", range(6))
def test_lowering_host_float32_logits_equals_the_float32_arithmetic_bit_for_bit(seed: int, ids: int) -> None:
    rng = np.random.default_rng(seed)
    logits = _edge_logits(rng, 4096)
    flat = rng.choice(len(logits), size=ids, replace=False)
    amounts = np.concatenate([rng.uniform(0.0, 5.0, ids - ids // 3), 10.0 ** rng.uniform(-8, 45, ids // 3)])
    amounts[rng.choice(len(amounts), 5, replace=False)] = float(F32.max) * 1.5  # past float32: clamped
    rng.shuffle(amounts)
    want = _float32_reference(logits, flat, amounts)
    got = logits.copy()
    _lower_host_f32(got, flat.tolist(), amounts.tolist())
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    assert np.isfinite(got[flat][np.isfinite(logits[flat])]).all()  # the premise: finite stays finite


def test_a_logit_just_above_the_lowest_lowers_to_the_lowest_not_to_minus_infinity() -> None:
    logits = np.array([F32.min, F32.min / 2, -np.inf, np.inf, np.nan], dtype=np.float32)
    got = logits.copy()
    _lower_host_f32(got, [0, 1, 2, 3, 4], [float(F32.max)] * 5)
    assert got[0] == F32.min and got[1] == F32.min
    assert got[2] == -np.inf and got[3] == np.inf and np.isnan(got[4])


def test_amounts_rounded_once_and_kept_lower_as_when_first_rounded_signed_zeros_apart() -> None:
    rng = np.random.default_rng(11)
    logits = _edge_logits(rng, 512)
    logits[:4] = [-0.0, 0.0, -0.0, 0.0]
    flat = np.arange(HOST_LOOP_MAX)  # the signed zeros first, each under a signed zero amount
    amounts = np.concatenate([[0.0, -0.0, -0.0, 0.0], rng.choice([0.3, 1.75, 2.0 ** 0.5, 1e39], HOST_LOOP_MAX - 4)])
    want = _float32_reference(logits, flat, amounts)
    for _ in range(2):  # the second pass reads every amount's kept rounding
        got = logits.copy()
        _lower_host_f32(got, flat.tolist(), amounts.tolist())
        assert np.array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("seed", range(3))
def test_a_host_view_lowers_the_tensors_own_memory_as_the_numpy_path_does(seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(_edge_logits(rng, 4 * 1031).reshape(4, 1031))
    flat = rng.choice(logits.numel(), size=HOST_LOOP_MAX, replace=False)
    flat[:2] = [0, logits.numel() - 1]  # the first and the last element
    amounts = rng.uniform(0.0, 5.0, HOST_LOOP_MAX)
    want = _float32_reference(logits.numpy().reshape(-1), flat, amounts)
    _lower_host_view(host_f32_view(logits.view(-1)), flat.tolist(), amounts.tolist())
    assert np.array_equal(logits.numpy().reshape(-1).view(np.int32), want.view(np.int32))


def test_host_views_are_kept_per_address_and_length_and_read_only_their_tensor() -> None:
    a, b = torch.zeros(2, 64), torch.zeros(2, 64)
    view = host_f32_view(a.view(-1))
    assert host_f32_view(a.view(-1)) is view  # the same memory, a new flat view of it: kept
    assert host_f32_view(a[:1].reshape(-1)) is not view  # the same address, shorter: its own
    assert len(view) == a.numel()
    _lower_host_view(host_f32_view(b.view(-1)), [0, 127], [1.0, 2.0])
    assert a.count_nonzero() == 0
    assert b.view(-1)[0] == -1.0 and b.view(-1)[127] == -2.0 and b.count_nonzero() == 2


@pytest.mark.parametrize("ids", [0, 1, 2])
def test_a_host_view_lowers_no_id_one_id_or_two_as_the_float32_arithmetic(ids: int) -> None:
    rng = np.random.default_rng(ids)
    logits = torch.from_numpy(_edge_logits(rng, 2 * 257).reshape(2, 257))
    flat = rng.choice(logits.numel(), size=ids, replace=False)
    amounts = rng.uniform(0.5, 5.0, ids)
    want = _float32_reference(logits.numpy().reshape(-1), flat, amounts)
    _lower_host_view(host_f32_view(logits.view(-1)), flat.tolist(), amounts.tolist())
    assert np.array_equal(logits.numpy().reshape(-1).view(np.int32), want.view(np.int32))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
@pytest.mark.parametrize("seed", range(6))
def test_the_native_lowering_equals_the_float32_arithmetic_bit_for_bit(seed: int) -> None:
    lower = dry_native.lower_step(wait=True)
    assert lower is not None, "the native step did not build with this machine's cc"
    rng = np.random.default_rng(seed)
    logits = _edge_logits(rng, 4096)
    ids = 3 * HOST_LOOP_MAX
    flat = rng.choice(len(logits), size=ids, replace=False).astype(np.int64)
    amounts = np.concatenate([rng.uniform(0.0, 5.0, ids - ids // 3), 10.0 ** rng.uniform(-8, 45, ids // 3)])
    amounts[rng.choice(len(amounts), 5, replace=False)] = float(F32.max) * 1.5  # past float32: clamped
    rng.shuffle(amounts)
    want = _float32_reference(logits, flat, amounts)
    got = logits.copy()
    lower(ids, flat.ctypes.data, amounts.ctypes.data, got.ctypes.data)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    assert (got[flat] != logits[flat]).sum() > ids // 8  # the premise: logits were lowered
