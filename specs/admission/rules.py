"""What a kind does to a row, as admission models it: ``KindRules``, which each kind declares in its
own module (``dynlogits.specs.admission.<kind>:RULES``) and the generic walks read (``consistency``,
``consistency_walks``, ``admission_work``). No walk names a kind: each asks an entry's rules for a
role (a mask, a forced output, phrases, choices, a trigger, ...) and reads it through them.

A kind admission does not model has ``OPAQUE`` rules: every role absent, so no rule meets it and a
row it leaves with no token fails its request while it runs. No torch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

if TYPE_CHECKING:
    from ..errors import Problem

__all__ = ["OPAQUE", "Along", "Anywhere", "Delimiters", "Entry", "Form", "KindRules", "Meeting", "Phrases", "Sets"]

#: An entry's effect on a step's allowed set: ``mask`` (its ``ids`` masked), ``keep`` (only its
#: ``ids`` kept), ``force`` (only the token its ``along`` sequence holds at the position), ``first``
#: (only its ``ids`` kept, at its first position alone).
Form = Literal["mask", "keep", "force", "first"]
#: Reasoning delimiters: the start ids, then the end ids.
Delimiters = tuple[tuple[int, ...], tuple[int, ...]]


class Entry(Protocol):
    """What every walk reads of an entry itself: its kind (its scope through ``scope_of``)."""

    @property
    def kind(self) -> str: ...


E = TypeVar("E")


class Phrases(Protocol):
    """What a rule reads of a phrase ban's automaton (``effects.PhraseAutomaton``)."""

    def first_in(self, written: Sequence[int]) -> int | None: ...


class Sets(Protocol):
    """What a rule reads of the payload's id sets, built once per payload (``effects.EntrySets``)."""

    def mask(self, j: int) -> frozenset[int]: ...

    def keep(self, j: int) -> frozenset[int]: ...

    def automaton(self, j: int) -> Phrases: ...


@dataclass(frozen=True, slots=True)
class Along:
    """What of a position ``n`` (of its scale) an entry's effect depends on: the token of
    ``sequence`` at ``n`` (``after`` past its end), whether ``n < below``, or whether ``n == 0``
    (``first``); all unset: nothing. The position rules check the points where it changes."""

    sequence: tuple[int, ...] | None = None
    after: int = 0
    below: int | None = None
    first: bool = False


@dataclass(frozen=True)
class Anywhere:
    """Tokens an entry forces at steps admission cannot place (a span's end tokens, which close it
    after any number of tokens): ``tokens`` in order (``()``: not known without the request's
    delimiters; ``held``: them as a set, built on first use), forced in ``phases``. ``noun`` names
    them in a message, which ends with ``so`` after a position-free mask's clause, with ``until``
    after the clause of a mask that holds until a position."""

    tokens: tuple[int, ...]
    phases: frozenset[str]
    noun: str
    so: str
    until: str

    @cached_property
    def held(self) -> frozenset[int]:
        return frozenset(self.tokens)


@dataclass(frozen=True, slots=True)
class Meeting:
    """What a mask does to tokens forced anywhere (``Anywhere``): the ``clause`` a message states
    (its token and entry named) and whether it ``holds`` only until a position."""

    clause: str
    holds: bool = False


@dataclass(frozen=True, slots=True)
class KindRules(Generic[E]):
    """A kind's admission rules (every field optional: unset, the kind has no such role).

    Its effect on a row: ``form`` (``Form``) of the fixed set ``ids(entry)``, over positions as
    ``along(entry)`` says; ``keep_words`` names what it keeps in a message ("allows only <words>
    earlier entries mask"). Roles the pairwise walks follow: ``writes`` (the output it fixes in its
    stretch: its tokens, then its EOS), ``phrases`` (phrases it masks the last token of wherever its
    stretch ends with the rest), ``choices`` and ``choice_eos`` (the outputs it allows, EOS after a
    whole one when set), ``cue`` (a trigger's ids and the phrase forced once they are written;
    ``None`` while either is unset), ``anywhere`` (tokens it forces at steps no position names,
    given the payload's delimiters and its phases), ``meets_anywhere`` (what it does to such
    tokens), ``delimiters`` (the request's reasoning delimiters it declares).

    Flags: ``acts`` (``False``: it acts on no row and is no entry of any phase), ``alone`` (one
    entry of the kind may be refused on its own), ``contradicts`` (it can contradict other entries
    beyond masks covering the vocabulary), ``checks`` (its own rules, run in order, each over every
    entry before the next), ``last`` (it must be the payload's last entry that acts: it reads the
    row every entry before it leaves, so one acting after it is refused naming both; its
    ``last_why`` says why, in a message).

    ``field``: the field problems and work on its main role are named by (a phrase's path, the
    budget's drivers). Budget: ``size`` (ids of its fixed set), ``id_fields`` (its id fields,
    encoded for the verdict memo)."""

    form: Form | None = None
    ids: Callable[[E], frozenset[int]] | None = None
    along: Callable[[E], Along] | None = None
    keep_words: str = ""
    writes: Callable[[E], tuple[int, ...]] | None = None
    phrases: Callable[[E], Sequence[Sequence[int]]] | None = None
    choices: Callable[[E], Sequence[Sequence[int]]] | None = None
    choice_eos: Callable[[E], int | None] | None = None
    cue: Callable[[E], tuple[Sequence[int], Sequence[int]] | None] | None = None
    anywhere: Callable[[E, Delimiters | None, frozenset[str]], Anywhere] | None = None
    meets_anywhere: Callable[[E, int, Sets, Anywhere, str], Meeting | None] | None = None
    delimiters: Callable[[E], Delimiters] | None = None
    acts: bool = True
    alone: bool = False
    contradicts: bool = False
    #: each: ``(entry, its path, the payload's delimiters or None)`` -> the problem, or ``None``
    checks: tuple[Callable[[E, str, Delimiters | None], Problem | None], ...] = ()
    last: bool = False
    last_why: str = ""
    size: Callable[[E], int] | None = None
    field: str = "token_ids"
    id_fields: tuple[str, ...] = ()


#: The rules of a kind admission does not model (plug-in kinds, and the built-ins that act at
#: moments or on tokens admission does not know): no role.
OPAQUE: KindRules[Any] = KindRules()
