"""The conformance kit's driver for the transformers adapter (``dynlogits.testing.driver``).

The driver plays ``generate()``'s part (no model forward): it keeps each admitted request's prompt,
generated tokens and ``GuardedRequest`` (realized once, at ``add``), lays each step's rows out as
``generate()`` does (left padding, prompt, generated tokens) with one ``prompt_width`` per row (kit
rows may differ in length), and calls a ``DynamoLogitsProcessor`` inside a real
``transformers.LogitsProcessorList``. ``tests/adapters/transformers`` runs the real ``generate()``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
import transformers
from transformers import LogitsProcessorList

from dynlogits import sdk
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.policy.text import TextTokenizer
from dynlogits.sdk import GuardedRequest
from dynlogits.specs import LogitsProcessorSpec

from .generate import payload_for
from .generate import prompt_ids as unpadded_prompts
from .processor import DynamoLogitsProcessor, realize_request

if TYPE_CHECKING:
    from dynlogits.testing.driver import AdapterDriver

__all__ = ["TransformersDriver", "drivers"]


@dataclass
class _Held:
    prompt_ids: list[int]
    request: GuardedRequest | None
    output_ids: list[int] = field(default_factory=list)


class TransformersDriver:
    """Drives ``DynamoLogitsProcessor`` as ``generate()`` does (see the module docstring)."""

    name = "transformers"
    releases_on_finish = True

    def __init__(self, vocab_size: int, *, tokenizer: TextTokenizer | None = None, pad_token_id: int = 0) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id
        self.exercised = (
            f"transformers {transformers.__version__}: the real LogitsProcessor/LogitsProcessorList call "
            "convention; rows laid out as generate() lays them out; model forward not run by the kit "
            "(the real generate() is tested in tests/transformers)"
        )
        self._held: dict[str, _Held] = {}
        self._failures: list[str] = []

    def activate(self, spec: LogitsProcessorSpec | None, role: DisaggregationMode) -> Any | None:
        return payload_for(spec, role, self.tokenizer)

    def admit(self, payload: Any) -> None:
        """As ``generate_kwargs`` admits: every rule, the logits-width bound included."""
        sdk.validate(payload, vocab_size=self.vocab_size)

    def add(self, req_id: str, payload: Any, *, prompt_ids: Sequence[int], output_ids: Sequence[int] = (),
            eos_token_id: int, stop_token_ids: Sequence[int] = (), arrival_time: float | None = None) -> None:
        padded = [self.pad_token_id, *prompt_ids]  # left-padded, as generate_kwargs reads a batch's prompts
        batch = {"input_ids": torch.tensor([padded]), "attention_mask": torch.tensor([[0] + [1] * len(prompt_ids)])}
        request = realize_request(payload, vocab_size=self.vocab_size, eos_token_id=eos_token_id,
                                  stop_token_ids=(eos_token_id, *stop_token_ids), report=self._failures.append,
                                  prompt_ids=unpadded_prompts(batch)[0], arrival_time=arrival_time)
        self._held[req_id] = _Held(list(prompt_ids), request, list(output_ids))

    def step(self, batch: Sequence[str], logits: torch.Tensor) -> torch.Tensor:
        held = [self._held[req_id] for req_id in batch]
        width = max((len(h.prompt_ids) + len(h.output_ids) for h in held), default=0)
        rows = [[self.pad_token_id] * (width - len(h.prompt_ids) - len(h.output_ids)) + h.prompt_ids + h.output_ids
                for h in held]
        input_ids = torch.tensor(rows, dtype=torch.long).reshape(len(held), width)
        starts = [width - len(h.output_ids) for h in held]
        processors = LogitsProcessorList(
            [DynamoLogitsProcessor([h.request for h in held], starts, vocab_size=self.vocab_size)]
        )
        return processors(cast(torch.LongTensor, input_ids), cast(torch.FloatTensor, logits))

    def commit(self, req_id: str, token_id: int) -> None:
        self._held[req_id].output_ids.append(int(token_id))

    def remove(self, req_id: str) -> None:
        self._held.pop(req_id, None)

    def held_requests(self) -> int:
        return len(self._held)

    def failures(self) -> list[str]:
        return list(self._failures)


def drivers(vocab_size: int) -> list[AdapterDriver]:
    """The kit's entry point: one driver, ``"transformers"``."""
    return [TransformersDriver(vocab_size)]
