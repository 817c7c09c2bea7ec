"""``python``: import an operator's factory and call it. It runs code on the worker, so it comes from
operator config only and is realized only for factories the worker allow-lists."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from pydantic import Field, JsonValue, StrictStr

from ..entry_base import EntryModel
from ..fast_base import FastModel
from ..kinds import ProcessorKind
from ..patterns import FACTORY_PATTERN

__all__ = ["KIND", "Python", "PythonProcessorSpec"]


class PythonProcessorSpec(EntryModel):
    """Import ``factory`` (``module.path:Name``) and call it with ``kwargs``.

    Runs code on the worker, so it comes from operator config only: requests that
    carry it are rejected, and engines realize it only for allow-listed factories.
    """

    kind: Literal["python"] = "python"
    factory: Annotated[StrictStr, Field(pattern=FACTORY_PATTERN)]
    kwargs: dict[StrictStr, JsonValue] = Field(default_factory=dict)


class Python(FastModel, tag="python", frozen=True):
    factory: Annotated[str, msgspec.Meta(pattern=FACTORY_PATTERN)]
    kwargs: dict[str, Any] = {}


KIND = ProcessorKind(
    kind="python", spec_model=PythonProcessorSpec, fast_model=Python, builtin=True,
    factory="dynlogits.processors.python:factory",
    admission="dynlogits.specs.admission.python:RULES",
    client_allowed=False, allow_listed=True,
)
