"""``multiple_choice``: the output is exactly one of the choices, then EOS."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .base import IndexCache, RealizeContext, first_stop
from .ops import KeepOnly, RowOp, apply_op

__all__ = ["KIND", "MultipleChoiceProcessor", "factory"]

KIND = "multiple_choice"


class MultipleChoiceProcessor:
    """At each step only the next token of every choice the output still matches may be sampled,
    and ``eos`` once the output is a whole choice; once ``eos`` has followed a whole choice, ``eos``
    again (an engine that ignores EOS goes on); an output that matches no choice keeps no id (its
    request fails: no token left). A trie of the choices, walked from the root each step (at most
    the longest choice's length); each node's allowed ids are cached."""

    __slots__ = ("_children", "_ends", "_eos", "_keep")

    def __init__(self, choices: Sequence[Sequence[int]], eos_token_id: int) -> None:
        self._eos = eos_token_id
        self._children: list[dict[int, int]] = [{}]
        self._ends: list[bool] = [False]
        for choice in choices:
            node = 0
            for token in choice:
                child = self._children[node].get(token)
                if child is None:
                    child = self._children[node][token] = len(self._children)
                    self._children.append({})
                    self._ends.append(False)
                node = child
            self._ends[node] = True
        self._keep: dict[tuple[int, ...], IndexCache] = {}

    def allowed(self, input_ids: Sequence[int]) -> tuple[int, ...]:
        """The ids this step allows (empty: the output left every choice)."""
        node = 0
        for token in input_ids:
            child = self._children[node].get(token)
            if child is None:
                return (self._eos,) if self._ends[node] and token == self._eos else ()
            node = child
        return tuple(sorted({*self._children[node], *((self._eos,) if self._ends[node] else ())}))

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        ids = self.allowed(input_ids)
        index = self._keep.get(ids)
        if index is None:  # one per trie node at most
            index = self._keep[ids] = IndexCache(ids)
        return KeepOnly(index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Any, ctx: RealizeContext) -> MultipleChoiceProcessor:
    """A fresh processor for one ``multiple_choice`` entry (EOS: its own, else the request's stop
    token, ``first_stop``)."""
    eos = entry.eos_token_id if entry.eos_token_id is not None else first_stop(ctx)
    if eos is None:
        raise ValueError("multiple_choice needs an eos_token_id: the request has no stop token")
    return MultipleChoiceProcessor(entry.choices, eos)
