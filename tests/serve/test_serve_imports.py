"""No import circle between the modules of ``dynlogits/serve``: read from the sources, counting every
import (inside functions and under ``TYPE_CHECKING`` too)."""

from __future__ import annotations

import ast
from pathlib import Path

SERVE = Path(__file__).resolve().parents[2] / "dynlogits" / "serve"


def _modules() -> dict[str, Path]:
    root = SERVE.parents[1]
    return {".".join(p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"): path
            for path in SERVE.rglob("*.py")}


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found |= {target, *(f"{target}.{alias.name}" for alias in node.names)}
    return {m for m in found if m in known and m != module}


def _circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules in import order, the first repeated last), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def test_the_circle_finder_finds_one() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


def test_no_module_of_serve_imports_itself_through_others() -> None:
    modules = _modules()
    edges = {m: _imports(m, p, set(modules)) for m, p in modules.items()}
    assert "dynlogits.serve.worker.state" in edges["dynlogits.serve.worker.engine_stream"]  # the walk sees imports
    assert _circle(edges) is None
