"""CPU-test shim: import SGLang's scheduler and sampler modules without its engine. Not used in
production (where SGLang is installed with its dependencies, ``import sglang`` works).

* ``register_bare_sglang()``: a bare ``sglang`` package module over the installed folder, so
  ``sglang.srt.*`` imports without ``sglang/__init__.py`` (``sglang/srt/`` has no ``__init__.py``).
* ``stub_broken_torchvision()``: a placeholder for the ``torchvision.transforms`` import of
  ``sglang.srt.configs`` (this index's torchvision builds are CUDA-only; tests and drivers only).

``import_sglang_srt()`` applies both; ``sglang_version()`` names the SGLang actually imported."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

__all__ = ["SglangUnavailable", "import_sglang_srt", "register_bare_sglang", "sglang_version", "stub_broken_torchvision"]


class SglangUnavailable(ImportError):
    """SGLang is not installed in this environment."""


def register_bare_sglang() -> None:
    """Make ``sglang.srt.*`` importable without running ``sglang/__init__.py`` (no-op once
    ``sglang`` is imported, shim or real)."""
    if "sglang" in sys.modules:
        return
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SglangUnavailable("sglang is not installed (scripts/setup-env.sh installs sglang==0.5.23 with --no-deps)")
    module = types.ModuleType("sglang", "bare package module registered by dynlogits.adapters.sglang.compat (CPU tests)")
    module.__path__ = list(spec.submodule_search_locations)
    module.__spec__ = importlib.machinery.ModuleSpec("sglang", None, is_package=True)
    module.__spec__.submodule_search_locations = module.__path__
    sys.modules["sglang"] = module


class _Placeholder(types.ModuleType):
    """A module whose every public attribute is an empty class (for ``import x.y as T`` at import time)."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__module__": self.__name__})


_TORCHVISION_MODULES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


def stub_broken_torchvision() -> bool:
    """Install the torchvision placeholder when ``import torchvision`` fails; ``True`` if installed.
    ``transformers`` is imported first, so its cached availability check sees torchvision missing."""
    import transformers.image_utils  # noqa: F401  - caches "torchvision unavailable" before the stub exists

    if "torchvision" in sys.modules:
        return isinstance(sys.modules["torchvision"], _Placeholder)
    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.modules.pop("torchvision", None)
    else:
        return False
    for name in _TORCHVISION_MODULES:
        module = _Placeholder(name, "placeholder installed by dynlogits.adapters.sglang.compat (CPU tests only)")
        module.__path__ = []
        sys.modules[name] = module
    return True


def import_sglang_srt() -> None:
    """Both shims, for the CPU tests and the conformance driver."""
    register_bare_sglang()
    stub_broken_torchvision()


def sglang_version() -> str:
    """The version of the ``sglang`` package this process imports (``sglang/version.py``)."""
    register_bare_sglang()
    from sglang.version import __version__

    return str(__version__)
