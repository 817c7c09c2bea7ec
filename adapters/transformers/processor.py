"""``DynamoLogitsProcessor``: the SDK inside Hugging Face ``generate()``'s logits-processor list.

What ``generate()`` (transformers 5.x) hands it: ``input_ids`` ``[rows, seq]`` (padded prompt then
generated tokens) and ``scores`` ``[rows, vocab]`` (log-probabilities under beam search). Each prompt
is repeated ``max(num_beams, num_return_sequences)`` times, request-major, so ``logits_processor``
realizes one ``GuardedRequest`` per prompt and maps row ``r`` to request ``r // rows_per_request``.
A row's history is ``input_ids[row, prompt_width:]``; positions come from it, so beams, samples and
assisted generation's per-draft calls need nothing special (an assistant's logits must have the
main model's width).

Contract: ``__call__`` returns an edited copy of ``scores`` (callers such as prompt lookup pass the
same tensor again). A failed request has all its rows masked to its stop token from then on and is
reported once; other requests are untouched. A ``ValueError`` means a batch the processor was not
built for (rows, width): a caller's bug. Build a new processor for every ``generate()`` call."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from transformers import LogitsProcessor

from dynlogits.processors.base import SamplingView, Vocabulary
from dynlogits.sdk import FailureReport, GuardedRequest, RequestFacts, apply_rows, drain, histories_from_ids, pick_stop_token, realize

__all__ = ["DynamoLogitsProcessor", "logits_processor", "realize_request"]


def _check_int(name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class DynamoLogitsProcessor(LogitsProcessor):
    """Applies one ``GuardedRequest`` (or nothing) per row of ``scores``; returns an edited copy.

    ``requests[r]`` is row ``r``'s request (``None``: row untouched); one request may own several
    rows. ``prompt_width``: where generation starts, one int (``generate()``) or one per row.
    ``vocab_size``, when given, must be the width of ``scores``. With no request, ``scores`` is
    returned at once."""

    def __init__(
        self,
        requests: Sequence[GuardedRequest | None],
        prompt_width: int | Sequence[int],
        *,
        vocab_size: int | None = None,
    ) -> None:
        self.requests: tuple[GuardedRequest | None, ...] = tuple(requests)
        if isinstance(prompt_width, int):
            widths = [_check_int("prompt_width", prompt_width, 0)] * len(self.requests)
        else:
            widths = [_check_int(f"prompt_width[{i}]", w, 0) for i, w in enumerate(prompt_width)]
            if len(widths) != len(self.requests):
                raise ValueError(f"prompt_width has {len(widths)} entries for {len(self.requests)} rows")
        self.vocab_size = None if vocab_size is None else _check_int("vocab_size", vocab_size, 1)
        self._rows = [r for r, request in enumerate(self.requests) if request is not None]
        self._live: list[GuardedRequest] = [request for request in self.requests if request is not None]
        self._starts = [widths[r] for r in self._rows]

    @property
    def num_rows(self) -> int:
        """How many rows ``input_ids``/``scores`` must have."""
        return len(self.requests)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        drain()  # failures that landed since the last call (see dynlogits.sdk.readback)
        if input_ids.shape[0] != len(self.requests) or scores.shape[0] != len(self.requests):
            raise ValueError(
                f"built for {len(self.requests)} rows, called with input_ids of {input_ids.shape[0]} and scores "
                f"of {scores.shape[0]} rows (did generate() expand prompts differently, e.g. other num_beams or "
                "num_return_sequences?)"
            )
        if self.vocab_size is not None and scores.shape[-1] != self.vocab_size:
            raise ValueError(f"built for logits width {self.vocab_size}, called with width {scores.shape[-1]}")
        if not self._rows:
            return scores
        low = min(self._starts)
        if max(self._starts) > input_ids.shape[1]:
            raise ValueError(f"prompt_width {max(self._starts)} exceeds input_ids width {input_ids.shape[1]}")
        # Only the generated columns travel to the host, not the prompts.
        histories = histories_from_ids(input_ids[:, low:], [s - low for s in self._starts], self._rows)
        processed = scores.clone()  # see the module doc: callers may pass the same tensor again
        apply_rows(processed, self._rows, self._live, histories)
        return processed  # type: ignore[return-value]  # transformers types scores as FloatTensor, a Tensor here

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rows={len(self.requests)}, with_requests={len(self._rows)})"


def realize_request(
    payload: Any,
    *,
    vocab_size: int,
    eos_token_id: int | None,
    stop_token_ids: Iterable[int] = (),
    report: FailureReport | None = None,
    prompt_ids: Sequence[int] | None = None,
    arrival_time: float | None = None,
    tokenizer: Any = None,
    sampling: SamplingView | None = None,
) -> GuardedRequest | None:
    """Fresh processors for one request (``None`` without a payload); never raises for the payload.
    The stop token is ``eos_token_id`` if inside the logits width, else the lowest of
    ``stop_token_ids`` inside it: pass the ids ``generate()`` stops on. Factories are told
    ``prompt_ids`` (the prompt without padding), those stop ids, ``arrival_time``, ``tokenizer``'s
    vocabulary (``None``: none) and ``sampling`` (the generation config's view, ``SamplingView``)."""
    stops = tuple(stop_token_ids)
    stop = pick_stop_token(eos_token_id, stops, vocab_size)
    facts = RequestFacts.of(prompt_ids=prompt_ids, eos_token_id=eos_token_id, stop_token_ids=stops,
                            arrival_time=arrival_time, sampling=sampling,
                            vocabulary=Vocabulary.of_tokenizer(tokenizer))
    return realize(payload, vocab_size=vocab_size, stop_token_id=stop, report=report, facts=facts)


def logits_processor(
    payloads: Sequence[Any],
    *,
    vocab_size: int,
    prompt_width: int,
    rows_per_request: int = 1,
    eos_token_id: int | None,
    stop_token_ids: Iterable[int] = (),
    report: FailureReport | None = None,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    arrival_time: float | None = None,
    tokenizer: Any = None,
    sampling: SamplingView | None = None,
) -> DynamoLogitsProcessor:
    """One ``DynamoLogitsProcessor`` for a ``generate()`` call: ``payloads[k]`` is prompt ``k``'s wire
    payload (``None``: no processors). One fresh ``GuardedRequest`` per prompt owns rows
    ``k*rows_per_request .. (k+1)*rows_per_request - 1`` (``max(num_beams, num_return_sequences)``),
    realized with ``prompt_ids[k]`` (prompt ``k`` without padding), the stop ids, ``arrival_time``,
    ``tokenizer``'s vocabulary and ``sampling`` (``realize_request``).
    No admission here (see ``generate.generate_kwargs``): a payload that does not realize fail-stops
    its request."""
    if isinstance(payloads, (str, bytes, Mapping)) or not isinstance(payloads, Sequence):
        raise TypeError(f"payloads must be a sequence with one payload (or None) per prompt, got {type(payloads).__name__}")
    for k, payload in enumerate(payloads):
        if isinstance(payload, Mapping):
            raise TypeError(
                f"payloads[{k}] is a mapping, not a payload (a list of entries): payloads holds one payload per "
                "prompt; for a single prompt pass [payload]"
            )
    _check_int("vocab_size", vocab_size, 1)
    _check_int("prompt_width", prompt_width, 0)
    _check_int("rows_per_request", rows_per_request, 1)
    if prompt_ids is not None and len(prompt_ids) != len(payloads):
        raise ValueError(f"{len(prompt_ids)} prompts' ids for {len(payloads)} payloads")
    stops = tuple(stop_token_ids)
    requests = [
        realize_request(p, vocab_size=vocab_size, eos_token_id=eos_token_id, stop_token_ids=stops, report=report,
                        prompt_ids=None if prompt_ids is None else prompt_ids[k], arrival_time=arrival_time,
                        tokenizer=tokenizer, sampling=sampling)
        for k, p in enumerate(payloads)
    ]
    rows = [request for request in requests for _ in range(rows_per_request)]
    return DynamoLogitsProcessor(rows, prompt_width, vocab_size=vocab_size)
