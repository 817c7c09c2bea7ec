"""Plug-in kinds the conformance kit ships, to run a third-party kind through every adapter.

Each is a real ``ProcessorKind`` (factory as an import string), registered in this process only
while a check runs (``registered``):

* ``kit.raise_after`` (``after``): its processor raises once ``after`` tokens were generated;
* ``kit.keep_only`` (``token_ids``): masks every other id of its row, an opaque restriction;
* ``kit.ban_beyond`` (``beyond``): bans an id past the logits width as a row operation, with no id
  in its spec for admission to check;
* ``kit.facts`` (``tag``): records the ``RealizeContext`` its factory was given under ``tag``
  (``plugin_factories.recording``) and keeps only its prompt's and stop ids' logits."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeInt, StrictStr

from dynlogits.specs.kinds import ProcessorKind, kinds_registered

__all__ = ["BAN_BEYOND", "FACTS", "KEEP_ONLY", "KIT_KINDS", "RAISE_AFTER", "registered"]


class RaiseAfterSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["kit.raise_after"] = "kit.raise_after"
    after: NonNegativeInt = 1


class KeepOnlySpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["kit.keep_only"] = "kit.keep_only"
    token_ids: tuple[NonNegativeInt, ...]


class BanBeyondSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["kit.ban_beyond"] = "kit.ban_beyond"
    beyond: NonNegativeInt = 0


class FactsSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["kit.facts"] = "kit.facts"
    tag: StrictStr


RAISE_AFTER = ProcessorKind("kit.raise_after", RaiseAfterSpec, "dynlogits.testing.plugin_factories:raise_after")
KEEP_ONLY = ProcessorKind("kit.keep_only", KeepOnlySpec, "dynlogits.testing.plugin_factories:keep_only")
BAN_BEYOND = ProcessorKind("kit.ban_beyond", BanBeyondSpec, "dynlogits.testing.plugin_factories:ban_beyond")
FACTS = ProcessorKind("kit.facts", FactsSpec, "dynlogits.testing.plugin_factories:facts")
KIT_KINDS = (RAISE_AFTER, KEEP_ONLY, BAN_BEYOND, FACTS)


def registered() -> AbstractContextManager[None]:
    """The kit's kinds exist in this process (``register_kind``) for the duration of the block."""
    return kinds_registered(*KIT_KINDS)
