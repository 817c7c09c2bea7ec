"""``forced_sequence``: force the configured tokens in order, then EOS: its processor, template,
resident group and the group's host plan."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, ClassVar, TypeAlias

import numpy as np
import torch

from dynlogits.kernels import thinking_force
from dynlogits.specs.builtin.forced_sequence import ForcedSequence, ForcedTokenSequenceSpec

from .base import RealizeContext
from .forced_settle import fused_ready, run_pick_settle, run_settle
from .modes import PlannedGroup
from .ops import ForceToken, RowOp, apply_op, fill_rows
from .slots import (
    NEG_INF,
    CountedSettle,
    Dead,
    GatheredRows,
    ListedRows,
    StepInputs,
    Template,
    force_gathered,
    force_listed,
    force_listed_at,
    listed_positions,
)
from .uploads import to_device

__all__ = ['KIND', 'ForcedSequenceGroup', 'ForcedSequenceProcessor', 'ForcedSequenceTemplate', 'factory']

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = ForcedTokenSequenceSpec | ForcedSequence

KIND = "forced_sequence"

#: logits dtypes numpy can view (``ForcedSequenceGroup._settled_on_host``; not bfloat16)
_NUMPY_FLOATS = frozenset({torch.float32, torch.float16, torch.float64})

def _member_counts(rows: list[int]) -> Callable[[list[int]], tuple[int, ...]]:
    """The counts of ``rows`` (``2+`` rows, or one) out of a layout's row-indexed counts, as a tuple."""
    if len(rows) == 1:
        row = rows[0]
        return lambda counts: (counts[row],)
    return itemgetter(*rows)


