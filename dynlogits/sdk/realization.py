"""Duty 2, realize: an untrusted payload -> fresh per-request processors, never raising into the engine.

``validate(payload)`` is the admission check (where the engine has one: raise there so a bad
payload fails its own request with a clear error before it is queued). ``realize(...)`` runs
where the request enters the engine's batch; it never raises: a payload that only fails there
(e.g. an id beyond the logits width, which admission may not know) yields a request that is
already failed and is fail-stopped on its first row (see ``dynlogits.sdk.guard``).

Every adapter comes through here, so every engine validates and realizes a payload the same way.
The payload is untrusted: all checks run before any code runs. ``decode_payload`` and
``build_request_processor`` are the raising building blocks under ``validate`` and ``realize``.

Decoding is done once per payload per process: what admission decoded, realization reuses (and
requests carrying the same payload, e.g. the deployment's, share it). The part of a decode that
depends only on the payload, the limits and the kinds in force is kept (a bounded LRU of
immutable entries: factories read their entry, never change it), and so is what passed the width
and consistency checks for each logits width; a payload those refuse is checked again every time.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from dynlogits.processors import BaseLogitsProcessor, RealizeContext
from dynlogits.processors.base import SamplingView, Vocabulary
from dynlogits.processors.kept import Kept, deep_size
from dynlogits.processors.registry import REALIZED, check_python_allowed, factory_for
from dynlogits.processors.request import RequestLogitsProcessor
from dynlogits.processors.scope import Phases, scoped
from dynlogits.specs import DEFAULT_LIMITS, WIRE_KEY, SpecError, SpecLimits, check_vocab
from dynlogits.specs.admission.rules import Entry
from dynlogits.specs.builtin import BUILTIN
from dynlogits.specs.consistency import check_consistency
from dynlogits.specs.errors import Problem
from dynlogits.specs.kinds import kinds_generation, plugin_kinds
from dynlogits.specs.wire import decode_entries, finish_entries

from .guard import FailureReport, GuardedRequest

__all__ = ["RequestFacts", "build_request_processor", "decode_payload", "realize", "validate"]


#: Decoded payloads kept per process, and as many checked against a width (see the module doc): at
#: most ``DECODED_KEPT`` holding at most ``DECODED_BYTES`` bytes each memo, a payload weighed with
#: its JSON key (``dynlogits.processors.kept.deep_size``: its entries take some 7x its JSON, a
#: 0.5 MB payload ~3.2 MiB with its key; one heavier than the budget is decoded every time). A
#: decode or a check that raises is never kept.
DECODED_KEPT = 256
DECODED_BYTES = 16 << 20
_decoded_memo: Kept[tuple[Any, ...]] = Kept(DECODED_KEPT, DECODED_BYTES)
_checked_memo: Kept[tuple[Any, ...]] = Kept(DECODED_KEPT, DECODED_BYTES)


def _weigher(key: tuple[Any, ...]) -> Callable[[tuple[Any, ...]], int]:
    """What a payload's entries weigh in either memo, with its memo key (``deep_size``), walked
    once however many memos keep them."""
    weights: dict[int, int] = {}

    def weigh(entries: tuple[Any, ...]) -> int:
        weight = weights.get(id(entries))
        if weight is None:
            weight = weights[id(entries)] = deep_size((key, entries))
        return weight

    return weigh


def _decoded(payload: Any, limits: SpecLimits, vocab_size: int | None, admitted: bool = False) -> tuple[Any, ...]:
    """``specs.wire.decode_entries(payload, limits)`` once per payload content, limits and kinds in
    force, then ``finish_entries`` (ids against ``vocab_size``, consistency; ``admitted``: the ids
    only) once per width too (payloads that are not JSON data are decoded, and refused, every time)."""
    try:
        content = msgspec.json.encode(payload)
    except (TypeError, ValueError, OverflowError):
        return _finished(decode_entries(payload, limits=limits), vocab_size, admitted, limits)
    key = (content, limits, kinds_generation(), tuple(plugin_kinds()))
    weigh = _weigher(key)
    return _checked_memo.made((*key, vocab_size, admitted), lambda: _finished(
        _decoded_memo.made(key, lambda: decode_entries(payload, limits=limits), weigh), vocab_size, admitted, limits),
        weigh)


def _finished(entries: tuple[Any, ...], vocab_size: int | None, admitted: bool, limits: SpecLimits) -> tuple[Any, ...]:
    """``finish_entries``; for an ``admitted`` payload (the engine checked it where the request
    entered) only its ids against the width: O(payload), no consistency walk."""
    if not admitted:
        return finish_entries(entries, vocab_size=vocab_size, limits=limits)
    if vocab_size is not None:
        check_vocab(entries, vocab_size, root=WIRE_KEY)
    return entries


def decode_payload(
    payload: Any,
    *,
    vocab_size: int | None = None,
    limits: SpecLimits = DEFAULT_LIMITS,
    environ: Mapping[str, str] = os.environ,
    admitted: bool = False,
) -> tuple[Any, ...]:
    """Validate a payload into entries (``SpecError`` naming the field on any problem).

    ``decode_wire_payload`` checks every entry, built-in or of a plug-in kind in force
    (by its own model); an entry of an ``allow_listed`` kind passes only when its factory is
    allow-listed here. ``admitted``: the
    engine ran ``validate`` on this payload where the request entered (``RequestFacts.admitted``),
    so the consistency walks are not run again.
    """
    if payload is None:
        return ()
    entries = _decoded(payload, limits, vocab_size, admitted)
    for i, entry in enumerate(entries):
        declared = BUILTIN.get(entry.kind)
        if declared is not None and declared.allow_listed:  # its ``factory`` field names code to run
            check_python_allowed(entry.factory, path=f"{WIRE_KEY}[{i}].factory", environ=environ)
    return entries


#: Ids this process gives requests whose engine names none (``RequestFacts.request_id``).
_LOCAL_IDS = itertools.count(1)


@dataclass(frozen=True)
class RequestFacts:
    """What an adapter knows of one request when it realizes it (``RealizeContext`` passes it on):
    its prompt ids (``None``: the engine does not say), the ids it stops on (the one a failed
    request is ended with first), when it arrived (``None``: now), and whether the engine ran
    ``validate`` on its payload where it entered (vLLM's ``validate_params``): realization then
    checks only what is O(payload), never the consistency walks again. Also its id for logs
    (``None``: realization makes one up, ``local-N``), its sampling parameters and the engine's
    ``Vocabulary`` (``None``: no tokenizer), which is loaded only if a factory reads it."""

    prompt_ids: Sequence[int] | None = None
    stop_token_ids: Sequence[int] = ()
    arrival_time: float | None = None
    admitted: bool = False
    request_id: str | None = None
    sampling: SamplingView = SamplingView()
    vocabulary: Vocabulary | None = None

    @classmethod
    def of(cls, *, prompt_ids: Sequence[int] | None, eos_token_id: int | None, stop_token_ids: Iterable[int] = (),
           arrival_time: float | None = None, admitted: bool = False, request_id: str | None = None,
           sampling: SamplingView | None = None, vocabulary: Vocabulary | None = None) -> RequestFacts:
        """The facts with stop ids in the order every adapter gives them: the EOS first (``None``:
        no EOS, e.g. the request ignores it), then the other stop ids, ascending, each once."""
        first = (eos_token_id,) if isinstance(eos_token_id, int) else ()
        rest = sorted({int(t) for t in stop_token_ids if isinstance(t, int) and t not in first})
        return cls(prompt_ids=prompt_ids, stop_token_ids=(*first, *rest), arrival_time=arrival_time, admitted=admitted,
                   request_id=request_id, sampling=sampling if sampling is not None else SamplingView(),
                   vocabulary=vocabulary)


def build_request_processor(
    payload: Any, *, vocab_size: int, limits: SpecLimits = DEFAULT_LIMITS, facts: RequestFacts | None = None
) -> RequestLogitsProcessor | None:
    """Fresh processors for one request, or ``None`` when the payload is absent or empty. An entry
    of a kind that declares the delimiters sets the context's and builds no processor; an entry with a
    ``scope`` is wrapped to act in its phase only (``dynlogits.processors.scope``). ``SpecError``
    naming every entry that could not be realized, once all were tried (``realize`` keeps the
    processors of those that were)."""
    processor, problems = _realized(payload, vocab_size=vocab_size, limits=limits, facts=facts)
    if problems:
        raise SpecError(problems)
    return processor


def _declares_delimiters(entry: Entry) -> bool:
    """Whether ``entry``'s kind declares the request's reasoning delimiters (``ProcessorKind.delimiters``)."""
    declared = BUILTIN.get(entry.kind)
    return declared is not None and declared.delimiters


def _builds_nothing(entry: Entry) -> bool:
    """Whether ``entry``'s kind builds no processor (a built-in declared with ``factory=None``)."""
    declared = BUILTIN.get(entry.kind)
    return declared is not None and declared.factory is None


def _realized(payload: Any, *, vocab_size: int, limits: SpecLimits,
              facts: RequestFacts | None) -> tuple[RequestLogitsProcessor | None, list[Problem]]:
    """The processors of every entry of ``payload`` that realizes, and a problem naming each entry
    that does not: its factory raised (e.g. a ``deadline`` for a request without a stop token), or,
    realized from the request's facts (``registry.REALIZED``), it contradicts the others. One entry
    failing never drops the others (the deployment's among them). ``SpecError`` when the payload is
    refused whole (its decode, limits, ids against the width, consistency)."""
    entries = decode_payload(payload, vocab_size=vocab_size, limits=limits, admitted=bool(facts and facts.admitted))
    if not entries:
        return None, []
    facts = facts or RequestFacts()
    reasoning = next(((tuple(e.start_token_ids), tuple(e.end_token_ids)) for e in entries if _declares_delimiters(e)), None)
    prompt = tuple(facts.prompt_ids or ())
    ctx = RealizeContext(vocab_size=vocab_size, prompt_ids=prompt, stop_token_ids=tuple(facts.stop_token_ids),
                         arrival_time=time.time() if facts.arrival_time is None else facts.arrival_time,
                         reasoning=reasoning,
                         request_id=facts.request_id if facts.request_id is not None else f"local-{next(_LOCAL_IDS)}",
                         sampling=facts.sampling, tokenizer_vocabulary=facts.vocabulary)
    problems: list[Problem] = []
    left_out: set[int] = set()
    try:
        entries = _as_realized(entries, ctx, limits)
    except SpecError as err:  # as realized for this request they contradict the others: realize the others
        problems += err.problems
        left_out = {i for i, entry in enumerate(entries) if entry.kind in REALIZED
                    and REALIZED[entry.kind](entry, ctx) is not None}
    phases: Phases | None = None
    processors: list[BaseLogitsProcessor] = []
    for i, entry in enumerate(entries):
        if i in left_out or _builds_nothing(entry):
            continue
        try:
            processor = factory_for(entry.kind)(entry, ctx)
            scope = getattr(entry, "scope", "always")
            if scope != "always":
                phases = phases or Phases(reasoning, prompt)
                processor = scoped(processor, scope, phases)
            processors.append(processor)
        except SpecError as err:
            problems += err.problems
        except Exception as exc:  # a factory failed: this entry is left out and the request fails, loudly
            problems.append(Problem(f"{WIRE_KEY}[{i}]", f"could not realize kind {entry.kind!r}: {type(exc).__name__}: {exc}"))
    return (RequestLogitsProcessor(processors, vocab_size=vocab_size) if processors else None), problems


def _as_realized(entries: tuple[Any, ...], ctx: RealizeContext, limits: SpecLimits = DEFAULT_LIMITS) -> tuple[Any, ...]:
    """The entries as this request realizes them: an entry of a kind that depends on the request's
    facts (``registry.REALIZED``, e.g. ``prompt_tokens`` in ``restrict`` mode) becomes the built-in
    entry it realizes to, and the payload is checked again as admission checks it (admission does
    not know the prompt; the realizing worker does). ``SpecError`` naming the entries."""
    seen = list(entries)
    changed = []
    for i, entry in enumerate(entries):
        hook = REALIZED.get(entry.kind)
        made = hook(entry, ctx) if hook is not None else None
        if made is not None:
            seen[i] = made
            changed.append(f"{WIRE_KEY}[{i}] ({entry.kind}) as realized for it")
    if not changed:
        return entries
    try:
        check_consistency(seen, root=WIRE_KEY, vocab_size=ctx.vocab_size, limits=limits)
    except SpecError as err:
        why = f" (with this request's prompt: {', '.join(changed)})"
        raise SpecError([Problem(p.path, p.rule + why) for p in err.problems]) from None
    return tuple(seen)


def validate(payload: Any, *, vocab_size: int | None = None, limits: SpecLimits = DEFAULT_LIMITS) -> None:
    """Raise ``SpecError`` (a ``ValueError`` naming the field) unless ``payload`` would realize:
    everything ``build_request_processor`` checks, without realizing.

    ``None`` (no payload) is valid. Pass ``vocab_size`` (the logits width) when it is known.
    """
    decode_payload(payload, vocab_size=vocab_size, limits=limits)


def realize(
    payload: Any,
    *,
    vocab_size: int,
    stop_token_id: int | None,
    report: FailureReport | None = None,
    facts: RequestFacts | None = None,
    limits: SpecLimits = DEFAULT_LIMITS,
) -> GuardedRequest | None:
    """Fresh processors for one request; ``None`` when it carries no payload (or an empty one).

    ``vocab_size`` is the logits width; ``stop_token_id`` ends the request if it fails
    (``dynlogits.sdk.pick_stop_token``); ``report`` receives one line per failure; ``facts`` what
    the adapter knows of the request (prompt, stop ids, arrival); ``limits`` those of the payload
    (the operator's where the adapter knows them). Never raises.

    Entries that cannot be realized fail the request, reported, and never drop the others: the
    request is fail-stopped where it has a stop token, and where it has none (``ignore_eos``
    without stop ids: nothing can end it) the entries that realized keep applying
    (``GuardedRequest.failed_at_realization``). A payload refused whole fails the request alone.
    """
    if payload is None:
        return None
    facts = facts or RequestFacts()
    if not facts.stop_token_ids and stop_token_id is not None:
        facts = dataclasses.replace(facts, stop_token_ids=(stop_token_id,))
    try:
        processor, problems = _realized(payload, vocab_size=vocab_size, limits=limits, facts=facts)
    except Exception as exc:
        return GuardedRequest.failed_at_realization(
            f"payload rejected in the engine: {type(exc).__name__}: {exc}", stop_token_id=stop_token_id, report=report
        )
    if problems:
        return GuardedRequest.failed_at_realization(
            f"entries not realized in the engine: {SpecError(problems)}", stop_token_id=stop_token_id, report=report,
            processor=processor)
    if processor is None:
        return None
    return GuardedRequest(processor, stop_token_id=stop_token_id, report=report)
