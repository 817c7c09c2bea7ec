"""One request's realized processors plus its failure state: the SDK's isolation unit.

An exception escaping a sampler usually kills every request of the engine, so a
``GuardedRequest`` catches its processors' exceptions, reports them once (ERROR log with traceback
and the ``report`` callback) and fail-stops the request: its row is masked to its stop token from
then on. Other requests never see the failure. A request without a stop token continues
unconstrained to its length limit, and the log says so.

A request also fails when a step leaves its row with no token to sample (its restricted ids all
masked, by the engine's grammar or its own entries). The apply paths find this on the device and
fail-stop the row in that step; the host records it once the answer lands (``readback``).
``fail`` and ``poll`` are safe from any thread.

Each failure is also kept as data (``GuardedRequest.failure``: its ``Reason``, the output position
and, where known, which processor) and handed to ``on_failure`` where an adapter set one: what the
adapter reports to the worker that answers the client (``dynlogits.sdk.failure_reports``). Which
entry left a row with no token is found on the host once the request failed (``blame``)."""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch

from dynlogits.processors.request import RequestLogitsProcessor

from .failure_reports import Reason
from .readback import DeviceFlags

__all__ = ["NO_TOKEN_LEFT", "Failure", "FailureReport", "GuardedRequest", "pick_stop_token"]

logger = logging.getLogger("dynlogits.sdk")

#: Called with a one-line description each time a request fails.
FailureReport = Callable[[str], None]

#: The reason recorded when a step leaves a request's row without a token (``{n}``: the position).
NO_TOKEN_LEFT = (
    "no token left to sample at output position {n}: every token its processors allow is masked "
    "(a forced or allowed token masked by the engine's grammar, or by another entry)"
)
#: The same for a row a ``python`` or plug-in processor left with no finite logit.
NO_FINITE_LOGIT = (
    "no token left to sample at output position {n}: no logit of its row is finite after its "
    "processors (an opaque processor masked every token the others left)"
)

_STATE = threading.RLock()  # a request's failure state: recorded from the engine's thread or the watcher

#: Every reason this module writes names its position so (``NO_TOKEN_LEFT``, ``fail_with``).
_POSITION = re.compile(r"at output position (\d+)")


@dataclass(frozen=True)
class Failure:
    """Why a request failed, as data: ``reason``, the one-line ``detail`` that is logged, the output
    ``position`` of the row it failed at (``None``: not known) and ``processor``, the index of the
    processor to blame in ``RequestLogitsProcessor.processors`` (``None``: not known, or none: an
    entry that was not realized is named in ``detail``)."""

    reason: Reason
    detail: str
    position: int | None = None
    processor: int | None = None

    @classmethod
    def of(cls, detail: str, *, reason: Reason | None = None, position: int | None = None,
           processor: int | None = None) -> Failure:
        """``detail``'s failure; its reason and position read from it when not given (the templates
        above: ``no token left ... at output position N``)."""
        if reason is None:
            reason = Reason.NO_TOKEN_LEFT if detail.startswith("no token left") else Reason.PROCESSOR_ERROR
        if position is None and reason is not Reason.NOT_REALIZED:
            match = _POSITION.search(detail)
            position = int(match.group(1)) if match else None
        return cls(reason, detail, position, processor)


def _raising_processor(processors: Sequence[Any], tb: TracebackType | None) -> int | None:
    """The index of the processor of ``processors`` whose method a traceback passes through first."""
    by_id = {id(p): i for i, p in enumerate(processors)}
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is not None and id(owner) in by_id:
            return by_id[id(owner)]
        tb = tb.tb_next
    return None


def pick_stop_token(eos_token_id: int | None, stop_token_ids: Iterable[int] | None, vocab_size: int) -> int | None:
    """The token that ends a failed request: its EOS when it is inside the logits width, else its
    lowest explicit stop token id inside it, else ``None``."""
    if isinstance(eos_token_id, int) and 0 <= eos_token_id < vocab_size:
        return eos_token_id
    stops = sorted(t for t in (stop_token_ids or ()) if isinstance(t, int) and 0 <= t < vocab_size)
    return stops[0] if stops else None


