"""The kit's checks of the zoo's kinds can fail: each mutant below (a processor or a realization that
breaks one rule of docs/specs.md) fails its check on every shipped adapter's drivers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from dynlogits.processors import multiple_choice, registry
from dynlogits.processors.device_thinking import BIG, SpanTables
from dynlogits.processors.multiple_choice import MultipleChoiceProcessor
from dynlogits.processors.trigger import TriggerProcessor, TriggerTables
from dynlogits.testing import CHECKS, SHIPPED, run_check
from dynlogits.testing.runner import drivers_for, resolve


def _check(name: str) -> Any:
    return next(c for c in CHECKS if c.name == name)


def _last_occurrence(self: TriggerProcessor, ids: Sequence[int]) -> int | None:
    t = self.trigger
    return next((end for end in range(len(ids), t.__len__() - 1, -1) if tuple(ids[end - len(t) : end]) == t), None)


_WRITE = SpanTables._write_consts


def _restarts_at_each_occurrence(self: SpanTables, slot: int) -> None:
    """The device side of the same mutant (Model Runner V2): inside a trigger's span the trigger is
    looked for again and each occurrence restarts the span, so it follows the last one."""
    _WRITE(self, slot)
    if isinstance(self, TriggerTables):
        start, _end, (_closed, out_open) = self._rows[slot]
        again = [BIG * len(start) + 1, 0, 1, out_open]
        aligned = [-(1 << 40)] * (self.width - len(start)) + list(start)  # right-aligned, padded as the tables pad
        self.consts.set(slot, aligned + again + aligned + again)


def _fires_at_last_occurrence(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(TriggerProcessor, "fired_at", _last_occurrence)
    mp.setattr(SpanTables, "_write_consts", _restarts_at_each_occurrence)


def _no_eos_after_eos(self: MultipleChoiceProcessor, ids: Sequence[int]) -> tuple[int, ...]:
    node = 0
    for token in ids:
        node = self._children[node].get(token)
        if node is None:
            return ()
    return tuple(sorted({*self._children[node], *((self._eos,) if self._ends[node] else ())}))


_TEMPLATE = MultipleChoiceProcessor._template


def _no_eos_after_eos_on_the_device(mp: pytest.MonkeyPatch) -> None:
    """The same mutant for both paths: the host walk, and the device tables without the entries of a
    whole choice followed by EOS (Model Runner V2)."""
    def template(self: MultipleChoiceProcessor) -> Any:
        t = _TEMPLATE(self)
        keep = [i for i, at_least in enumerate(t.at_least) if not at_least]
        return dataclasses.replace(t, prefixes=tuple(t.prefixes[i] for i in keep), ids=tuple(t.ids[i] for i in keep),
                                   at_least=tuple(False for _ in keep))
    mp.setattr(MultipleChoiceProcessor, "allowed", _no_eos_after_eos)
    mp.setattr(MultipleChoiceProcessor, "_template", template)
    mp.setattr(multiple_choice, "_TABLES", multiple_choice._TABLES.emptied())  # tables built with the mutant, then dropped


def _with_context(kind: str, change: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    real = registry.BUILTIN_FACTORIES[kind]
    return lambda entry, ctx: real(entry, change(ctx))


MUTANTS: dict[str, tuple[str, Callable[[pytest.MonkeyPatch], None]]] = {
    "trigger fires at its last occurrence": (
        "a_trigger_fires_once_per_request_on_its_own_history", _fires_at_last_occurrence),
    "multiple_choice leaves no token after EOS": (
        "valid_vectors_behave_as_documented", _no_eos_after_eos_on_the_device),
    "deadline counts from realization": (
        "a_deadline_forces_the_stop_token_once_due",
        lambda mp: mp.setitem(registry.BUILTIN_FACTORIES, "deadline",  # type: ignore[arg-type]
                              _with_context("deadline", lambda c: dataclasses.replace(c, arrival_time=None)))),
    "prompt_tokens reads part of the prompt": (
        "prompt_bound_vectors_behave_as_documented",
        lambda mp: mp.setitem(registry.BUILTIN_FACTORIES, "prompt_tokens",  # type: ignore[arg-type]
                              _with_context("prompt_tokens", lambda c: dataclasses.replace(c, prompt_ids=c.prompt_ids[1:])))),
}


@pytest.mark.parametrize("adapter", sorted(SHIPPED))
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_kit_fails_a_mutant_of_a_zoo_kind(adapter: str, mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip({"sglang": "dynlogits.adapters.sglang.conformance", "trtllm": "torch"}.get(adapter, adapter))
    check_name, mutate = MUTANTS[mutant]
    mutate(monkeypatch)
    outcomes = [run_check(_check(check_name), driver) for driver in drivers_for(resolve(adapter))]
    assert outcomes and all(o.status == "failed" for o in outcomes), outcomes
