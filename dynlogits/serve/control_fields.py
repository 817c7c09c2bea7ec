"""The OpenAI/vLLM request fields that become logits-processor entries: :data:`CONTROLS`, the one table.

Each row names a request field (OpenAI's ``logit_bias``, vLLM's ``allowed_token_ids`` and
``bad_words``, TensorRT-LLM's ``no_repeat_ngram_size``), the kind it maps onto, the entry field its value becomes and whether an empty value
asks for nothing. Everything else is read from it: the mapping and the error paths
(``dynlogits.serve.openai_controls``), the fields of the frontend's OpenAI body
(:class:`ClientControls`) and of the worker's request (:class:`ForwardedControls`), which this
module checks against the table when it is imported, and which bodies carry entries
(``frontend.pacing``). The table is documented in ``docs/deployment.md``. Pydantic only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, StrictStr

__all__ = ["CONTROLS", "CONTROL_FIELDS", "ClientControls", "ControlField", "ForwardedControls"]


@dataclass(frozen=True)
class ControlField:
    """One request field that maps onto a kind: ``{"kind": kind, value_field: <the field's value>}``."""

    #: The request field.
    name: str
    #: The kind its value becomes.
    kind: str
    #: The entry field holding the value (an error under it is renamed to the request field's path).
    value_field: str
    #: Whether ``{}`` / ``[]`` ask for nothing (else the empty value goes to the kind, which refuses it).
    empty_asks_nothing: bool = True
    #: Whether the value is a list of words, checked against the spec limits before any tokenizing.
    words: bool = False
    #: Whether ``0`` asks for nothing (``dry_multiplier``: 0 is DRY off, the engines' default).
    zero_is_off: bool = False
    #: The request field whose entry this one's value joins (the ``dry_*`` fields join ``dry_multiplier``'s
    #: one ``dry`` entry); it asks for nothing while that field does not. ``None``: an entry of its own.
    joins: str | None = None


#: The request fields mapped onto kinds, in the order their entries follow the client's own.
CONTROLS: tuple[ControlField, ...] = (
    ControlField("logit_bias", kind="logit_bias", value_field="bias"),
    ControlField("allowed_token_ids", kind="allowed_tokens", value_field="token_ids", empty_asks_nothing=False),
    ControlField("bad_words", kind="banned_phrases", value_field="texts", words=True),
    ControlField("no_repeat_ngram_size", kind="no_repeat_ngram", value_field="size"),  # TensorRT-LLM's
    # vLLM's open DRY pull request (#50584), llama.cpp's names: one ``dry`` entry
    ControlField("dry_multiplier", kind="dry", value_field="multiplier", zero_is_off=True),
    ControlField("dry_base", kind="dry", value_field="base", joins="dry_multiplier"),
    ControlField("dry_allowed_length", kind="dry", value_field="allowed_length", joins="dry_multiplier"),
    ControlField("dry_sequence_breakers", kind="dry", value_field="sequence_breakers", empty_asks_nothing=False,
                 joins="dry_multiplier"),
    ControlField("dry_penalty_last_n", kind="dry", value_field="penalty_last_n", joins="dry_multiplier"),
)
#: Request field -> the kind it maps onto.
CONTROL_FIELDS: dict[str, str] = {c.name: c.kind for c in CONTROLS}


class ClientControls(BaseModel):
    """The control fields of a client's OpenAI body, raw as sent: their checks are the kinds', run by
    ``openai_controls.with_controls`` and the entries' parse, so every error names the field."""

    logit_bias: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    no_repeat_ngram_size: Any = None
    dry_multiplier: Any = None
    dry_base: Any = None
    dry_allowed_length: Any = None
    dry_sequence_breakers: Any = None
    dry_penalty_last_n: Any = None

    def controls(self) -> dict[str, Any]:
        """Each control field's value as sent (``None``: not sent)."""
        return {c.name: getattr(self, c.name) for c in CONTROLS}


class ForwardedControls(BaseModel):
    """The control fields of a worker ``/generate`` request (as the client sent them to the frontend),
    each of its JSON shape; the worker maps them onto kinds itself."""

    logit_bias: dict[StrictStr, Any] | None = None
    allowed_token_ids: list[Any] | None = None
    bad_words: list[Any] | None = None
    no_repeat_ngram_size: Any = None
    dry_multiplier: Any = None
    dry_base: Any = None
    dry_allowed_length: Any = None
    dry_sequence_breakers: Any = None
    dry_penalty_last_n: Any = None

    def controls(self) -> dict[str, Any]:
        """Each control field's value as sent (``None``: not sent)."""
        return {c.name: getattr(self, c.name) for c in CONTROLS}


def _declares_the_table(model: type[BaseModel]) -> None:
    """``TypeError`` unless ``model``'s fields are exactly the table's request fields."""
    if set(model.model_fields) != set(CONTROL_FIELDS):
        raise TypeError(f"{model.__name__} declares {sorted(model.model_fields)}; the control table has "
                        f"{sorted(CONTROL_FIELDS)}")


_declares_the_table(ClientControls)
_declares_the_table(ForwardedControls)
