"""``deadline``: force the request's stop token once ``seconds`` have passed since it arrived."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from pydantic import Field, StrictFloat

from ..entry_base import EntryLike, EntryModel
from ..fast_base import FastModel
from ..kinds import ProcessorKind

__all__ = ["KIND", "MAX_DEADLINE_SECONDS", "Deadline", "DeadlineSpec"]

#: A ``deadline`` entry's longest wait: a day.
MAX_DEADLINE_SECONDS = 86_400.0


class DeadlineSpec(EntryModel):
    """``seconds`` after the request arrived, its stop token is forced."""

    kind: Literal["deadline"] = "deadline"
    seconds: Annotated[StrictFloat, Field(gt=0, le=MAX_DEADLINE_SECONDS, allow_inf_nan=False)]


class Deadline(FastModel, tag="deadline", frozen=True):
    seconds: Annotated[float, msgspec.Meta(gt=0, le=MAX_DEADLINE_SECONDS)]


def _always(entry: EntryLike) -> bool:
    return True


KIND = ProcessorKind(
    kind="deadline", spec_model=DeadlineSpec, fast_model=Deadline, builtin=True,
    factory="dynlogits.processors.deadline:factory",
    admission="dynlogits.specs.admission.deadline:RULES",
    needs_stop_token=_always, stop_token_use="forces the request's stop token when it is due",
)
