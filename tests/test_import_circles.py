"""No import circle anywhere in the distribution (``dynlogits``, ``dynlogits.specs``,
``dynlogits.adapters``): read from the sources, counting every import, those inside functions and
under ``TYPE_CHECKING`` too (a lazy import that breaks a circle at load time is still a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: folder -> the package it installs as (pyproject's package-dir)
PACKAGES = {"dynlogits": "dynlogits", "specs": "dynlogits.specs", "adapters": "dynlogits.adapters"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            parts = [p for p in path.relative_to(base).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from pkg import mod`` imports the module; ``from mod import name``, the module
            found |= {f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target for alias in node.names}
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


def test_no_module_imports_itself_through_others() -> None:
    modules = _modules()
    edges = {m: _imports(m, p, set(modules)) for m, p in modules.items()}
    assert "dynlogits.specs.builtin" in edges["dynlogits.specs.admission.lookup"]  # the walk sees imports
    assert "dynlogits.specs.kinds" in edges["dynlogits.specs.builtin.banned_tokens"]
    assert _circle(edges) is None
