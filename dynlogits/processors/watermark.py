"""``watermark``: vLLM 0.32's Gumbel-max watermark, drawn by the request's processor on any engine.

At each sampled step of a request that samples (temperature above vLLM's 1e-5), the processor
takes the row as the entries before it left it (the watermark is the payload's last acting entry:
admission refuses one after it), applies the request's sampling as vLLM defines it (divide by the
temperature, then ``min_p``, then ``top_k`` and ``top_p``, each with vLLM's own formula), and
draws the token by the Gumbel-max trick with vLLM's Philox PRF (``watermark_prf``) over the
``context_width`` output tokens before it: ``argmax(logits / T + G)``, ``G = -log(-log(u))`` for
the PRF's uniform ``u`` of each id. Over keys (or contexts) the draw is distributed as
``softmax`` of the truncated ``logits / T``: the model's distribution, so the text is not distorted.
The row is then forced to the drawn token (as ``ops.force_keeping_masks`` forces: it holds 0.0 and ``-inf``
elsewhere), so whatever the engine's sampler does next it samples that token.

Left to the engine's own sampler (not watermarked, exactly as vLLM's native watermark leaves them):
greedy requests (temperature ``None``, 0 or below 1e-5); a step whose context already occurred in
the request's output within the last ``MAX_HISTORY`` positions (vLLM's ``deduplicate_contexts =
"single_turn"``: its random values would repeat; its detector skips such tokens too); and a step
whose context holds a placeholder (a negative id: vLLM's async scheduling leaves ``-1`` in the
newest history slot until the token is known; it is never taken for a token. vLLM's hosted path
repairs it before the sampler when the adapter is passed in ``logits_processors``, so the context
is real there; elsewhere the step is not watermarked and is sampled as without the entry).

No host synchronization on CUDA: the context is absorbed on the host in Python integers (the
history is a host list), the vocabulary's values are tensor ops with integer operands, and the
draw and the forcing stay on the device. The processor has no ``row_op`` (the drawn token is known
only on the device). Where the request's sampling truncates nothing it has a template
(``watermark_resident.WatermarkTemplate``): a slot engine then draws all its member rows in one
batch, from their host histories (``state``) or from the device's token window, bit for bit this
processor's draw; else (``top_k``, ``top_p`` or ``min_p`` in effect) it is an opaque step, called
on its row (hosted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeAlias

import torch

from dynlogits.specs.builtin.watermark import Watermark, WatermarkSpec

from .base import RealizeContext
from .watermark_prf import context_state, gumbel_noise, uniform_from_state
from .watermark_resident import MAX_HISTORY, SAMPLING_EPS, WatermarkTemplate, resident_template

__all__ = ["KIND", "MAX_HISTORY", "SAMPLING_EPS", "WatermarkProcessor", "factory", "watermark_draw"]

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = WatermarkSpec | Watermark

KIND = "watermark"

#: Histories followed per processor (rows of one request: samples, beams, drafts).
_TRACKED = 8
_NEG_INF = float("-inf")


@lru_cache(maxsize=16)
def _vocabulary(width: int, device: torch.device) -> torch.Tensor:
    """``arange(width)`` on ``device``, built once per width and device (never per step)."""
    return torch.arange(width, dtype=torch.int64, device=device)


def truncate(x: torch.Tensor, *, top_k: int | None, top_p: float | None, min_p: float | None) -> torch.Tensor:
    """``x`` (1-D, float32, already divided by the temperature) after vLLM's ``min_p``, then
    ``top_k`` and ``top_p`` (``MinPLogitsProcessor``, ``apply_top_k_top_p_pytorch``): masked ids
    ``-inf``. Ties at the ``k``-th value are kept; ``top_p`` keeps the smallest suffix of the
    ascending sort whose mass exceeds ``1 - p`` (the largest id always). Device ops only."""
    if min_p is not None and min_p > 0:
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < probs.amax() * min_p, _NEG_INF)
    k = top_k if top_k is not None and 0 < top_k < x.shape[0] else None
    p = top_p if top_p is not None and top_p < 1 else None
    if k is None and p is None:
        return x
    ordered, order = x.sort(descending=False)
    if k is not None:
        ordered = ordered.masked_fill(ordered < ordered[x.shape[0] - k], _NEG_INF)
    if p is not None:
        mass = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        cut = mass <= 1 - p
        cut.narrow(0, x.shape[0] - 1, 1).fill_(False)  # the largest id always stays (no element write: no sync)
        ordered = ordered.masked_fill(cut, _NEG_INF)
    return torch.empty_like(x).scatter_(0, order, ordered)


def watermark_draw(row: torch.Tensor, *, key: int, context: Sequence[int], temperature: float,
                   top_k: int | None = None, top_p: float | None = None, min_p: float | None = None) -> torch.Tensor:
    """The Gumbel-max draw for one row: a 0-d int64 tensor on ``row``'s device (not read back)."""
    # divided by a float32 tensor, as vLLM's sampler divides (a Python scalar would be a multiply by
    # its reciprocal on CUDA): the resident batch's division, bit for bit; a fill, not an upload
    t = torch.full((), temperature, dtype=torch.float32, device=row.device)
    x = truncate(row.to(torch.float32) / t, top_k=top_k, top_p=top_p, min_p=min_p)
    u = uniform_from_state(key, context_state(key, context), _vocabulary(row.shape[0], row.device))
    return torch.argmax(x + gumbel_noise(u))


