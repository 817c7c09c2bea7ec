"""The resident apply path: built-in kinds kept on the device per persistent request slot.

For engines with persistent slots (vLLM's V1 runner and Model Runner V2): ``SlotBatch``
(``slot_batch``: occupancy and the step) compiles each resident request into per-slot tables when it
enters a slot and runs a step as a few tensor ops per group, in one of two layouts (``listed``,
``gathered``); ``deciding`` decides the decided groups' rows; ``failures`` and ``flags`` fail-stop
and read failures back without waiting; ``EngineStep`` (``engine_step``) is what the engine gives a
step. ``TokenWindow`` (``dynlogits.processors.window``) reads each row's last tokens and
``DeviceThinking`` (``dynlogits.processors.device_thinking``) follows spans on the device for
engines that keep histories there. Engines without slots use ``dynlogits.sdk.apply_rows``."""

from dynlogits.processors.device_thinking import DeviceThinking
from dynlogits.processors.window import TokenWindow

from .engine_step import EngineStep, ThinkingDecider
from .slot_batch import SlotBatch

__all__ = ["DeviceThinking", "EngineStep", "SlotBatch", "ThinkingDecider", "TokenWindow"]
