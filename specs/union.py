"""The entry unions in force: the built-in models plus every plug-in kind's model.

Without plug-ins these are exactly ``Entry`` and ``WireEntry``, so built-in error
messages, paths and schemas do not depend on this module. With plug-ins each union
is built once per set of plug-in models (cached) and is discriminated by ``kind``
like the built-in one, so a plug-in's bad field is reported the same way
(``logits_processors[0].start: must be an integer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Any, Union

from pydantic import BaseModel, Field, TypeAdapter, ValidatorFunctionWrapHandler

from .entries import ENTRY_KINDS, ENTRY_MODELS, WIRE_MODELS, Entry, WireEntry
from .kinds import ProcessorKind, plugin_kinds

__all__ = ["entry_adapter", "entry_union", "kind_tags", "open_entries", "plugin_models", "sequence_adapter"]

Plugins = Mapping[str, ProcessorKind]


def plugin_models(plugins: Plugins) -> tuple[type[BaseModel], ...]:
    """The plug-ins' entry models in kind order (the cache key of every union below)."""
    return tuple(plugins[k].spec_model for k in sorted(plugins))


def kind_tags(plugins: Plugins) -> frozenset[str]:
    """Every kind name a union may carry: what ``problems_from_pydantic`` strips from paths."""
    return ENTRY_KINDS | frozenset(plugins)


@lru_cache(maxsize=32)
def _union(models: tuple[type[BaseModel], ...], wire: bool) -> Any:
    if not models:
        return WireEntry if wire else Entry
    return Annotated[Union[(*(WIRE_MODELS if wire else ENTRY_MODELS), *models)], Field(discriminator="kind")]


def entry_union(plugins: Plugins, *, wire: bool) -> Any:
    """``Entry`` (or ``WireEntry`` when ``wire``) extended with the plug-ins' models."""
    return _union(plugin_models(plugins), wire)


@lru_cache(maxsize=32)
def _adapter(models: tuple[type[BaseModel], ...], wire: bool, container: type | None, min_length: int) -> TypeAdapter[Any]:
    item = _union(models, wire)
    if container is None:
        return TypeAdapter(item)
    shape: Any = tuple[item, ...] if container is tuple else list[item]  # type: ignore[valid-type]  # a union built at run time
    return TypeAdapter(Annotated[shape, Field(min_length=min_length)] if min_length else shape)


def entry_adapter(plugins: Plugins, *, wire: bool) -> TypeAdapter[Any]:
    """A cached adapter for one entry of the extended union."""
    return _adapter(plugin_models(plugins), wire, None, 0)


def sequence_adapter(plugins: Plugins, *, wire: bool, container: type = list, min_length: int = 0) -> TypeAdapter[Any]:
    """A cached adapter for ``container[union]`` (``list`` or ``tuple``) of at least ``min_length`` entries."""
    return _adapter(plugin_models(plugins), wire, container, min_length)


def open_entries(value: Any, handler: ValidatorFunctionWrapHandler, *, min_length: int) -> Any:
    """Wrap validator of an ``entries: tuple[Entry, ...]`` field that also admits plug-in kinds.

    Without plug-ins it defers to the declared type (``handler``); with them it
    validates against the extended union, and errors keep their locations.
    """
    plugins = plugin_kinds()
    if not plugins:
        return handler(value)
    return sequence_adapter(plugins, wire=False, container=tuple, min_length=min_length).validate_python(value)