@dataclass
class _Seen:
    """The contexts one history has shown: ``contexts[p]`` is the context of position ``p`` (the
    ``width`` ids before it, ``-1`` before the output) and ``positions[c]`` where context ``c``
    occurred, ascending, over ``tokens``. Followed forward one entry per new token and rolled back
    one entry per dropped token (a rejected draft, a preempted stretch)."""

    tokens: list[int] = field(default_factory=list)
    contexts: list[tuple[int, ...]] = field(default_factory=list)
    positions: dict[tuple[int, ...], list[int]] = field(default_factory=dict)

    def latest(self, context: tuple[int, ...]) -> int | None:
        """The last position ``context`` occurred at (``None``: never)."""
        found = self.positions.get(context)
        return found[-1] if found else None

    def follow(self, history: Sequence[int], common: int, width: int) -> None:
        """Become ``history``, which shares its first ``common`` tokens with ``tokens``."""
        while len(self.tokens) > common:
            self.tokens.pop()
            at = self.positions[self.contexts.pop()]
            at.pop()
        for position in range(len(self.tokens), len(history)):
            context = _context(history, position, width)
            self.contexts.append(context)
            self.positions.setdefault(context, []).append(position)
        self.tokens.extend(history[len(self.tokens):])


def _common(tokens: list[int], history: Sequence[int]) -> int:
    """The length of the longest common prefix of ``tokens`` and ``history`` (slice compares: C speed)."""
    n = min(len(tokens), len(history))
    if tokens[:n] == list(history[:n]):
        return n
    low, high = 0, n  # tokens[:low] == history[:low]; tokens[:high] != history[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if tokens[:mid] == list(history[:mid]):
            low = mid
        else:
            high = mid
    return low


def _context(history: Sequence[int], position: int, width: int) -> tuple[int, ...]:
    """The ``width`` ids before ``position`` (``-1`` before the output), vLLM's convention."""
    start = position - width
    if start >= 0:
        return tuple(history[start:position])
    return (-1,) * (-start) + tuple(history[0:position])


class WatermarkProcessor:
    """One request's watermark (see the module doc). ``key`` is the secret: never in a repr or a
    message. Several rows may share it: every step is derived from the history it is given."""

    __slots__ = ("_key", "width", "temperature", "top_k", "top_p", "min_p", "_seen", "template")

    #: set only where the request's sampling truncates nothing (a slot engine may then run it resident)
    template: WatermarkTemplate

    def __init__(self, key: int, width: int, *, temperature: float | None, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None) -> None:
        self._key = key
        self.width = width
        self.temperature = temperature
        self.top_k, self.top_p, self.min_p = top_k, top_p, min_p
        self._seen: list[_Seen] = []
        template = resident_template(key, width, temperature, top_k, top_p, min_p)
        if template is not None:
            self.template = template

    def __repr__(self) -> str:
        return f"WatermarkProcessor(context_width={self.width})"

    @property
    def samples(self) -> bool:
        """Whether the request samples (greedy requests are left as they are)."""
        return self.temperature is not None and self.temperature >= SAMPLING_EPS

    def context(self, history: Sequence[int]) -> tuple[int, ...] | None:
        """This step's context, or ``None`` where the step is left to the engine's sampler: the
        context holds a placeholder, or occurred before within ``MAX_HISTORY`` positions."""
        n = len(history)
        context = _context(history, n, self.width)
        if any(t < 0 for t in history[max(0, n - self.width):n]):
            return None
        seen = self._follow(history)
        if seen is None:
            return None
        latest = seen.latest(context)
        if latest is not None and latest >= n - MAX_HISTORY:
            return None
        return context

    def state(self, history: Sequence[int]) -> tuple[int, int, int, int] | None:
        """This step's PRF state (``watermark_prf.context_state`` of its context), or ``None`` where
        the step is left to the engine's sampler (greedy, a placeholder, a repeated context): the
        resident group's host decision."""
        if not self.samples:
            return None
        context = self.context(history)
        return None if context is None else context_state(self._key, context)

    def _follow(self, history: Sequence[int]) -> _Seen | None:
        """The contexts of ``history``'s positions (``None``: it holds a placeholder): the tracked
        history sharing the longest prefix with it, rolled back to that prefix and followed to its
        end, or a new one where none shares a token (up to ``_TRACKED`` of them: the samples, beams
        and draft rows one instance serves)."""
        if len(history) and min(history) < 0:
            return None
        best: _Seen | None = None
        common = -1
        for seen in self._seen:
            shared = _common(seen.tokens, history)
            if shared > common:
                best, common = seen, shared
        if best is None or (common == 0 and best.tokens and len(self._seen) < _TRACKED):
            best, common = _Seen(), 0
            self._seen.append(best)
        else:
            self._seen.remove(best)
            self._seen.append(best)
        best.follow(history, common, self.width)
        return best

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        if not self.samples:
            return
        context = self.context(input_ids)
        if context is None:
            return
        assert self.temperature is not None
        choice = watermark_draw(logits, key=self._key, context=context, temperature=self.temperature,
                                top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)
        _force_at(logits, choice)


def _force_at(row: torch.Tensor, choice: torch.Tensor) -> None:
    """``ops.force_keeping_masks`` at a token known only on the device (a 0-d index tensor): the
    row holds 0.0 there (``-inf`` if it was ``-inf``) and ``-inf`` elsewhere. No synchronization."""
    index = choice.view(1)
    kept = row.gather(0, index)
    row.fill_(_NEG_INF)
    row.scatter_(0, index, kept.masked_fill_(~torch.isneginf(kept), 0.0))


def factory(entry: Entry, ctx: RealizeContext) -> WatermarkProcessor:
    """A fresh processor for one ``watermark`` entry, with the request's sampling (``ctx.sampling``)."""
    s = ctx.sampling
    return WatermarkProcessor(int(entry.key), int(entry.context_width), temperature=s.temperature,
                              top_k=s.top_k, top_p=s.top_p, min_p=s.min_p)
