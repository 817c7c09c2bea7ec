"""``forced_text``: force a text; the worker resolves it into a ``forced_sequence`` with its tokenizer,
so it never crosses the wire (no decode twin, no processor, no admission rules of its own)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictStr

from ..entry_base import EntryModel
from ..kinds import ProcessorKind
from .forced_sequence import KIND as RESOLVES_TO

__all__ = ["KIND", "ForcedTextSpec"]


class ForcedTextSpec(EntryModel):
    """Force ``text``: resolved to a ``forced_sequence`` with the worker's tokenizer
    (``add_special_tokens=False``, EOS from the tokenizer) before it crosses the wire."""

    kind: Literal["forced_text"] = "forced_text"
    text: Annotated[StrictStr, Field(min_length=1)]


KIND = ProcessorKind(kind="forced_text", spec_model=ForcedTextSpec, builtin=True, factory=None, wire=False,
                     resolves_to=RESOLVES_TO.kind)
