"""The resident apply path: built-in kinds kept on the device per persistent request slot.

For engines that keep requests in persistent slots (vLLM's V1 runner and Model Runner V2):
``SlotBatch`` compiles each resident request into per-slot device tables when it enters a slot
and runs a step as a few tensor ops per group of entries (``slot_batch``; each kind's group lives
in its module under ``dynlogits.processors``); ``flags`` reads failures back without waiting.
``DeviceThinking`` (``dynlogits.processors.thinking_budget``) follows ``thinking_budget`` spans on
the device where only the device has the tokens (Model Runner V2). Engines without slots use
``dynlogits.sdk.apply_rows`` instead.
"""

from dynlogits.processors.thinking_budget import DeviceThinking

from .slot_batch import SlotBatch, ThinkingDecider

__all__ = ["DeviceThinking", "SlotBatch", "ThinkingDecider"]
