"""The modes a resident group can be in: small base classes ``SlotBatch`` dispatches on, each
declaring the hooks it calls for that mode.

A plain ``Group`` runs its step from its slot tables alone (``apply_listed``, ``apply_gathered``).
The modes below add to it:

* ``PlannedGroup``: in the listed layout, where the host knows the positions, the host plans values
  its step reads (``plan``), sent in the step's one upload;
* ``DecidedGroup``: its step depends on each row's tokens (or on the clock), so each row is decided
  first and the decisions are applied (``apply_host_decisions``, ``apply_device_decisions``). Who
  decides, by mode:

  =====================  ====================================================  ==========================
  mode                   decided by                                            resident without histories
  =====================  ====================================================  ==========================
  ``DecidedGroup``       each row's processor on the host, from its history    no
  ``ClockDecided``       each row's (or slot's) processor, with no history     yes
  ``SpanDecided``        the host from histories, else ``DeviceThinking``      yes
  ``WindowDecided``      the host from histories, else the ``TokenWindow``     when the template fits
  ``SpanWindowDecided``  the host from histories, else ``DeviceThinking``      when the template fits
                         applied over the ``TokenWindow``
  =====================  ====================================================  ==========================

"Resident without histories": where the adapter passes no host histories (Model Runner V2),
whether a request with such an entry is resident (``Group.runs_without_histories``) or hosted.
``HostForcingGroup`` is the step shared by the decided kinds that force at most one token per row.

A decided kind whose entries may be scoped to a phase opts in to a resident scoped entry
(``scope.ScopedDecided``) with ``DecidedGroup.scopable`` and ``neutral_history`` (host histories:
each row decided from its phase's stretch, rows out of phase from a history that decides nothing)
and, to be resident without host histories too (a ``SpanWindowDecided``: the span gives each row's
floor), ``WindowDecided.floored`` and ``apply_floored`` (each row decided from the token window,
no position before its stretch's start counted). ``no_repeat_ngram``, ``banned_phrases``, ``dry``
and ``multiple_choice`` do both; a kind whose decision from an empty stretch is not "nothing" tells a
row out of phase apart by identity (``OUT_OF_PHASE``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from .slots import Dead, GatheredRows, Group, ListedRows, StepInputs, Template, force_decided_rows, force_device_decisions
from .uploads import StepUpload

if TYPE_CHECKING:
    from .window import TokenWindow

__all__ = ["OUT_OF_PHASE", "ClockDecided", "DecidedGroup", "Decider", "HostForcingGroup", "OutOfPhase", "PlannedGroup",
           "ScopableForcing", "SpanDecided", "SpanWindowDecided", "WindowDecided"]

#: ``(row, slot, processor)`` of one member row of a decided group, in the listed layout.
Decider = tuple[int, int, Any]


class OutOfPhase(tuple):
    """The empty history of a member row out of a scoped entry's phase, for a kind whose decision
    from it differs from its decision from an empty stretch (``DecidedGroup.neutral_history``): one
    object, told apart by identity."""

    __slots__ = ()


#: the one ``OutOfPhase`` history
OUT_OF_PHASE = OutOfPhase()


class PlannedGroup(Group):
    """A group whose listed step reads values the host plans from positions it knows."""

    #: values per member row ``plan`` writes
    planned_per_row: int = 0

    def plan(self, rows: ListedRows, counts: list[int], generated: np.ndarray, out: np.ndarray) -> None:
        """Listed layout, positions known on the host (row-indexed, as a list, ``counts``, and as an
        array, ``generated``): write this step's ``planned_per_row * len(rows.rows)`` values into
        ``out``; they reach ``apply_listed`` as ``rows.planned`` in the step's one upload, sparing
        the device the ops that derive them."""
        raise NotImplementedError


class DecidedGroup(Group):
    """A group whose step depends on each row's tokens: decided per row, then applied.

    By default each member row's own processor decides on the host from the row's history
    (``decide_rows``, ``host_decision``), so the group is resident only where the adapter passes
    host histories (``SlotBatch(host_histories=True)``); the subclasses below add other deciders."""

    @classmethod
    def runs_without_histories(cls, template: Template, group: Group | None, *, token_window: bool) -> bool:
        return False

    #: the history a member row out of a scoped entry's phase is decided from (``scope.ScopedDecided``),
    #: where ``scopable``: its decision must leave the row as it is
    neutral_history: Sequence[int] = ()
    #: set by ``scope.ScopedDecided`` on the inner group it holds: a member row out of the entry's
    #: phase is then decided from ``neutral_history`` itself (the same object, told apart by identity)
    scoped = False

    @classmethod
    def scopable(cls, template: Template) -> bool:
        """Whether a scoped entry of ``template`` is resident where the adapter passes host histories
        (``scope.ScopedDecided``): the group's ``decide_rows`` takes any history for a member row
        (the stretch of the entry's phase), and ``neutral_history`` decides nothing. By default no:
        a scoped entry of the kind is hosted."""
        return False

    def host_decisions(self, n: int) -> Any:
        """Room for ``n`` member rows' host decisions, in the form ``apply_host_decisions`` takes:
        by default the token each row forces (``-1``: none)."""
        return np.full(n, -1, dtype=np.int64)

    def host_decision(self, processor: Any, history: Sequence[int]) -> Any:
        """One member row's host decision, from the row's own processor and history: by default the
        token its ``row_op`` forces (``-1``: none). May raise (the row's request then fails alone)."""
        op = processor.row_op(history)
        return -1 if op is None else op.token_id

    def decide_rows(self, deciders: list[Decider], histories: Sequence[Sequence[int]],
                    fail: Callable[[int, int, Exception], None]) -> Any:
        """Every member row's host decision (``deciders``: ``(row, slot, processor)`` per member row,
        in order), in the form ``apply_host_decisions`` takes; a row whose decision raises is passed
        to ``fail(row, slot, exc)`` and decides nothing. By default ``host_decision`` row by row; a
        group may decide the rows in one pass, as long as a raising row fails alone."""
        made = []
        decide = self.host_decision
        for row, slot, processor in deciders:
            try:
                made.append(decide(processor, histories[row]))
            except Exception as exc:  # a bug must not escape the sampler: fail this request alone
                fail(row, slot, exc)
                made.append(self.host_decisions(1)[0])
        decisions = self.host_decisions(len(made))
        decisions[:] = made
        return decisions

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, decisions: Any, upload: StepUpload) -> Dead | None:
        """Listed layout: apply ``decisions`` (``decide_rows``' result) to the member rows; ``upload``
        carries any host values the step needs on the device (one non-blocking upload)."""
        raise NotImplementedError

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> Dead | None:
        """Apply per-row decisions already on the device (row-indexed, every row of the step;
        non-member rows must stay untouched)."""
        raise NotImplementedError


class ScopableForcing(DecidedGroup):
    """A forcing decided kind whose scoped entries are resident (``deadline``, ``trigger``,
    ``thinking_budget``; ``scope.ScopedClock``/``ScopedSpan``): its processor decides from any
    stretch, and a row out of its entry's phase (``neutral_history``, told apart by identity)
    forces nothing. Put it before the kind's other bases."""

    neutral_history: Sequence[int] = OUT_OF_PHASE

    @classmethod
    def scopable(cls, template: Template) -> bool:
        return True

    def host_decision(self, processor: Any, history: Sequence[int]) -> int:
        """The token the row forces (``-1``: none, or out of a scoped entry's phase)."""
        if history is OUT_OF_PHASE:
            return -1
        return int(super().host_decision(processor, history))


class ClockDecided(DecidedGroup):
    """Decided on the host without reading any history (a clock): in the listed layout per member
    row, where only the device knows the rows per member slot of the step, so it is resident on
    every runner with slots. ``host_decision`` is called with an empty history."""

    @classmethod
    def runs_without_histories(cls, template: Template, group: Group | None, *, token_window: bool) -> bool:
        return True


class SpanDecided(DecidedGroup):
    """Decided from a span its template follows: on the host from histories where the adapter has
    them, else on the device by ``dynlogits.processors.device_thinking.DeviceThinking`` (the
    template names its tables: ``Template.device_spans``), passed as the step's device decider."""

    @classmethod
    def runs_without_histories(cls, template: Template, group: Group | None, *, token_window: bool) -> bool:
        return True


class WindowDecided(DecidedGroup):
    """Decided from each row's last (or first) tokens: on the host from histories where the adapter
    has them, else on the device from the step's ``TokenWindow`` (``decide_from_window``, then
    ``apply_device_decisions``), where the template fits the device tables (``fits_window``).
    ``from_window`` is set by ``SlotBatch`` on a group it decides from the window (a group writes
    its window tables only then)."""

    from_window = False

    @classmethod
    def fits_window(cls, template: Template, group: Group | None) -> bool:
        """Whether ``template`` may join ``group`` (``None``: not made yet) to be decided from the
        window (else its request is hosted); by default always."""
        return True

    @classmethod
    def runs_without_histories(cls, template: Template, group: Group | None, *, token_window: bool) -> bool:
        return token_window and cls.fits_window(template, group)

    def decide_from_window(self, rows: GatheredRows, window: TokenWindow) -> torch.Tensor:
        """Every row's decision from its tokens in ``window`` (row-indexed, on the device), for
        ``apply_device_decisions``."""
        raise NotImplementedError

    #: whether the kind decides rows from the window from a floor on (``apply_floored``): a scoped
    #: entry of it is then resident without host histories (``scope.ScopedDecided``)
    floored: ClassVar[bool] = False
    #: where the inner group of a scoped entry (``scope.ScopedDecided``): whether its window tables
    #: are written from its first window step on only (tables too large to write where nobody reads
    #: them: with host histories), not from its first member on
    tables_at_first_window: ClassVar[bool] = False

    def apply_floored(self, step: StepInputs, rows: GatheredRows, window: TokenWindow,
                      floor: torch.Tensor) -> Dead | None:
        """Gathered layout, where ``floored``: every row decided from its tokens in ``window`` at
        positions from ``floor[r]`` on only (int64, positions from the prompt's start; past the
        row's own: nothing decided), and the decisions applied; no sync."""
        raise NotImplementedError


class SpanWindowDecided(SpanDecided):
    """Decided from a span its template follows together with the token window (Model Runner V2):
    the step's device decider (``DeviceThinking``) gives each row's decision from its span state,
    which ``apply_window_decisions`` applies over the step's ``TokenWindow``; with host histories,
    on the host as any decided group."""

    def apply_window_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor,
                               window: TokenWindow) -> Dead | None:
        """Apply the device decider's ``decisions`` (row-indexed) reading the rows' tokens in ``window``."""
        raise NotImplementedError


class HostForcingGroup(DecidedGroup):
    """A decided group whose step forces at most one token per row (``-1``: none), chosen by the
    row's own processor (its ``row_op`` is a ``ForceToken`` or ``None``) or by a device decider; no
    tables. Only the rows that force are touched. Combine it with a mode (``ClockDecided``,
    ``SpanDecided``) for a decider other than host histories."""

    restrictive = True
    positional = True  # a row left with no token reports its output position

    def _write(self, slot: int, template: Any) -> None:
        pass  # decided from the request's own processor

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, decisions: np.ndarray,
                             upload: StepUpload) -> Dead | None:
        """Force ``decisions[i]`` (``-1``: nothing) in member row ``i``, keeping masks."""
        return force_decided_rows(step, rows, decisions, upload)

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> Dead:
        """Gathered layout: force ``decisions[r]`` (``-1``: nothing) in row ``r``, keeping masks."""
        return force_device_decisions(step, rows, decisions)
