"""The resident apply path: built-in kinds kept on the device per persistent request slot.

For engines with persistent slots (vLLM's V1 runner and Model Runner V2): ``SlotBatch``
(``slot_batch``) compiles each resident request into per-slot tables when it enters a slot and runs a
step as a few tensor ops per group; ``flags`` reads failures back without waiting; ``TokenWindow``
(``dynlogits.processors.window``) reads each row's last tokens on the device for engines that keep
histories there. Engines without slots use ``dynlogits.sdk.apply_rows``."""

from dynlogits.processors.device_thinking import DeviceThinking
from dynlogits.processors.window import TokenWindow

from .engine_step import EngineStep, ThinkingDecider
from .slot_batch import SlotBatch

__all__ = ["DeviceThinking", "EngineStep", "SlotBatch", "ThinkingDecider", "TokenWindow"]
