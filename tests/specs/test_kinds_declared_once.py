"""Each built-in kind is declared once, in ``dynlogits.specs.builtin.<kind>``, through the contract a
plug-in uses; what lists kinds is derived from the declarations, and outside the files named after a
kind its name appears only where docs/architecture.md ("Adding a built-in kind") says why."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from dynlogits.specs import builtin, entries, fast
from dynlogits.specs.kinds import KindError, ProcessorKind

ROOT = Path(__file__).resolve().parents[2]
NAMES = [k.kind for k in builtin.DECLARED]


@pytest.mark.parametrize("kind", NAMES)
def test_a_built_in_kind_is_one_module_declaring_its_kind(kind: str) -> None:
    module = next(m for m in builtin.MODULES if m.__name__.rsplit(".", 1)[1] == kind)
    declared = module.KIND
    assert isinstance(declared, ProcessorKind) and declared.builtin and declared.kind == kind
    assert declared.spec_model.__module__ == module.__name__
    assert declared.fast_model is None or declared.fast_model.__module__ == module.__name__
    if declared.wire:
        assert declared.admission == f"dynlogits.specs.admission.{kind}:RULES"
        assert declared.fast_model is not None and declared.fast_model.__struct_config__.tag == kind
    if declared.factory is not None:
        assert declared.factory == f"dynlogits.processors.{kind}:factory"


def test_the_unions_and_tables_follow_the_one_list_of_declarations() -> None:
    assert entries.ENTRY_MODELS == tuple(k.spec_model for k in builtin.DECLARED)
    assert entries.WIRE_MODELS == tuple(k.spec_model for k in builtin.DECLARED if k.wire)
    assert entries.ENTRY_KINDS == frozenset(NAMES)
    assert fast.FAST_MODELS == tuple(k.fast_model for k in builtin.DECLARED if k.fast_model is not None)
    assert list(fast.BY_KIND) == [k.kind for k in builtin.DECLARED if k.wire]
    assert entries.REQUEST_FORBIDDEN_KINDS == {k.kind for k in builtin.DECLARED if not k.client_allowed}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def test_a_plug_in_can_neither_take_a_built_in_name_nor_declare_itself_built_in() -> None:
    from typing import Literal

    class Banned(_Model):
        kind: Literal["banned_tokens"] = "banned_tokens"

    class Mine(_Model):
        kind: Literal["mine"] = "mine"

    with pytest.raises(KindError, match="is built in and cannot be re-registered by a plug-in"):
        ProcessorKind("banned_tokens", Banned, "acme.kinds:factory")
    with pytest.raises(KindError, match="only the kinds declared in dynlogits.specs.builtin are built in"):
        ProcessorKind("mine", Mine, "acme.kinds:factory", builtin=True)


#: Files of the specs layer, the policy layer and the adapters' kind-aware modules that are named
#: after no kind, and the kind names each may still hold (docs/architecture.md gives the reasons).
#: ``reasoning`` is left out everywhere: it is also a scope value, a config field and an English word.
SCOPED = sorted(
    [p for p in (ROOT / "specs").glob("*.py")
     if p.name not in {"consistency.py", "consistency_walks.py", "effects.py", "admission_work.py"}]
    + list((ROOT / "dynlogits" / "policy").glob("*.py"))
    + [ROOT / "dynlogits/processors/registry.py", ROOT / "adapters/vllm/native.py",
       ROOT / "adapters/transformers/generate.py"])
EXCEPTIONS = {"dynlogits/processors/registry.py": {"python"}}


@pytest.mark.parametrize("path", SCOPED, ids=[str(p.relative_to(ROOT)) for p in SCOPED])
def test_a_kind_is_named_only_in_its_own_files(path: Path) -> None:
    where = str(path.relative_to(ROOT))
    own = {k for k in NAMES if path.stem.startswith(k + "_")}  # a kind's further modules: <kind>_<what>.py
    words = set(NAMES) - {"reasoning"} - EXCEPTIONS.get(where, set()) - own
    found = sorted({m for m in re.findall(r"\b[a-z_]+\b", path.read_text()) if m in words})
    assert not found, (where, found)
