"""Re-export for the import path the README shows users; the implementation is
``dynlogits.sdk.activation.activate_logits_processors`` (the SDK's activate duty)."""

from dynlogits.sdk.activation import activate_logits_processors

__all__ = ["activate_logits_processors"]
