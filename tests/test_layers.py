"""The tree's layers hold: each part imports only the parts below it (specs <- policy, processors <-
sdk <- the conformance kit <- adapters <- serve; the CUDA test instruments and the tools on top),
the frontend imports nothing from the worker, and nothing on the engine side imports the serving
layer. Imports inside functions count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"dynlogits.specs": ROOT / "specs", "dynlogits.adapters": ROOT / "adapters", "dynlogits": ROOT / "dynlogits"}

#: part -> the parts it may import (itself always)
ALLOWED = {
    "specs": set(),
    "policy": {"specs"},
    "kernels": set(),  # fused device kernels: torch and Triton only
    "processors": {"specs", "kernels"},
    "sdk": {"specs", "policy", "processors", "kernels"},
    "adapters": {"specs", "policy", "processors", "sdk", "testing", "model_builder", "kernels"},
    "serve": {"specs", "policy", "processors", "sdk", "adapters", "model_builder", "kernels"},
    "testing": {"specs", "policy", "processors", "sdk", "model_builder", "kernels"},  # the kit adapters' drivers implement
    "testing.cuda": {"specs", "policy", "processors", "sdk", "adapters", "testing", "model_builder", "kernels"},
    "tools": {"specs", "policy", "processors", "sdk", "adapters", "serve", "testing", "testing.cuda", "model_builder",
              "kernels"},
    "model_builder": set(),
    "client": {"specs"},
}


def _module(path: Path) -> str:
    for package, folder in FOLDERS.items():
        if path.is_relative_to(folder):
            parts = path.relative_to(folder).with_suffix("").parts
            return ".".join([package, *[p for p in parts if p != "__init__"]])
    raise AssertionError(path)


def _part(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "dynlogits" or len(parts) < 2:
        return None
    if parts[1:3] == ["testing", "cuda"]:
        return "testing.cuda"
    return parts[1]


def _imports(path: Path) -> set[str]:
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names}  # ``from dynlogits import sdk``
    return {m for m in found if m.startswith("dynlogits")}


def _sources() -> list[Path]:
    return sorted(p for folder in FOLDERS.values() for p in folder.rglob("*.py"))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_only_the_layers_below_its_own(path: Path) -> None:
    own = _part(_module(path))
    if own is None or own == "__main__":
        return
    allowed = ALLOWED[own] | {own}
    bad = sorted(m for m in _imports(path) if _part(m) not in allowed and _part(m) is not None)
    assert bad == [], f"{_module(path)} ({own}) imports {bad}"


def test_the_frontend_imports_nothing_from_the_worker() -> None:
    frontend = ROOT / "dynlogits" / "serve" / "frontend"
    bad = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m.startswith("dynlogits.serve.worker"))
           for p in frontend.rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}
