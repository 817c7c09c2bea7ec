"""A plug-in kind that declares admission rules is checked for contradictions like a built-in;
one that declares none stays opaque; the verdicts kept per process follow the kinds in force."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from dynlogits.specs import ProcessorKind
from dynlogits.specs.admission.rules import KindRules
from dynlogits.specs.consistency import consistency_problems
from dynlogits.specs.kinds import KindError, kinds_registered
from dynlogits.specs.wire import decode_fast


class BanRangeSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["ban_range"] = "ban_range"
    start: Annotated[StrictInt, Field(ge=0)]
    stop: Annotated[StrictInt, Field(ge=0)]


def _masked(entry: BanRangeSpec) -> frozenset[int]:
    return frozenset(range(entry.start, entry.stop))


RULES: KindRules[BanRangeSpec] = KindRules(form="mask", ids=_masked, alone=True,
                                            size=lambda e: e.stop - e.start, field="start")
DECLARED = ProcessorKind("ban_range", BanRangeSpec, "acme.processors:make_ban_range", admission=RULES)
OPAQUE_KIND = ProcessorKind("ban_range", BanRangeSpec, "acme.processors:make_ban_range")


def _entries(*raw: dict[str, object]) -> list[object]:
    return [BanRangeSpec(**{k: v for k, v in r.items() if k != "kind"}) if r["kind"] == "ban_range"
            else decode_fast([r])[0] for r in raw]


def test_a_plugin_mask_that_empties_an_allow_list_is_refused_naming_it():
    with kinds_registered(DECLARED):
        entries = _entries({"kind": "allowed_tokens", "token_ids": [5, 6]}, {"kind": "ban_range", "start": 4, "stop": 8})
        problems = consistency_problems(entries, root="logits_processors")
    assert [p.path for p in problems] == ["logits_processors[1]"]
    assert "masks every token logits_processors[0] leaves allowed at output position 0" in problems[0].rule


def test_a_plugin_without_rules_stays_opaque_and_kept_verdicts_follow_the_kinds_in_force():
    raw = ({"kind": "allowed_tokens", "token_ids": [5, 6]}, {"kind": "ban_range", "start": 4, "stop": 8})
    with kinds_registered(OPAQUE_KIND):
        assert consistency_problems(_entries(*raw)) == []
    with kinds_registered(DECLARED):  # the same payload, now with rules: not answered from the kept verdict
        assert consistency_problems(_entries(*raw)) != []


def test_admission_rules_must_be_rules_or_an_import_string():
    with pytest.raises(KindError, match="admission must be a KindRules"):
        ProcessorKind("ban_range", BanRangeSpec, "acme.processors:make_ban_range", admission=object())  # type: ignore[arg-type]
