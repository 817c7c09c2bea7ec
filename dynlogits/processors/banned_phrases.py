"""``banned_phrases``: a phrase's last token is masked whenever the output ends with the rest of it:
the processor, its template and its resident group.

Per step and row: a walk back from the output's last token over the phrases' prefixes read
backwards (a trie), at most one lookup per token of the longest prefix, never a scan of the
history or of every phrase; a row whose last token ends no prefix costs one lookup. On the
resident path (vLLM's V1 runner: the host knows the histories) the group's host work is that
lookup per row, its device work a masked write of the one-token phrases (indices uploaded once per
layout) and, on steps that find ids, an upload and a masked write of those. Where the adapter
gives no host histories (Model Runner V2) a request with phrases of several tokens stays on the
hosted path; one with one-token phrases only is a ``banned_tokens`` and resident everywhere.

A processor's tables (the one-token phrases, the trie, the template) depend on the phrases alone
and never change: they are built once per phrase set and shared (``TABLES_KEPT``), so a ban list
repeated across requests costs a lookup at realization, not a build."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, NamedTuple

import torch

from .banned_tokens import BannedTokensTemplate
from .base import IndexCache, RealizeContext
from .ops import MaskIds, RowOp, apply_op
from .slots import NEG_INF, Group, ListedRows, StepInputs, Template
from .uploads import StepUpload

__all__ = ["KIND", "TABLES_KEPT", "BannedPhrasesGroup", "BannedPhrasesProcessor", "BannedPhrasesTemplate", "factory"]

KIND = "banned_phrases"

#: Distinct sets of ids one request masks, whose index tensors are kept (beyond it, rebuilt).
KEPT_SETS = 64
#: Phrase sets whose tables are kept, least recently used dropped first (at the default
#: ``max_phrases`` of 256, at most 16384 phrases).
TABLES_KEPT = 64


class _Tables(NamedTuple):
    """What a phrase set's processors share, read only: its one-token phrases, its prefixes as a
    trie read backwards from their last token (token -> [the last tokens the prefix ending here
    bans, the tokens that may come before it]) and its template."""

    always: tuple[int, ...]
    tails: dict[int, list]
    template: Template


def _build(phrases: tuple[tuple[int, ...], ...]) -> _Tables:
    always = tuple(sorted({p[0] for p in phrases if len(p) == 1}))
    after: dict[tuple[int, ...], set[int]] = {}
    for phrase in phrases:
        if len(phrase) > 1:
            after.setdefault(tuple(phrase[:-1]), set()).add(phrase[-1])
    tails: dict[int, list] = {}
    for prefix, last in after.items():
        level, node = tails, None
        for token in reversed(prefix):
            node = level.setdefault(token, [(), {}])
            level = node[1]
        assert node is not None
        node[0] = tuple(sorted(last))
    return _Tables(always, tails, BannedPhrasesTemplate(always) if after else BannedTokensTemplate(always))


#: ``_Tables`` per phrase set (validated entries hold tuples of tuples: hashable as they are)
_TABLES = lru_cache(maxsize=TABLES_KEPT)(_build)


class BannedPhrasesProcessor:
    """Every step, the last token of each phrase whose other tokens end the output is masked; a
    one-token phrase always."""

    __slots__ = ("_always", "_tails", "_sets", "template")

    def __init__(self, phrases: Sequence[Sequence[int]]) -> None:
        try:
            tables = _TABLES(phrases)
        except TypeError:  # lists: made hashable
            tables = _TABLES(tuple(tuple(p) for p in phrases))
        self._always, self._tails, self.template = tables
        self._sets: dict[tuple[int, ...], IndexCache] = {}

    def after(self, input_ids: Sequence[int]) -> tuple[int, ...]:
        """The ids this step masks beyond the one-token phrases (repeats possible, unsorted): a walk
        back from the last token, at most as many steps as the longest prefix."""
        i = len(input_ids) - 1
        if i < 0 or (node := self._tails.get(input_ids[i])) is None:
            return ()
        found, level = node[0], node[1]
        while level and i > 0:
            i -= 1
            node = level.get(input_ids[i])
            if node is None:
                break
            found += node[0]
            level = node[1]
        return found

    def banned(self, input_ids: Sequence[int]) -> tuple[int, ...]:
        """The ids this step masks (sorted, no repeats)."""
        extra = self.after(input_ids)
        return tuple(sorted({*self._always, *extra})) if extra else self._always

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        ids = self.banned(input_ids)
        if not ids:
            return None
        index = self._sets.get(ids)
        if index is None:
            if len(self._sets) >= KEPT_SETS:
                self._sets.clear()
            index = self._sets[ids] = IndexCache(ids)
        return MaskIds(index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


class BannedPhrasesGroup(Group):
    """``banned_phrases`` with phrases of several tokens: decided on the host from each row's own
    processor (``BannedPhrasesProcessor.after``, needs the host histories). Every step one
    ``index_fill_`` of the rows' one-token phrases (indices uploaded once per batch change); a step
    that finds ids adds one upload and one ``index_fill_``. Masks only: never leaves a row empty by
    itself."""

    decided = True
    needs_host_histories = True

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self._always: dict[int, tuple[int, ...]] = {}  # slot -> its one-token phrases
        self._layout = StepUpload(torch.long, device)  # the one-token phrases' flat indices, per layout

    def _write(self, slot: int, template: BannedPhrasesTemplate) -> None:
        self._always[slot] = template.always

    def prepare(self, rows: ListedRows, stride: int) -> None:
        """Per layout: each row's start in the flat logits (host) and its one-token phrases' flat
        indices, uploaded once (``None``: no row has one)."""
        super().prepare(rows, stride)
        base = (rows.rows * stride).tolist()
        self._cache["base"] = base
        fixed = [b + t for b, slot in zip(base, rows.slots.tolist()) for t in self._always[slot]]
        if fixed:
            self._layout.buffer(len(fixed))[:] = fixed
        self._cache["fixed"] = self._layout.upload(len(fixed), keep=True) if fixed else None

    def host_decisions(self, n: int) -> list[tuple[int, ...]]:
        return [()] * n

    def host_decision(self, processor: Any, history: Sequence[int]) -> tuple[int, ...]:
        """The ids the row masks this step beyond its one-token phrases."""
        return processor.after(history)  # type: ignore[no-any-return]

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, decisions: list[tuple[int, ...]],
                             upload: StepUpload) -> None:
        fixed: torch.Tensor | None = self._cache["fixed"]
        if fixed is not None:
            step.flat.index_fill_(0, fixed, NEG_INF)
        found = [b + t for b, ids in zip(self._cache["base"], decisions) if ids for t in ids]
        if found:
            upload.buffer(len(found))[:] = found
            step.flat.index_fill_(0, upload.upload(len(found)), NEG_INF)
        return None


@dataclass(frozen=True, slots=True)
class BannedPhrasesTemplate(Template):
    """Every step: ``row[always] = -inf``, and the last tokens of the phrases whose other tokens end
    the output (decided per row on the host)."""

    always: tuple[int, ...]
    group: ClassVar[type[BannedPhrasesGroup]] = BannedPhrasesGroup
    reads_tokens: ClassVar[bool] = True


def factory(entry: Any, ctx: RealizeContext) -> BannedPhrasesProcessor:
    """A fresh processor for one ``banned_phrases`` entry (resolved: ``phrases`` only)."""
    return BannedPhrasesProcessor(entry.phrases)
