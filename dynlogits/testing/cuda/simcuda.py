"""A CUDA-semantics model on the CPU: which ops of an apply path would synchronize on a GPU, and how
many device ops (launches) it queues.

``SimCuda`` runs code on CPU tensors presented as an accelerator's (``meta`` device type; code under
test branches on ``device.type != "cpu"``) and records every aten op at the dispatch level:

* syncs (PyTorch's list: ``torch.cuda.set_sync_debug_mode``, ``aten/src/ATen/native/cuda``):
  ``_local_scalar_dense``, ``nonzero`` and its callers (one-argument ``where``, boolean-mask indexing,
  ``masked_select``), ``unique``, ``repeat_interleave`` without ``output_size``, ``equal``,
  device-to-host copies except non-blocking ones into pinned memory, host-to-device copies that
  block or come from pageable memory, host operands of device ops, ``Event.synchronize`` and
  ``torch.cuda.synchronize``, and a Python number assigned to one element;
* launches: every op on a device tensor that queues device work (views, ``empty``, metadata excluded);
  a fused op (namespace ``dynlogits``, ``dynlogits.kernels.fused``) counts the kernels its CUDA
  implementation declares, and runs its CPU implementation (the eager reference) on the unwrapped
  tensors, its inner ops uncounted (torch routes custom ops through the Python dispatch key, so
  they reach ``__torch_dispatch__`` as one op).

A non-blocking copy to pinned memory lands only when a later event completes, at ``advance()`` or
``synchronize()`` (a sync). Use: ``with SimCuda() as sim:``, build device tensors with
``sim.device`` / ``sim.put``, read ``sim.syncs`` / ``sim.launches``; ``sim.value(t)`` reads uncounted."""

from __future__ import annotations

import contextlib
import traceback
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

__all__ = ["SimCuda", "SimTensor", "Sync"]

aten = torch.ops.aten
SIM_DEVICE = torch.device("meta")

#: ops that read device data on the host (the op itself syncs on CUDA)
_SYNCING = {
    aten._local_scalar_dense.default: "item/bool/int",
    aten.nonzero.default: "nonzero",
    aten.nonzero_numpy.default: "nonzero",
    aten.argwhere.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten._unique.default: "unique",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.equal.default: "equal",
    aten.is_nonzero.default: "item/bool/int",
    aten.where.default: "where(cond)",
}
#: ops that queue no device work
_FREE = {
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.detach.default,
    aten.alias.default, aten.lift_fresh.default, aten._unsafe_view.default, aten.is_pinned.default,
    aten.new_empty.default, aten.new_empty_strided.default, aten.set_.source_Storage_storage_offset,
}


@dataclass(frozen=True)
class Sync:
    """One syncing op: its kind and where in the code under test it ran."""

    kind: str
    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind} ({self.op}) at {self.where}"


#: storage address -> the pinned host tensor allocated there (while it lives)
_PINNED: dict[int, weakref.ref[torch.Tensor]] = {}


