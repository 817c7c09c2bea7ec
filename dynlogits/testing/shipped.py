"""The adapters this project ships, by the short name ``dynlogits conformance NAME`` takes.

The one list of them: the kit resolves the names (``runner.resolve``) and the command's help prints
them. Torch-free, so the ``dynlogits`` command builds its help without loading an engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["SHIPPED"]

#: Short names of the adapters this project ships, and their driver factories, in the order the
#: command lists them.
SHIPPED: Mapping[str, str] = MappingProxyType({
    "vllm": "dynlogits.adapters.vllm.conformance:drivers",
    "transformers": "dynlogits.adapters.transformers.conformance:drivers",
    "sglang": "dynlogits.adapters.sglang.conformance:drivers",
    "trtllm": "dynlogits.adapters.trtllm.conformance:drivers",
})
