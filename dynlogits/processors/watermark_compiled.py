"""``watermark``'s batched Gumbel-max draw as one compiled function on CUDA (eager everywhere else).

``draw`` is what the resident group calls. On a CUDA device it runs ``pure_draw`` through
``torch.compile(fullgraph=True, dynamic=True)`` (as vLLM compiles its own Philox PRF): the ten
Philox rounds, the uniform, the Gumbel noise, the temperature and the argmax in a few generated
kernels instead of about 150 eager ones. Anywhere else (the CPU, every CPU test) it runs the eager
reference, ``watermark_resident.batched_draw``.

* Compiled once per process, lazily, on the first draw over CUDA logits; never on the CPU path.
  A failure to compile or run the compiled function (no Triton, a dynamo error) logs one line
  and the process draws eagerly from then on: a request never fails for it.
  ``DYNLOGITS_WATERMARK_COMPILE=0`` keeps the eager draw.
* No sync: ``pure_draw`` is tensor ops on its inputs (device tensors) and Python integers taken
  from shapes; no ``.item()``, no host read, no data-dependent Python branch, no cache lookup.
* The same bits as the eager draw: the PRF is integer arithmetic (exact on any backend); the
  uniform's float64 division by ``2**24 + 1`` (which Inductor turns into a multiplication by its
  reciprocal on CUDA) rounds to the same float32 for all ``2**24`` mantissas (checked
  exhaustively in ``tests/processors/test_watermark_compiled.py``); Inductor is asked for eager
  numerics where the running torch has the knob (``COMPILE_OPTIONS``: IEEE division for ``x / T``,
  no FMA contraction, the CUDA libdevice, no flush to zero). The CUDA check
  (``python -m dynlogits.testing.cuda.check --watermark-only``) compares it with the eager draw
  and the CPU's, bit for bit, on a real GPU.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from .watermark_prf import _M0, _M1, _MASK, _ROUNDS, _TOKEN_DOMAIN, _W0, _W1, _mulhilo

__all__ = ["COMPILE_OPTIONS", "compile_options", "compiled_draw", "draw", "pure_draw", "reset"]

log = logging.getLogger(__name__)

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


_lock = threading.Lock()
_compiled: Draw | None = None
_failed = False


def compiled_draw() -> Draw | None:
    """The compiled ``pure_draw`` (made on the first call; ``torch.compile`` compiles it on its
    first run), or ``None`` where it failed or is turned off."""
    global _compiled, _failed
    if _failed or os.environ.get("DYNLOGITS_WATERMARK_COMPILE", "1") == "0":
        return None
    if _compiled is None:
        with _lock:
            if _compiled is None and not _failed:
                try:
                    _compiled = torch.compile(pure_draw, fullgraph=True, dynamic=True, options=compile_options())
                except Exception as exc:  # no compiler here: draw eagerly
                    _give_up(exc)
    return _compiled


def _give_up(exc: BaseException) -> None:
    global _failed
    _failed = True
    message = str(exc).splitlines()[0][:200] if str(exc) else ""
    log.warning("watermark: the compiled draw failed (%s: %s); drawing eagerly from now on", type(exc).__name__, message)


def _wants_compiled(rows: torch.Tensor) -> bool:
    return rows.device.type == "cuda"


def draw(rows: torch.Tensor, temperatures: torch.Tensor, states: torch.Tensor, keys: torch.Tensor, eager: Draw) -> torch.Tensor:
    """``eager(rows, temperatures, states, keys)``, through the compiled function where ``rows``
    are on a CUDA device and it compiled (see the module doc)."""
    if _wants_compiled(rows):
        fn = compiled_draw()
        if fn is not None:
            try:
                return fn(rows, temperatures, states, keys)
            except Exception as exc:  # a compile or run failure must not fail a request
                _give_up(exc)
    return eager(rows, temperatures, states, keys)


def reset() -> None:
    """Forget the compiled function and any failure (tests)."""
    global _compiled, _failed
    with _lock:
        _compiled, _failed = None, False
