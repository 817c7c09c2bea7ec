"""``EntryLike``: an entry as a model (a built-in's or a plug-in's) or as its wire or request dict,
what the size limits and the prompt bound read. No import of the spec layer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

from pydantic import BaseModel

__all__ = ["EntryLike"]

EntryLike = Union[BaseModel, Mapping[str, Any]]