class GuardedRequest:
    """The realized processors of one request and whether it has failed.

    ``plan(history)`` is this step's work for the apply paths. ``history``: the tokens generated so
    far (drafts before the row included); positions derive from it, so a request may be planned for
    several rows per step, or again after preemption."""

    __slots__ = ("_pending", "_report", "error", "failure", "on_failure", "processor", "stop_token_id")

    def __init__(
        self,
        processor: RequestLogitsProcessor | None,
        *,
        stop_token_id: int | None,
        report: FailureReport | None = None,
        error: str | None = None,
    ) -> None:
        self.processor = processor
        self.stop_token_id = stop_token_id
        self.error = error
        self._report = report
        self._pending: list[tuple[DeviceFlags, int, str]] = []
        #: the first failure, as data (set with ``error``, or alone where a partly realized request runs on)
        self.failure: Failure | None = None
        #: called once with this request when it fails (an adapter's report to its worker); any thread
        self.on_failure: Callable[[GuardedRequest], None] | None = None

    @property
    def failed(self) -> bool:
        self.poll()
        return self.error is not None

    @property
    def resident(self) -> bool:
        """Whether every processor has a ``template`` (a built-in kind's, or a plug-in's: the resident
        path can run it)."""
        return self.processor is not None and all(hasattr(p, "template") for p in self.processor.processors)

    def split(self) -> tuple[GuardedRequest | None, GuardedRequest | None]:
        """What of this request a slot engine runs resident and what per row (hosted), applied in
        that order each step: ``(self, None)`` when every processor has a template; ``(leading,
        trailing)`` when the processors with a template all come before those without (at least one
        of each): two parts of this request, so the built-ins stay resident and only the trailing
        plug-in entries run per row, in payload order; else ``(None, self)`` (a templated entry after
        a hosted one: resident entries apply before hosted ones, so payload order would not hold).

        The parts share this request's failure state: either part failing fails the request (its
        ``failure`` names the processor by its index in the whole request), and a failed request
        runs neither part. The per-row part ends with a check of the whole row (``_RowChecked``): a
        row its steps leave with no finite logit, after a resident part that restricted it, fails
        the request as when every entry runs per row."""
        if self.processor is None:
            return None, self
        templated = [hasattr(p, "template") for p in self.processor.processors]
        cut = templated.index(False) if False in templated else len(templated)
        if cut == len(templated):
            return self, None
        if cut == 0 or any(templated[cut:]):
            return None, self
        processors, width = self.processor.processors, self.processor.vocab_size
        return (_Part(self, RequestLogitsProcessor(processors[:cut], vocab_size=width)),
                _Part(self, RequestLogitsProcessor((*processors[cut:], _RowChecked()), vocab_size=width)))

    def plan(self, history: Sequence[int]) -> list[Any] | None:
        """This step's steps for ``dynlogits.sdk.plans.apply_plans``; ``None`` once the request failed
        (its row must then be fail-stopped with ``force_stop``)."""
        if not self.failed and self.processor is not None:
            try:
                return self.processor.plan(history)
            except Exception as exc:  # isolate this request; see the module docstring
                self.fail_with(exc, history)
        return None

    def fail_with(self, exc: Exception, history: Sequence[int] | None) -> None:
        """Record that a processor raised ``exc`` at this position (logged and reported once);
        ``history`` ``None`` where the caller does not know the row's (its position is then not named)."""
        processors = self.processor.processors if self.processor is not None else ()
        at = f"at output position {len(history)}" if history is not None else "at an output position not known here"
        self.fail(f"{self.processor!r} raised {at}: {type(exc).__name__}: {exc}", exc_info=True,
                  failure=Failure(Reason.PROCESSOR_ERROR, "", None if history is None else len(history),
                                  _raising_processor(processors, exc.__traceback__)))

    def note_dead(self, flags: DeviceFlags, index: int, reason: str) -> None:
        """``flags[index]`` (on its way from the device) says whether this request's row was left
        with no token; the request fails for ``reason`` once it is known to (``poll``)."""
        with _STATE:
            self._pending.append((flags, index, reason))
        self.poll()

    def poll(self) -> None:
        """Record the failures the device has reported back by now (never waits)."""
        if not self._pending:
            return
        with _STATE:
            while self._pending and self.error is None:
                flags, index, reason = self._pending[0]
                values = flags.ready()
                if values is None:
                    return
                self._pending.pop(0)
                if values[index]:
                    self.fail(reason)
            if self.error is not None:
                self._pending.clear()

    def fail(self, reason: str, *, exc_info: bool = False, failure: Failure | None = None) -> None:
        """Fail the request for ``reason`` (logged and reported once; later calls do nothing);
        ``failure`` what is known of it beyond the text (its detail is ``reason``)."""
        with _STATE:
            if self.error is not None:
                return
            self.error = reason
            if self.failure is None:
                self.failure = (Failure.of(reason) if failure is None else
                                Failure(failure.reason, reason, failure.position, failure.processor))
        ending = (
            f"ending the request with stop token {self.stop_token_id}"
            if self.stop_token_id is not None
            else "the request has no stop token and continues unconstrained"
        )
        self._announce(reason, ending, exc_info=exc_info)

    def _announce(self, reason: str, ending: str, *, exc_info: bool = False) -> None:
        message = f"dynamo logits processor failed for one request ({reason}); {ending}; other requests are unaffected"
        logger.error(message, exc_info=exc_info)
        if self._report is not None:
            self._report(message)
        with _STATE:
            if self.failure is None:
                self.failure = Failure.of(reason)
        self._notify()

    def _notify(self) -> None:
        """Hand the failure to ``on_failure`` (an adapter's report); a bug there must not reach the engine."""
        hook = self.on_failure
        if hook is not None and self.failure is not None:
            try:
                hook(self)
            except Exception:
                logger.exception("reporting a request's failure failed")

    def blame(self, history: Sequence[int], vocab_size: int) -> int | None:
        """Which processor left the row at ``history`` with no token: the first whose step, after
        those before it, leaves no finite logit in a fresh row of ``vocab_size`` on the host
        (``None``: none alone does, so the engine's own masks took part; or the processors raise).
        Call only once the request has failed (its processors no longer run: this steps them)."""
        if self.processor is None:
            return None
        row = torch.zeros(vocab_size)
        try:
            for i, processor in enumerate(self.processor.processors):
                processor(history, row)
                if not bool(torch.isfinite(row).any()):
                    return i
        except Exception:  # the failure is reported all the same, without its entry
            logger.debug("blaming a processor raised", exc_info=True)
        return None

    def force_stop(self, logits: torch.Tensor) -> None:
        """Mask every row of ``logits`` (one row, or ``[..., vocab]``: beams, drafts) to the
        request's stop token, in two ops whatever the number of rows (nothing when it has none).
        This one override of the engine's masks is deliberate: a failed request must end."""
        if self.stop_token_id is not None:
            logits.fill_(-math.inf)
            stop = self.stop_token_id
            logits[..., stop : stop + 1].fill_(0.0)  # not ``[..., stop] = 0.0``: a blocking copy on CUDA for one row

    @classmethod
    def failed_at_realization(
        cls, reason: str, *, stop_token_id: int | None, report: FailureReport | None,
        processor: RequestLogitsProcessor | None = None,
    ) -> GuardedRequest:
        """A request whose payload could not be realized, or only in part (``processor``: the entries
        that were): fail-stopped from its first row. Without a stop token nothing can end it: it is
        reported all the same and runs on with ``processor`` applying (not ``failed``: the apply
        paths stop applying a failed request's processors), never unconstrained while any realized."""
        failure = Failure(Reason.NOT_REALIZED, reason, 0)  # before its first row
        if stop_token_id is None and processor is not None:
            request = cls(processor, stop_token_id=None, report=report)
            request.failure = failure
            request._announce(reason, "the request has no stop token: it continues with the entries that were realized")
            return request
        request = cls(None, stop_token_id=stop_token_id, report=report)
        request.fail(reason, failure=failure)
        return request

    def __repr__(self) -> str:
        state = f"failed: {self.error}" if self.error else repr(self.processor)
        return f"GuardedRequest({state})"