class ForcedSequenceGroup(PlannedGroup):
    """``forced_sequence``: a row that has generated ``g`` tokens forces ``sequence[g]``, EOS once
    the sequence is spent, ``sequence[0]`` while still in prefill (``g < 0``). A row left with no
    token reports ``min(g, length)``: past its end, the position where its EOS was first due."""

    restrictive = True
    positional = True

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.sequence = self.table(torch.long)  # the tokens, then EOS (the padding repeats EOS)
        self.length = self.table(torch.long)

    def _write(self, slot: int, template: ForcedSequenceTemplate) -> None:
        self.sequence.set(slot, (*template.tokens, template.eos))
        self.length.set(slot, [len(template.tokens)])

    #: per member row: the forced flat index, the sentinel slot (``_settle``'s "no flag"), the position
    planned_per_row = 3

    def prepare(self, rows: ListedRows, stride: int) -> None:
        super().prepare(rows, stride)
        n = len(rows.rows)
        # for ``plan``: each row's sequence as flat logits indices, and its length (host copies)
        self._cache["host_flat"] = rows.rows[:, None] * stride + self.sequence.host_np[rows.slots]
        self._cache["host_length"] = self.length.host_np[rows.slots, 0]
        self._cache["host_rows"] = np.arange(n)
        # the member rows' counts out of the layout's (``plan``'s check of a plan laid out ahead)
        self._cache["member_counts"] = None if rows.identity else _member_counts(rows.rows.tolist())
        if n <= self._FEW_ROWS:  # ``plan`` in Python: the same tables as lists
            self._cache["few"] = list(zip(rows.rows.tolist(), self._cache["host_length"].tolist(),
                                          self._cache["host_flat"].tolist()))
        if self._settles(rows):
            self._prepare_settle(rows)
            if rows.rows_dev.device.type == "cpu":  # logits in host memory: ``_settled_on_host``
                self._cache["none_dead"] = torch.zeros(n, dtype=torch.bool)
        else:
            self._cache["sequence"] = self.sequence.dev[rows.slots_dev]
            self._cache["length"] = self.length.dev[rows.slots_dev, 0]
            self._cache["zero"] = torch.zeros_like(self._cache["length"])

    @staticmethod
    def _settles(rows: ListedRows) -> bool:
        """No later group can mask these rows (``_settle``)."""
        return rows.last

    def reads_generated(self, rows: ListedRows) -> bool:
        return not self._settles(rows)  # a settle reads ``pos`` directly (``_pick``)

    def _prepare_settle(self, rows: ListedRows) -> None:
        """The tables ``_pick`` reads, built on the host (from ``prepare``'s ``host_flat``) and
        uploaded in one copy, the stop plane then written on the device (one op).
        Each row's position is turned into a column ``c`` by counting the row's bounds at or below
        it (``searchsorted``): bounds ``offset + [0, 1, .., length]`` give ``c = clamp(generated +
        1, 0, length + 1)``, ``c = 0`` for a row still in prefill (its sample is discarded). Per row
        and column, six planes, a live row's three then a masked row's: the forced token's flat
        index (column ``c`` forces ``sequence[max(c - 1, 0)]``, EOS once the sequence is spent), the
        flag slot of a row that keeps it (the sentinel: no flag) and the position (``c - 1``: the
        generated count, at most the sequence's length); then what replaces them where the token is
        masked: its stop token's index, its own slot (the sentinel in prefill) and the same position
        (what its flag records). ``at``: the bounds without the offset, ``_NEVER`` past a row's
        length."""
        flat = self._cache["host_flat"]
        n, width = flat.shape  # the longest sequence + its EOS
        assert rows.base is not None and rows.stop_index is not None
        table_size, at_size = 6 * n * (width + 1), n * width
        host = np.empty(table_size + at_size, dtype=np.int64)
        table = host[:table_size].reshape(6, n, width + 1)
        table[0, :, 1:] = flat
        table[0, :, 0] = flat[:, 0]
        table[1] = self._sentinel
        table[2] = table[5] = np.arange(-1, width)
        table[3] = 0  # the stop plane: written on the device below
        table[4] = rows.slots[:, None]
        table[4, :, 0] = self._sentinel
        at = host[table_size:].reshape(n, width)
        at[:] = np.arange(width)
        at[at > self._cache["host_length"][:, None]] = self._NEVER  # bounds past a row's length
        values = to_device(host, torch.long, rows.rows_dev.device)
        dev_table = values[:table_size].view(6, n, width + 1)
        dev_table[3].copy_(rows.stop_index[:, None].expand(n, width + 1))
        self._cache["table"] = dev_table
        self._cache["at"] = values[table_size:].view(n, width)
        self._cache["bounds"] = None
        # the planned step's stand-in for the third and fourth planes: the stop index, the row's slot
        self._cache["if_dead"] = dev_table[3:5, :, 1]

    @property
    def _sentinel(self) -> int:
        """The tables' last slot, never assigned: a flag written there is no flag."""
        return self.member.num_slots - 1

    _NEVER = 2**31 - 1  # a bound no position reaches (fits int32 positions too)

    def _pick(self, step: StepInputs, rows: ListedRows) -> torch.Tensor:
        """``[6, n]``: this step's column of every plane of ``_prepare_settle``'s table, from
        ``pos`` (against ``pos_offset``) or ``generated``: two ops, whatever the runner gives."""
        n = len(rows.rows)
        values, bounds = self._values_bounds(step, rows)
        if not rows.identity:
            values = values[rows.rows_dev]
        column = torch.searchsorted(bounds, values.view(n, 1), right=True)
        return self._cache["table"].gather(2, column.view(1, n, 1).expand(6, n, 1)).view(6, n)

    def _values_bounds(self, step: StepInputs, rows: ListedRows) -> tuple[torch.Tensor, torch.Tensor]:
        """The runner's positions (``pos``, else ``generated``; batch rows) and each member row's
        bounds in their dtype (``_prepare_settle``; kept while ``pos_offset`` stays the same tensor)."""
        values, offset = (step.pos, step.pos_offset) if step.pos is not None else (step.generated, None)
        assert values is not None
        bounds = self._cache["bounds"]
        if bounds is None or bounds[0] is not offset or bounds[1].dtype != values.dtype:
            at = self._cache["at"]
            if offset is not None:  # ``_NEVER`` stays a bound no position reaches
                at = (at + (offset if rows.identity else offset[rows.rows_dev])[:, None]).clamp_(max=self._NEVER)
            bounds = self._cache["bounds"] = (offset, at.to(values.dtype))
        return values, bounds[1]

    def _pick_settle_fused(self, step: StepInputs, rows: ListedRows) -> Dead:
        """``_pick`` and ``_settle`` as the fused op ``forced_pick_settle_`` (two launches on CUDA),
        then the flags' copy back: the same pick, writes and report."""
        values, bounds = self._values_bounds(step, rows)
        n = len(rows.rows)
        pick = torch.empty((6, n), dtype=torch.long, device=values.device)
        chosen, _, flagged = self._chosen(pick[:3], False)
        dead = torch.empty(n, dtype=torch.bool, device=values.device)
        args = (step.logits, rows.rows_dev, self._cache["table"], bounds, values, rows.identity, rows.can_stop,
                pick, chosen, dead)
        run_pick_settle(step.flat.device, args)  # on CUDA a new variant compiles off the step
        if step.flag_rows is not None:
            step.flag_rows(flagged, None)
        return Dead(rows.rows_dev, rows.slots_dev, None, pick[2], rows.stop_index, rows.can_stop,
                    settled=dead, flagged=step.flag_rows is not None)

    @staticmethod
    def _tokens(generated: torch.Tensor, sequence: torch.Tensor, length: torch.Tensor,
                zero: torch.Tensor | None = None) -> torch.Tensor:
        """``sequence[i, clamp(generated[i], 0, length[i])]`` (a row still in prefill counts
        negative: the runner discards what is sampled there)."""
        column = torch.clamp(generated, zero, length) if zero is not None else generated.clamp(min=0).minimum(length)
        return sequence.gather(1, column[:, None]).view(-1)

    #: up to this many rows ``plan`` runs in Python (cheaper than numpy's fixed cost per call)
    _FEW_ROWS = 8

    def plan(self, rows: ListedRows, counts: list[int], generated: np.ndarray, out: np.ndarray) -> None:
        """``[forced flat index | sentinel slot | position]`` per member row (the position capped at
        the sequence's length, as everywhere in this group): on the host, what ``_pick`` would
        otherwise derive on the device each step. Laid out ahead for the steps where every row
        generates one token (``_plan_ahead``): such a step is one compare of the member rows' counts
        and one copy."""
        ahead = self._cache.get("ahead")
        member_counts = self._cache["member_counts"]
        if ahead and (counts if member_counts is None else member_counts(counts)) == ahead[-1][0]:
            _, values, positions = ahead.pop()
            np.copyto(out, values)
            self._cache["host_positions"] = positions
            return
        n = len(rows.rows)
        self._cache["host_positions"] = out[2 * n :]  # what ``_settle`` reports a flag at
        few = self._cache.get("few")
        if few is not None:
            at = [min(counts[row], length) for row, length, _ in few]
            out[:] = [flat[p] for (_, _, flat), p in zip(few, at)] + [self._sentinel] * n + at
        else:
            positions = out[2 * n :]
            member = generated if rows.identity else np.take(generated, rows.rows, out=positions)
            np.minimum(member, self._cache["host_length"], out=positions)  # host counts are never negative
            out[:n] = self._cache["host_flat"][self._cache["host_rows"], positions]
            out[n : 2 * n] = self._sentinel
        self._plan_ahead(rows, counts, generated)

    #: the most steps ``_plan_ahead`` lays out at once
    _AHEAD = 32

    def _plan_ahead(self, rows: ListedRows, counts: list[int], generated: np.ndarray) -> None:
        """Lay out ``plan``'s values for the next steps, each valid while every member row has
        generated one more token than at the step before (their counts then grow by one per step;
        the other rows of the layout, and a batch change that keeps the group's rows and slots, do
        not matter): as many steps as last time laid out and used, twice over (up to ``_AHEAD``),
        one step after a step that broke the pattern (chunked prefill, drafts)."""
        ahead = self._cache.get("ahead")
        horizon = min(2 * self._cache["horizon"] if ahead is not None and not ahead else 1, self._AHEAD)
        self._cache["horizon"] = horizon
        if horizon <= 0:
            return
        n = len(rows.rows)
        member = generated if rows.identity else generated[rows.rows]
        steps = np.arange(1, horizon + 1)[:, None]
        values = np.empty((horizon, 3 * n), dtype=np.int64)
        positions = np.minimum(member[None, :] + steps, self._cache["host_length"][None, :], out=values[:, 2 * n :])
        values[:, :n] = self._cache["host_flat"][self._cache["host_rows"][None, :], positions]
        values[:, n : 2 * n] = self._sentinel
        # the member rows' counts at each of those steps, as ``plan`` takes them
        expected: list[Any] = (member[None, :] + steps).tolist()
        if not rows.identity:
            expected = [tuple(e) for e in expected]
        self._cache["ahead"] = [(expected[t], values[t], values[t, 2 * n :]) for t in range(horizon - 1, -1, -1)]

    def _planned_views(self, planned: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``rows.planned``'s parts: ``[index, sentinel]`` (``_settle``'s ``picked``), the forced flat
        indices, the positions; taken once, as ``planned`` is one tensor while the layout stays."""
        views = self._cache.get("planned")
        if views is None or views[0] is not planned:
            index, _, positions = planned.unbind(0)
            views = self._cache["planned"] = (planned, planned[:2], index, positions)
        return views[1:]

    def apply_listed(self, step: StepInputs, rows: ListedRows) -> Dead:
        assert rows.stop_index is not None and rows.base is not None
        planned = None if rows.planned is None else self._planned_views(rows.planned)
        if self._settles(rows):
            if planned is not None:
                picked, index, positions = planned
                if_dead, host_positions = self._cache["if_dead"], self._cache["host_positions"]
            elif fused_ready(step.flat.device):
                return self._pick_settle_fused(step, rows)
            else:
                pick = self._pick(step, rows)
                picked, index, positions, if_dead, host_positions = pick[:3], pick[0], pick[2], pick[3:], None
            if "none_dead" in self._cache and step.flat.dtype in _NUMPY_FLOATS:
                settled = self._settled_on_host(step, rows, index, positions)
                if settled is not None:
                    return settled
            return self._settle(step, rows, picked, index, if_dead, positions, host_positions)
        if planned is not None:
            _, index, positions = planned
            witness = force_listed_at(step, index, rows)
        else:
            assert step.generated is not None
            generated = listed_positions(step, rows.rows_dev, rows.identity)
            assert generated is not None
            tokens = self._tokens(generated, self._cache["sequence"], self._cache["length"], self._cache["zero"])
            witness = force_listed(step, tokens, rows)
            positions = generated.minimum(self._cache["length"])
        return Dead(rows.rows_dev, rows.slots_dev, witness, positions, rows.stop_index, rows.can_stop)

    def _settle(self, step: StepInputs, rows: ListedRows, picked: torch.Tensor, index: torch.Tensor,
                if_dead: torch.Tensor, positions: torch.Tensor, host_positions: np.ndarray | None) -> Dead:
        """Settle the rows here (``_settles``), in as few launches as the step allows: each row gets
        its forced token, or its stop token where the forced one is masked (a row without a stop
        token is left with no token, as ``Failures.record_dead`` would); when ``step.flag_rows`` is
        given, the masked rows are reported through it from the same pick, with no write of flags.
        ``picked``: the forced flat indices and the no-flag slots, ``[2, n]``, then, where the host
        does not know them (``host_positions`` ``None``), the positions (``[3, n]``; ``index`` is
        its first row); ``if_dead``: what replaces them on a masked row; ``positions``: the rows'
        positions on the device."""
        if fused_ready(step.flat.device):
            return self._settle_fused(step, rows, picked, if_dead, positions, host_positions)
        # everything but the two writes runs before the rows are masked: on the CPU the memset
        # evicts the caches, and each small op after it costs several times more
        kept = step.flat.index_select(0, index)
        dead = torch.isneginf(kept)
        chosen, target, flagged = self._chosen(picked, host_positions is not None)
        value = None
        if rows.can_stop is None:
            torch.where(dead, if_dead, picked, out=chosen)
        else:  # a masked row without a stop token is only flagged: -inf goes back onto its forced id
            stops, dead_value, live_value = self._without_stops(rows, step.flat.dtype, picked.shape[0])
            torch.where(dead & stops, if_dead, picked, out=chosen)
            value = torch.where(dead, dead_value, live_value)
        if step.flag_rows is not None:  # each row's slot (the sentinel: not flagged), with its position
            step.flag_rows(flagged, host_positions)
        fill_rows(step.logits, rows.runs, rows.rows_dev)
        if value is None:
            step.flat.index_fill_(0, target, 0.0)
        else:
            step.flat.index_copy_(0, target, value)
        return Dead(rows.rows_dev, rows.slots_dev, None, positions, rows.stop_index, rows.can_stop,
                    settled=dead, flagged=step.flag_rows is not None)

    def _settle_fused(self, step: StepInputs, rows: ListedRows, picked: torch.Tensor, if_dead: torch.Tensor,
                      positions: torch.Tensor, host_positions: np.ndarray | None) -> Dead:
        """``_settle`` as the fused op ``forced_settle_`` (two launches on CUDA), then the flags'
        copy back: the same writes, pick and report."""
        chosen, _, flagged = self._chosen(picked, host_positions is not None)
        dead = torch.empty(picked.shape[1], dtype=torch.bool, device=picked.device)
        args = (step.logits, rows.rows_dev, picked, if_dead, rows.can_stop, chosen, dead)
        run_settle(step.flat.device, args)  # on CUDA a new variant compiles off the step
        if step.flag_rows is not None:
            step.flag_rows(flagged, host_positions)
        return Dead(rows.rows_dev, rows.slots_dev, None, positions, rows.stop_index, rows.can_stop,
                    settled=dead, flagged=step.flag_rows is not None)

    def _settled_on_host(self, step: StepInputs, rows: ListedRows, index: torch.Tensor, positions: torch.Tensor) -> Dead | None:
        """``_settle``'s common step where the logits are host memory (the CPU): the forced logits are
        read into a buffer the host sees (a view made with the layout), and when none is masked,
        as the host can tell without waiting for a device, the rows are filled (every row of the
        step: one memset of the whole tensor) and 0.0 written at each: nothing to decide, and the
        same report while the layout stays. ``None`` (nothing written) where some row's token is
        masked: ``_settle`` then does the whole step. (After a large write to the logits every call
        costs several times its warm cost, its code and data being out of the caches: the fewer the
        better.)"""
        kept = self._cache.get("kept")
        if kept is None or kept[0].dtype != step.flat.dtype:
            buffer = torch.empty(len(rows.rows), dtype=step.flat.dtype)
            kept = self._cache["kept"] = (buffer, buffer.numpy())
        torch.index_select(step.flat, 0, index, out=kept[0])
        if NEG_INF in kept[1].tolist():  # (a NaN is kept: it is not -inf)
            return None
        logits = step.logits
        if rows.identity and len(logits) == len(kept[1]):
            logits.fill_(NEG_INF)
        else:
            fill_rows(logits, rows.runs, rows.rows_dev)
        step.flat.index_fill_(0, index, 0.0)
        flagged = step.flag_rows is not None
        made = self._cache.get("settled")  # kept while the planned views (``positions``) stay
        if made is None or made[0] is not positions or made[1] is not flagged:
            made = self._cache["settled"] = (positions, flagged, Dead(
                rows.rows_dev, rows.slots_dev, None, positions, rows.stop_index, rows.can_stop,
                settled=self._cache["none_dead"], flagged=flagged))
        return made[2]

    def _chosen(self, picked: torch.Tensor, host_positions: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``_settle``'s pick, kept for the layout (a later step's pick is queued after this one's copy
        back, so the buffer is reused), and its views: the target, and what ``flag_rows`` copies back
        (the flag slots, and the positions unless the host knows them: ``host_positions``)."""
        cached = self._cache.get("chosen")
        if cached is None or cached[0].shape != picked.shape:
            chosen = torch.empty_like(picked)
            cached = self._cache["chosen"] = (chosen, chosen[0], chosen[1] if host_positions else chosen[1:])
        return cached

    def _without_stops(self, rows: ListedRows, dtype: torch.dtype,
                       planes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For ``_settle`` when some rows have no stop token: ``[planes, n]`` masks of the rows whose
        ``if_dead`` replaces ``picked`` where their token is masked (the target: rows with a stop
        token; the flag slot and the position: every row), the logit a masked row's target gets (0.0
        at its stop token, ``-inf`` without one) and the one a live row's forced id gets (0.0)."""
        cached = self._cache.get("without_stops")
        if cached is None or cached[1].dtype != dtype or cached[0].shape[0] != planes:
            can_stop = rows.can_stop
            assert can_stop is not None
            dead_value = torch.where(can_stop, 0.0, NEG_INF).to(dtype)
            every = torch.ones_like(can_stop)
            cached = self._cache["without_stops"] = (torch.stack([can_stop] + [every] * (planes - 1)), dead_value,
                                                     torch.zeros_like(dead_value))
        return cached

    def apply_gathered(self, step: StepInputs, rows: GatheredRows) -> Dead | None:
        assert step.generated is not None
        if self._settles_gathered(step, rows.last):
            return self.settle_at_counts(step, rows, step.generated, None, lambda: self._force_gathered(step, rows))
        return self._force_gathered(step, rows)

    def _force_gathered(self, step: StepInputs, rows: GatheredRows) -> Dead:
        """The gathered step's forcing without the settle: the rows forced, the dead ones reported."""
        assert step.generated is not None
        slots = rows.slot_of_row
        length = self.length.dev[slots, 0]
        tokens = self._tokens(step.generated, self.sequence.dev[slots], length)
        return Dead(None, slots, force_gathered(step, tokens, rows.member), step.generated.minimum(length), where=rows.member)

    def counted_settle(self, step: StepInputs, last: bool) -> CountedSettle | None:
        """``settle_at_counts`` where ``_settles_gathered`` holds."""
        return self.settle_at_counts if self._settles_gathered(step, last) else None

    @staticmethod
    def _settles_gathered(step: StepInputs, last: bool) -> bool:
        """A gathered step settles its rows in one fused op (``settle_at_counts``) where no later
        group can mask them (``last``), the step reports flags per row (``StepInputs.flag_rows``, or
        under drafts ``flag_real_rows``) and the op runs on the device (``thinking_force.GATE``)."""
        flag_rows = step.flag_rows if step.flag_rows is not None else step.flag_real_rows
        return last and flag_rows is not None and thinking_force.GATE.ready(step.logits.device)

    def settle_at_counts(self, step: StepInputs, rows: GatheredRows, counts: torch.Tensor,
                         decided: torch.Tensor | None, eager: Callable[[], Dead | None]) -> Dead | None:
        """The gathered step at each row's generated ``counts`` (``ScopedGroup``: its stretch's), its
        rows settled (``_settles_gathered`` holds): the forced token of each member row picked from
        the slot's sequence at ``clamp(count, 0, length)``, forced, the dead rows stopped and their
        flags reported (position ``min(count, length)``) by ``thinking_force.decided_settle_`` in its
        sequence form (one launch; what ``force_gathered`` and ``Failures.record_dead`` write).
        ``decided``: a scoped row's decision, ``counts`` itself (``-1``, a negative count: out of
        phase, left alone; ``ScopedGroup`` gives no count above the output's, so the sign is the
        decision's); ``None``: every member row forced (a row in prefill counts negative: column 0).
        ``eager()``: the caller's step without the settle, run while the settle's kernel variant
        compiles off the step (``thinking_force.run_gated``)."""
        slots = rows.slot_of_row
        device = step.logits.device
        kept = self._cache.get("gathered")
        if kept is None:
            kept = self._cache["gathered"] = (torch.empty(0, dtype=torch.long, device=device),
                                              torch.empty(0, dtype=torch.bool, device=device))
        no_positions, every_real = kept
        assert decided is None or decided is counts, "a scoped row's count is its decision"
        flag_rows = step.flag_rows
        real = every_real
        if flag_rows is None:
            flag_rows = step.flag_real_rows
            if step.real_rows is not None:
                real = step.real_rows
        assert flag_rows is not None
        n = len(slots)
        flags = torch.empty((2, n), dtype=torch.long, device=device)
        dead = torch.empty(n, dtype=torch.bool, device=device)
        args = (step.logits, counts, rows.member, slots, step.stops, no_positions, self.member.num_slots - 1, flags,
                dead, real, self.sequence.dev, self.length.dev, decided is not None)

        def fused() -> Dead:
            thinking_force.decided_settle_(*args)
            flag_rows(flags, None)
            return Dead(None, slots, None, flags[1], settled=dead, flagged=True)

        return thinking_force.run_gated(device, args, fused, eager)


