"""A request whose entries read its prompt (``PROMPT_BOUND_KINDS``) has at most ``max_prompt_tokens``
prompt tokens; the problem names the prompt, the entry that reads it and the limit."""

from __future__ import annotations

from dynlogits.specs import SpecLimits, parse_entries
from dynlogits.specs.builtin import BUILTIN
from dynlogits.specs.prompt_limit import PROMPT_BOUND_KINDS, prompt_limit_problem

ENTRIES = parse_entries([{"kind": "banned_tokens", "token_ids": [3]}, {"kind": "prompt_tokens", "mode": "boost"}])
PATHS = ["deployment entries[0]", "logits_processors[0]"]


def test_a_prompt_over_the_limit_is_refused_when_an_entry_reads_it() -> None:
    problem = prompt_limit_problem(ENTRIES, 9, SpecLimits(max_prompt_tokens=8), path="messages", paths=PATHS)
    assert problem is not None and problem.path == "messages"
    assert problem.rule == "is 9 tokens; logits_processors[0] (prompt_tokens) reads at most 8 (limit max_prompt_tokens)"


def test_a_prompt_at_the_limit_or_read_by_no_entry_passes() -> None:
    assert prompt_limit_problem(ENTRIES, 8, SpecLimits(max_prompt_tokens=8), path="prompt", paths=PATHS) is None
    assert prompt_limit_problem(ENTRIES[:1], 10**6, SpecLimits(max_prompt_tokens=8), path="prompt", paths=PATHS) is None


def test_wire_dicts_are_read_by_kind_too() -> None:
    assert prompt_limit_problem([{"kind": "prompt_tokens", "mode": "restrict"}], 3, SpecLimits(max_prompt_tokens=2),
                                path="prompt", paths=["dynamo_logits[0]"]) is not None
    assert PROMPT_BOUND_KINDS == {kind for kind, declared in BUILTIN.items() if declared.reads_prompt}
    assert {"prompt_tokens", "no_repeat_ngram"} <= PROMPT_BOUND_KINDS
