"""Admission's per-kind rules (``dynlogits.specs.admission``): every built-in wire kind's declaration
names its ``RULES`` in the module named after it, a kind without one (a plug-in's) is opaque, and the
generic walks and the budget name no kind (a kind's name appears only in its own module)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from dynlogits.specs.admission.lookup import OPAQUE, KindRules, rules_of_kind
from dynlogits.specs.builtin import BUILTIN
from dynlogits.specs.fast import BY_KIND

SPECS = Path(__file__).resolve().parents[2] / "specs"
GENERIC = [SPECS / "consistency.py", SPECS / "consistency_walks.py", SPECS / "effects.py", SPECS / "admission_work.py",
           SPECS / "admission" / "__init__.py", SPECS / "admission" / "rules.py"]


@pytest.mark.parametrize("kind", sorted(BY_KIND))
def test_every_wire_kind_declares_its_rules_in_its_own_module(kind: str) -> None:
    module = SPECS / "admission" / f"{kind}.py"
    assert module.is_file()
    assert BUILTIN[kind].admission == f"dynlogits.specs.admission.{kind}:RULES"
    assert isinstance(rules_of_kind(kind), KindRules)
    assert f"dynlogits.specs.admission.{kind}" in sys.modules


def test_a_kind_without_rules_is_opaque() -> None:
    for kind in ("acme.dry", "no_such_kind", "rules"):
        assert rules_of_kind(kind) is OPAQUE
    assert OPAQUE == KindRules()


def test_the_generic_modules_name_no_kind() -> None:
    """A kind's name as a word (one with ``_``) or quoted (a one-word name: ``trigger`` and ``python -m`` are words of
    their own; ``reasoning`` is a phase too) occurs in no generic module."""
    words = [rf"\b{re.escape(kind)}\b" if "_" in kind else f"[\"'`]{re.escape(kind)}[\"'`]" for kind in sorted(BY_KIND)
             if kind != "reasoning"]  # also a phase (a scope), which the walks name
    names = re.compile("|".join(words))
    for path in GENERIC:
        text = path.read_text()
        assert names.findall(text) == [], path.name
        assert "kind ==" not in text and "kind !=" not in text and "kind in" not in text, path.name