class SimTensor(torch.Tensor):
    """A CPU tensor (``elem``) presented as a tensor on the simulated accelerator."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> SimTensor:  # noqa: PYI034
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            device=SIM_DEVICE, requires_grad=False)
        r.elem = elem
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        raise RuntimeError("a simulated device tensor used outside its SimCuda context")

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # torch's own idiom for wrapper subclasses

    def __repr__(self) -> str:  # type: ignore[override]  # torch's takes tensor_contents=; without syncing: repr is not under test
        return f"SimTensor({self.elem!r})"


def _fused_launches(func: Any) -> int | None:
    """The kernels a fused op (namespace ``dynlogits``) declares; ``None`` for any other op."""
    if getattr(func, "namespace", None) != "dynlogits":
        return None
    from dynlogits.kernels.fused import declared_launches

    return declared_launches(func)


def _caller() -> str:
    """The innermost frame outside torch and this module (where the op was asked for)."""
    for frame in reversed(traceback.extract_stack(limit=40)):
        name = frame.filename
        if "/torch/" in name or name.endswith("simcuda.py") or "/contextlib.py" in name:
            continue
        return f"{name.rsplit('/', 3)[-1] if '/' in name else name}:{frame.lineno} {frame.name}"
    return "?"


class _Event:
    """``torch.cuda.Event`` in the stream model: done once the device caught up with its record."""

    def __init__(self, sim: SimCuda, **_: Any) -> None:
        self._sim = sim
        self._seq: int | None = None

    def record(self, stream: Any = None) -> None:
        self._sim._recorded += 1
        self._seq = self._sim._recorded

    def query(self) -> bool:
        return self._seq is None or self._seq <= self._sim._completed

    def synchronize(self) -> None:
        if not self.query():
            self._sim._sync("event.synchronize", "Event.synchronize")
            self._sim._complete(self._seq)  # type: ignore[arg-type]  # a recorded event has its sequence number

    def wait(self, stream: Any = None) -> None:
        pass


def _one_element(target: SimTensor, index: Any, value: Any) -> bool:
    """Whether ``target[index] = value`` writes a Python number into a single element: on CUDA a
    blocking copy (``set_sync_debug_mode`` flags it); into several elements it is a fill."""
    if not isinstance(value, (bool, int, float)):
        return False
    parts = index if isinstance(index, tuple) else (index,)
    if not all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts):
        return False
    return target.elem[index].dim() == 0


class _Functions(TorchFunctionMode):
    """Catches what never reaches the dispatcher: tensors built from host data, ``.numpy()``."""

    def __init__(self, sim: SimCuda) -> None:
        super().__init__()
        self.sim = sim

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        sim = self.sim
        if func in (torch.tensor, torch.as_tensor) and sim._is_dev(kwargs.get("device")):
            data = args[0]
            if isinstance(data, torch.Tensor) and func is torch.as_tensor:
                return data.to(**kwargs)
            host = func(data, **{k: v for k, v in kwargs.items() if k != "device"})
            sim._sync("h2d copy from host data", func.__name__)
            sim.launches += 1
            return SimTensor(host)
        if func is torch.Tensor.__setitem__ and isinstance(args[0], SimTensor) and _one_element(args[0], args[1], args[2]):
            sim._sync("a number assigned to one element (copied from pageable host memory)", "__setitem__")
        if func in (torch.Tensor.numpy, torch.Tensor.tolist) and args and isinstance(args[0], SimTensor):
            sim._sync("d2h copy", func.__name__)
            return func(args[0].elem)
        return func(*args, **kwargs)


class SimCuda(TorchDispatchMode):
    """The recording layer (see the module doc). Re-entrant use is not supported."""

    device = SIM_DEVICE

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[Sync] = []
        self.launches = 0
        self.ops: list[str] = []  # every launch's op name, in order (for diagnosis)
        self._pinned = _PINNED  # shared by every context: pinned buffers outlive one (cached rings)
        self._recorded = 0
        self._completed = 0
        self._pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (event seq, host dst, device copy)
        self._functions = _Functions(self)
        self._stack = contextlib.ExitStack()

    # -- context ----------------------------------------------------------------------------------
    def __enter__(self) -> SimCuda:
        self._stack.__enter__()
        real_event, real_synchronize = torch.cuda.Event, torch.cuda.synchronize
        torch.cuda.Event = lambda *a, **k: _Event(self, **k)  # type: ignore[assignment,misc]  # the model of an event, while the context lasts
        torch.cuda.synchronize = self._synchronize
        self._stack.callback(setattr, torch.cuda, "Event", real_event)
        self._stack.callback(setattr, torch.cuda, "synchronize", real_synchronize)
        self._stack.enter_context(self._functions)
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._stack.__exit__(*exc)  # type: ignore[arg-type]  # the exception triple, passed on
        self.advance()  # the modelled device finishes what was queued, as a real one would: nothing waits forever

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Run harness code (the engine's own bookkeeping) without recording it."""
        syncs, launches, ops = list(self.syncs), self.launches, list(self.ops)
        try:
            yield
        finally:
            self.syncs, self.launches, self.ops = syncs, launches, ops

    # -- the harness's side -----------------------------------------------------------------------
    def put(self, host: torch.Tensor) -> torch.Tensor:
        """A device copy of ``host`` (harness setup: not recorded)."""
        return SimTensor(host.detach().clone())

    def wrap(self, host: torch.Tensor) -> torch.Tensor:
        """A device view of ``host``'s own memory (a runner buffer with a host mirror: UVA)."""
        return SimTensor(host)

    def value(self, t: torch.Tensor) -> torch.Tensor:
        """The CPU value of a device tensor (assertions: not recorded)."""
        return t.elem.clone() if isinstance(t, SimTensor) else t

    def advance(self) -> None:
        """The device catches up with everything queued (between engine steps)."""
        self._complete(self._recorded)

    # -- internals --------------------------------------------------------------------------------
    def _complete(self, seq: int) -> None:
        """Land the copies up to event ``seq``, then mark it done (in that order: another thread
        may read a copy as soon as its event says so)."""
        done = max(self._completed, seq)
        keep = []
        for at, dst, src in self._pending:
            if at <= done:
                dst.copy_(src)
            else:
                keep.append((at, dst, src))
        self._pending = keep
        self._completed = done

    def _synchronize(self, device: Any = None) -> None:
        """``torch.cuda.synchronize``: the host waits for everything queued."""
        self._sync("device synchronize", "torch.cuda.synchronize")
        self.advance()

    def _sync(self, kind: str, op: str) -> None:
        self.syncs.append(Sync(kind, op, _caller()))

    def _is_dev(self, device: Any) -> bool:
        return device is not None and torch.device(device).type == SIM_DEVICE.type

    def _mark_pinned(self, t: torch.Tensor) -> None:
        self._pinned[t.untyped_storage().data_ptr()] = weakref.ref(t)

    def _is_pinned(self, t: torch.Tensor) -> bool:
        ref = self._pinned.get(t.untyped_storage().data_ptr())
        return ref is not None and ref() is not None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204, C901
        kwargs = dict(kwargs or {})
        name = str(func.overloadpacket.__name__)
        devs: list[SimTensor] = []
        hosts: list[torch.Tensor] = []

        def unwrap(x: Any) -> Any:
            if isinstance(x, SimTensor):
                devs.append(x)
                return x.elem
            if isinstance(x, torch.Tensor):
                hosts.append(x)
            return x

        a = tree_map(unwrap, args)
        pin = bool(kwargs.pop("pin_memory", False))
        to_dev = self._is_dev(kwargs.get("device"))
        if to_dev:
            kwargs["device"] = torch.device("cpu")
        k = tree_map(unwrap, kwargs)
        on_dev = bool(devs) or to_dev

        if func is aten.is_pinned.default:
            return self._is_pinned(a[0])
        if func is aten._pin_memory.default:
            out = a[0].clone()
            self._mark_pinned(out)
            return out
        if func is aten._to_copy.default:
            src_dev = bool(devs)
            target_dev = to_dev or (src_dev and "device" not in kwargs)
            if src_dev and not target_dev and kwargs.get("non_blocking"):  # into new pinned memory, lands later
                value = func(*a, **k)
                out = torch.zeros_like(value)
                self._pending.append((self._recorded + 1, out, value))
                self._mark_pinned(out)
                return out
            if src_dev and not target_dev:
                self._sync("d2h copy", name)
            elif not src_dev and target_dev:
                if not (kwargs.get("non_blocking") and self._is_pinned(a[0])):
                    self._sync("h2d copy from pageable or blocking", name)
            out = func(*a, **k)
            if target_dev:
                self._launch(name)
                return SimTensor(out)
            if pin:
                self._mark_pinned(out)
            return out
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            non_blocking = bool(a[2] if len(a) > 2 else k.get("non_blocking", False))
            if isinstance(dst, SimTensor) and not isinstance(src, SimTensor):  # 0-dim too: ``dev[i] = 1.0``
                if not (non_blocking and self._is_pinned(src)):
                    self._sync("h2d copy from pageable or blocking", name)
            elif isinstance(src, SimTensor) and not isinstance(dst, SimTensor):
                if non_blocking and self._is_pinned(dst):  # a copy on the stream: a device op, landing later
                    self._pending.append((self._recorded + 1, dst, src.elem.clone()))
                    self._launch(name)
                    return dst
                self._sync("d2h copy", name)
                a[0].copy_(a[1])
                return dst
            if on_dev:
                self._launch(name)
            func(*a, **k)
            return dst

        if on_dev:
            kind = _SYNCING.get(func)
            if kind is None and func is aten.repeat_interleave.Tensor and k.get("output_size") is None:
                kind = "repeat_interleave without output_size"
            if kind is None and func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
                indices = a[1]
                if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
                    kind = "boolean-mask index"
            if kind is not None:
                self._sync(kind, name)
            if any(h.dim() > 0 for h in hosts):
                self._sync("host tensor operand (implicit h2d copy)", name)
            fused = _fused_launches(func)
            if fused is not None:
                for _ in range(fused):
                    self._launch(name)
            elif kind != "item/bool/int" and func not in _FREE and not getattr(func, "is_view", False):
                self._launch(name)

        out = func(*a, **k)
        if pin and isinstance(out, torch.Tensor):
            self._mark_pinned(out)
        if not on_dev or func is aten._local_scalar_dense.default or not isinstance(out, (torch.Tensor, tuple, list)):
            return out
        by_elem = {id(d.elem): d for d in devs}
        def wrap(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            same = by_elem.get(id(x))
            return same if same is not None else SimTensor(x)

        return tree_map(wrap, out)

    def _launch(self, name: str) -> None:
        """One queued device kernel."""
        self.launches += 1
        self.ops.append(name)
