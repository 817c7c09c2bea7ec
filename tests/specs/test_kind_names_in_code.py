"""No code outside a kind's own files names a built-in kind: every string constant equal to a kind's
name in specs/, dynlogits/policy/, dynlogits/sdk/ and adapters/ sits in a file named after that kind
(``<kind>.py`` or ``<kind>_<what>.py``). ``reasoning`` is also the name of a phase and a scope
value (``specs/entry_base.py``), so it is the one name allowed elsewhere (docs/architecture.md,
"Adding a built-in kind")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dynlogits.specs.builtin import BUILTIN

ROOT = Path(__file__).resolve().parents[2]
TREES = ("specs", "dynlogits/policy", "dynlogits/sdk", "adapters")
#: a phase and a scope value as well as a kind
ALSO_A_WORD = {"reasoning"}
FILES = sorted(p for tree in TREES for p in (ROOT / tree).rglob("*.py") if "__pycache__" not in p.parts)


def _kinds_named_in(path: Path) -> list[tuple[int, str]]:
    """The (line, kind) of each string constant naming a built-in kind the file is not named after."""
    names = set(BUILTIN) - ALSO_A_WORD
    return sorted({(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
                   and not (path.stem == node.value or path.stem.startswith(node.value + "_"))})


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_no_code_names_a_kind_outside_its_own_files(path: Path) -> None:
    assert _kinds_named_in(path) == [], str(path.relative_to(ROOT))


def test_a_branch_on_a_kind_name_in_a_shared_file_is_found(tmp_path: Path) -> None:
    shared = tmp_path / "shared.py"
    shared.write_text('def f(entry):\n    return entry.kind == "banned_tokens"\n')
    own = tmp_path / "banned_tokens_rules.py"
    own.write_text(shared.read_text())
    assert _kinds_named_in(shared) == [(2, "banned_tokens")]
    assert _kinds_named_in(own) == []
