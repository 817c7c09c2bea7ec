"""The shape every backend adapter package shares: four names, the same verbs on every engine.

``dynlogits.adapters.<engine>`` exports (``ADAPTER_NAMES``):

* ``Processor``: the engine-facing class (or callable) the engine loads and calls every step;
* ``activate(target, entries, ...)``: put the gated wire ``entries`` on ``target``, the engine's
  per-request object, and return what the caller hands the engine next (``None``: nothing);
* ``validate(target, *, vocab_size=None, ...)``: admission, ``SpecError`` naming the field unless
  ``target``'s payload would realize;
* ``stop_token(source, vocab_size, ...)``: the token a failed request is ended with.

``target`` is each engine's own carrier; transformers' ``generate()`` has no per-request object, so
its ``activate(entries)`` returns the payload and its ``validate`` takes the batch's payloads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["ADAPTER_NAMES", "AdapterModule"]

#: The names every shipped adapter package exports (checked by ``tests/adapters/test_adapter_surface.py``).
ADAPTER_NAMES = ("Processor", "activate", "validate", "stop_token")


@runtime_checkable
class AdapterModule(Protocol):
    """What ``import dynlogits.adapters.<engine>`` gives (see the module doc)."""

    Processor: Any

    def activate(self, target: Any, entries: Sequence[Any], /, *args: Any, **kwargs: Any) -> Any: ...

    def validate(self, target: Any, /, *args: Any, vocab_size: int | None = None, **kwargs: Any) -> None: ...

    def stop_token(self, source: Any, vocab_size: int, /, *args: Any, **kwargs: Any) -> int | None: ...
