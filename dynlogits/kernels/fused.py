"""A registry of fused ops: torch custom ops in the ``dynlogits`` namespace whose default (CPU)
implementation is an eager reference and whose CUDA implementation launches Triton kernels.

``fused_op(name, schema-less function, launches=..., mutates_args=...)`` declares one with
``torch.library.custom_op`` (``dynlogits::<name>``): the decorated function is the implementation
for every device (the eager reference, tensor ops), ``FusedOp.cuda`` registers the CUDA one, which
imports Triton lazily (only when a CUDA tensor arrives). ``launches`` is how many device kernels the
CUDA implementation launches: ``declared_launches(op)`` answers it for the CUDA model
(``dynlogits.testing.cuda.simcuda.SimCuda`` counts a ``dynlogits`` op as its declared launches and
runs its CPU implementation on the unwrapped tensors, uncounted). Nothing here imports Triton."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["NAMESPACE", "FusedOp", "declared_launches", "fused_op", "registered"]

#: the torch.library namespace of every fused op
NAMESPACE = "dynlogits"

_REGISTRY: dict[str, FusedOp] = {}


@dataclass
class FusedOp:
    """One declared op: its qualified name (``dynlogits::name``), the custom op (call it like the
    function), how many kernels its CUDA implementation launches, and its eager reference."""

    qualname: str
    op: Any  # torch._library.custom_ops.CustomOpDef (callable)
    launches: int
    eager: Callable[..., Any]  # the reference itself (the CPU implementation), callable on any device

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.op(*args, **kwargs)

    def cuda(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``fn`` as the CUDA implementation (decorator). It must launch ``launches`` kernels."""
        self.op.register_kernel("cuda", fn)
        return fn


def fused_op(name: str, *, launches: int, mutates_args: Iterable[str] = ()) -> Callable[[Callable[..., Any]], FusedOp]:
    """Declare ``dynlogits::name`` (decorator over its eager reference, typed as torch.library
    requires). Declaring a name twice is an error."""
    qualname = f"{NAMESPACE}::{name}"
    if qualname in _REGISTRY:
        raise ValueError(f"fused op {qualname} declared twice")

    def declare(fn: Callable[..., Any]) -> FusedOp:
        op = torch.library.custom_op(qualname, mutates_args=tuple(mutates_args))(fn)
        made = _REGISTRY[qualname] = FusedOp(qualname, op, launches, fn)
        return made

    return declare


def declared_launches(func: Any) -> int | None:
    """The declared launches of ``func`` (an ``OpOverload`` as ``__torch_dispatch__`` sees it, or an
    op's qualified name); ``None`` if it is not a fused op."""
    name = func if isinstance(func, str) else f"{getattr(func, 'namespace', '')}::{func._schema.name.split('::')[-1]}"
    made = _REGISTRY.get(name)
    return None if made is None else made.launches


def registered() -> dict[str, FusedOp]:
    """Every declared op by qualified name (a copy)."""
    return dict(_REGISTRY)