@dataclass(frozen=True, slots=True)
class ForcedSequenceTemplate(Template):
    """A step at generated count ``n``: force ``tokens[n]`` (``eos`` once ``n >= len(tokens)``)."""

    tokens: tuple[int, ...]
    eos: int
    group: ClassVar[type[ForcedSequenceGroup]] = ForcedSequenceGroup


class ForcedSequenceProcessor:
    """At step ``n = len(input_ids)`` force ``token_ids[n]``; from ``n = len(token_ids)`` on, force EOS
    (forcing never unmasks: see ``ops.ForceToken``).

    Stateless: the position is the number of generated tokens, so recomputation
    after preemption, or a second call at the same step, gives the same result.
    """

    __slots__ = ("token_ids", "eos_token_id", "template")

    def __init__(self, token_ids: Sequence[int], eos_token_id: int) -> None:
        self.token_ids = tuple(token_ids)
        self.eos_token_id = eos_token_id
        self.template = ForcedSequenceTemplate(self.token_ids, eos_token_id)

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        n = len(input_ids)
        return ForceToken(self.token_ids[n] if n < len(self.token_ids) else self.eos_token_id)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Entry, ctx: RealizeContext) -> ForcedSequenceProcessor:
    """A fresh processor for one ``forced_sequence`` entry."""
    return ForcedSequenceProcessor(entry.token_ids, entry.eos_token_id)

