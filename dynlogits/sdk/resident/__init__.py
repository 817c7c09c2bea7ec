"""The resident apply path: built-in kinds kept on the device per persistent request slot.

For engines that keep requests in persistent slots (vLLM's V1 runner and Model Runner V2):
``SlotBatch`` compiles each resident request into per-slot device tables when it enters a slot
and runs a step as a few tensor ops per group of entries; ``DeviceThinking`` follows
``thinking_budget`` spans on the device where only the device has the tokens (Model Runner V2).
The modules below are internals of these two: ``slot_groups`` (one group type per entry kind),
``staging`` (host-to-device tables and uploads without blocking), ``thinking``.
Engines without slots use ``dynlogits.sdk.apply_rows`` instead.
"""

from .slot_batch import SlotBatch, ThinkingDecider
from .thinking import DeviceThinking

__all__ = ["DeviceThinking", "SlotBatch", "ThinkingDecider"]
