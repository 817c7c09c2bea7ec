"""The docs name only what exists: every test they cite as evidence, and every module or name of
this project they point a reader to (``docs/*.md`` and the README, inside backticks).

A refactor that moves a module or renames a test leaves no stale pointer: the docs' claims stay
checkable. Each checker is first shown a planted bad reference, so neither can pass by finding
nothing."""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

#: a test file by path (``tests/sync/test_x.py``), not a path inside another repository
TEST_PATH = re.compile(r"(?<![\w./])(tests/[\w/]+\.py)")
#: ``test_file.py::test_name``
TEST_PAIR = re.compile(r"(\w+\.py)::(test_\w+)")
#: a bare test name (``test_x``), not part of a pair, a path or a longer identifier
TEST_NAME = re.compile(r"(?<![:\w/.])(test_\w+)(?![\w.])")
#: a dotted name of this project (``dynlogits.processors.modes.ClockDecided``)
DOTTED = re.compile(r"(?<![\w./])((?:dynlogits|adapters|specs)(?:\.\w+)+)")


def _code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


@cache
def _test_defs() -> tuple[dict[str, set[str]], set[str]]:
    """Each test function's name -> the files (base names) that define it; every test file's base name."""
    defs: dict[str, set[str]] = {}
    files: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        files.add(path.name)
        for name in re.findall(r"^\s*(?:async\s+)?def (test_\w+)", path.read_text(), re.M):
            defs.setdefault(name, set()).add(path.name)
    return defs, files


def missing_tests(text: str) -> list[str]:
    """The test paths, ``file::test`` pairs and bare test names that ``text``'s code spans cite and
    the suite does not have."""
    defs, files = _test_defs()
    stems = {name.removesuffix(".py") for name in files}
    missing = []
    for span in _code_spans(text):
        missing += [p for p in TEST_PATH.findall(span) if not (ROOT / p).is_file()]
        missing += [f"{f}::{t}" for f, t in TEST_PAIR.findall(span) if f not in defs.get(t, set())]
        missing += [t for t in TEST_NAME.findall(span) if f"::{t}" not in span and t not in defs and t not in stems]
    return missing


def _resolves(dotted: str) -> bool:
    """Whether the longest importable prefix of ``dotted`` has the rest as attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def missing_names(text: str) -> list[str]:
    """The dotted names of this project that ``text``'s code spans cite and that do not resolve."""
    cited = {ref for span in _code_spans(text) for ref in DOTTED.findall(span)}
    return sorted(ref for ref in cited if not _resolves(ref))


def test_the_checkers_flag_planted_bad_references() -> None:
    planted = ("`tests/sync/test_no_such_file.py`, `test_surface.py::test_no_such_test`, `test_no_such_behaviour`, "
               "`dynlogits.no_such_module`, `dynlogits.processors.modes.NoSuchName`, and one good: "
               "`dynlogits.processors.modes`, `tests/test_docs_references.py`")
    assert missing_tests(planted) == ["tests/sync/test_no_such_file.py", "test_surface.py::test_no_such_test",
                                      "test_no_such_behaviour"]
    assert missing_names(planted) == ["dynlogits.no_such_module", "dynlogits.processors.modes.NoSuchName"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_test_the_docs_cite_exists(doc: Path) -> None:
    assert missing_tests(doc.read_text()) == [], f"{doc.name} cites tests the suite does not have"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_module_and_name_the_docs_cite_resolves(doc: Path) -> None:
    assert missing_names(doc.read_text()) == [], f"{doc.name} cites names that do not resolve"