class _RowChecked:
    """The last step of a split request's per-row part: does nothing, and being opaque (no
    ``row_op``), has the apply paths check its whole row for a finite logit (``plans.EmptyRows``),
    since the resident part before it may have left only ids the per-row steps then mask."""

    __slots__ = ()

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        return None


class _Part(GuardedRequest):
    """Some of a request's processors (``GuardedRequest.split``) as a request of their own to the apply
    paths: its own ``processor``, every bit of failure state the whole request's."""

    __slots__ = ("whole",)

    def __init__(self, whole: GuardedRequest, processor: RequestLogitsProcessor) -> None:
        self.whole = whole
        self.processor = processor

    # the failure state is the whole request's, read-only here (these shadow the base class's slots)
    error = property(lambda self: self.whole.error)
    failure = property(lambda self: self.whole.failure)
    stop_token_id = property(lambda self: self.whole.stop_token_id)
    on_failure = property(lambda self: self.whole.on_failure)

    @property
    def failed(self) -> bool:
        return self.whole.failed

    def fail_with(self, exc: Exception, history: Sequence[int] | None) -> None:
        self.whole.fail_with(exc, history)

    def note_dead(self, flags: DeviceFlags, index: int, reason: str) -> None:
        self.whole.note_dead(flags, index, reason)

    def poll(self) -> None:
        self.whole.poll()

    def fail(self, reason: str, *, exc_info: bool = False, failure: Failure | None = None) -> None:
        self.whole.fail(reason, exc_info=exc_info, failure=failure)

    def blame(self, history: Sequence[int], vocab_size: int) -> int | None:
        return self.whole.blame(history, vocab_size)

    def __repr__(self) -> str:
        return f"part of {self.whole!r}: {self.processor!r}"
