"""dynlogits: one logits-processor spec, applied the same way on every inference engine.

Kept light on purpose: importing ``dynlogits`` or ``dynlogits.specs`` never imports
torch or an engine. Processors (torch) live in ``dynlogits.processors``; engine
adapters in ``dynlogits.adapters.<engine>``.
"""

__version__ = "0.1.0"
