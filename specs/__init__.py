"""``dynlogits.specs``: backend-neutral logits-processor specs and their wire contract.

Pure data: imports pydantic and msgspec, never torch or an engine, so frontends
and config tools can use it without either.
"""

from .entries import (
    ENTRY_KINDS,
    REQUEST_FORBIDDEN_KINDS,
    WIRE_KINDS,
    AllowedTokensSpec,
    BannedTokensSpec,
    Entry,
    ForcedTextSpec,
    ForcedTokenSequenceSpec,
    LogitBiasSpec,
    MinTokensSpec,
    PythonProcessorSpec,
    ThinkingBudgetSpec,
    WireEntry,
)
from .errors import Problem, SpecError
from .kinds import KindError, ProcessorKind, register_kind
from .limits import DEFAULT_LIMITS, SpecLimits
from .spec import LogitsProcessorSpec, parse_entries, parse_spec
from .vocab import check_vocab
from .wire import ARRIVAL_KEY, WIRE_KEY, decode_wire_payload, encode_entries

__all__ = [
    "DEFAULT_LIMITS",
    "ENTRY_KINDS",
    "REQUEST_FORBIDDEN_KINDS",
    "ARRIVAL_KEY",
    "WIRE_KEY",
    "WIRE_KINDS",
    "AllowedTokensSpec",
    "BannedTokensSpec",
    "Entry",
    "KindError",
    "ForcedTextSpec",
    "ForcedTokenSequenceSpec",
    "LogitBiasSpec",
    "LogitsProcessorSpec",
    "MinTokensSpec",
    "Problem",
    "ProcessorKind",
    "PythonProcessorSpec",
    "SpecError",
    "SpecLimits",
    "ThinkingBudgetSpec",
    "WireEntry",
    "check_vocab",
    "decode_wire_payload",
    "encode_entries",
    "parse_entries",
    "parse_spec",
    "register_kind",
]
