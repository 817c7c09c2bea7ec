"""The processor protocol every engine adapter drives, and the context processors are built with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from .sampling import SamplingView
from .uploads import to_device
from .vocabulary import Vocabulary

__all__ = ["BaseLogitsProcessor", "IndexCache", "RealizeContext", "SamplingView", "Vocabulary", "first_stop"]


@runtime_checkable
class BaseLogitsProcessor(Protocol):
    """One request's processor.

    ``input_ids`` are the tokens this request has generated so far (not the
    prompt; engines may pass a live list). ``logits`` is the request's 1-D row
    ``[vocab_size]``, modified in place. Implementations derive their position
    from ``input_ids`` (never from a private step counter), so calling twice with
    the same history has the same effect, and a preempted request resumes.
    """

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None: ...


@dataclass(frozen=True)
class RealizeContext:
    """What a factory knows when it builds one request's processor: ``vocab_size`` is the logits
    width; the request's ``prompt_ids`` (after the chat template), its ``stop_token_ids`` (the
    first is the one a failed or finished request is ended with), its ``arrival_time`` (``time.time()``
    when it reached the deployment, else when its engine realized it) and the ``reasoning``
    delimiters in force (``(start ids, end ids)``, or ``None``). An engine that cannot say leaves
    ``prompt_ids`` empty (``docs/engines.md`` says which).

    Also: ``request_id``, for logs (the engine's id of the request where it gives one, else one
    this process made up; never parse it); ``sampling``, the request's sampling parameters
    (``SamplingView``: a field is ``None`` where the engine does not say); and ``vocabulary``, the
    tokenizer's text of each id (``None`` where the engine gives no tokenizer), loaded only when a
    factory reads it, once per engine."""

    vocab_size: int
    prompt_ids: tuple[int, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    arrival_time: float | None = None
    reasoning: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    request_id: str = ""
    sampling: SamplingView = SamplingView()
    #: where ``vocabulary`` comes from (``None``: no tokenizer); read ``vocabulary``, not this
    tokenizer_vocabulary: Vocabulary | None = None

    @property
    def vocabulary(self) -> tuple[str, ...] | None:
        """Each token id's text, index = id (``Vocabulary.strings``: loaded on first use, then shared by
        every request of the engine; ids past its length up to ``vocab_size`` have none); ``None``
        where the engine gives no tokenizer. Raises what loading the tokenizer raises."""
        return None if self.tokenizer_vocabulary is None else self.tokenizer_vocabulary.strings()


def first_stop(ctx: RealizeContext) -> int | None:
    """The request's stop token: its first stop id inside the logits width (``None``: none)."""
    return next((t for t in ctx.stop_token_ids if 0 <= t < ctx.vocab_size), None)


class IndexCache:
    """Small index (and value) tensors built once per (device, dtype), never per step."""

    __slots__ = ("_ids", "_values", "_cache", "low", "high")

    def __init__(self, ids: Sequence[int], values: Sequence[float] | None = None) -> None:
        self._ids = list(ids)
        #: The smallest and largest id (``None`` when empty): bounds checks cost O(1) per step.
        self.low: int | None = min(self._ids) if self._ids else None
        self.high: int | None = max(self._ids) if self._ids else None
        self._values = None if values is None else list(values)
        self._cache: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor | None]] = {}

    def get(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = (like.device, like.dtype)
        hit = self._cache.get(key)
        if hit is None:
            idx = to_device(self._ids, torch.long, like.device)
            vals = None if self._values is None else to_device(self._values, like.dtype, like.device)
            hit = self._cache[key] = (idx, vals)
        return hit
