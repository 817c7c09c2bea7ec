"""Where an adapter does not pass a fact a check needs, the check is skipped, naming the fact: the
prompt (an adapter that realizes requests without their prompt ids) and the arrival (a driver whose
``add`` cannot stamp one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dynlogits import sdk
from dynlogits.adapters.transformers.conformance import TransformersDriver
from dynlogits.testing import CHECKS, run_check
from dynlogits.testing.runner import KIT_VOCAB_SIZE


def _check(name: str) -> Any:
    return next(c for c in CHECKS if c.name == name)


class _NoPrompt(TransformersDriver):
    """An adapter that gives realization no prompt ids (``RequestFacts.prompt_ids`` empty)."""

    def __init__(self) -> None:
        super().__init__(KIT_VOCAB_SIZE)

    def add(self, req_id: str, payload: Any, *, prompt_ids: Sequence[int], output_ids: Sequence[int] = (),
            eos_token_id: int, stop_token_ids: Sequence[int] = (), arrival_time: float | None = None) -> None:
        super().add(req_id, payload, prompt_ids=prompt_ids, output_ids=output_ids, eos_token_id=eos_token_id,
                    stop_token_ids=stop_token_ids, arrival_time=arrival_time)
        self._held[req_id].request = sdk.realize(payload, vocab_size=self.vocab_size, stop_token_id=eos_token_id,
                                   report=self._failures.append)  # realized again, without any fact


class _NoArrival(TransformersDriver):
    """A driver whose ``add`` takes no ``arrival_time``."""

    def __init__(self) -> None:
        super().__init__(KIT_VOCAB_SIZE)

    def add(self, req_id: str, payload: Any, *, prompt_ids: Sequence[int], output_ids: Sequence[int] = (),  # type: ignore[override]
            eos_token_id: int, stop_token_ids: Sequence[int] = ()) -> None:
        super().add(req_id, payload, prompt_ids=prompt_ids, output_ids=output_ids, eos_token_id=eos_token_id,
                    stop_token_ids=stop_token_ids)


def test_the_prompt_bound_check_skips_naming_the_prompt_where_the_adapter_gives_none() -> None:
    outcome = run_check(_check("prompt_bound_vectors_behave_as_documented"), _NoPrompt())
    assert outcome.status == "skipped" and "RequestFacts.prompt_ids" in outcome.detail, outcome
    assert run_check(_check("prompt_bound_vectors_behave_as_documented"), TransformersDriver(KIT_VOCAB_SIZE)).status == "passed"


def test_the_deadline_check_skips_naming_the_arrival_where_the_driver_cannot_stamp_one() -> None:
    outcome = run_check(_check("a_deadline_forces_the_stop_token_once_due"), _NoArrival())
    assert outcome.status == "skipped" and "arrival_time" in outcome.detail, outcome
