"""``DYN_ENABLE_TEST_LOGITS_PROCESSOR=1``: force "Hello world!" on generating workers."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from dynlogits.policy.roles import DisaggregationMode, is_generation_stage
from dynlogits.policy.text import TextTokenizer, resolve_forced_text
from dynlogits.specs import LogitsProcessorSpec

__all__ = ["TEST_HOOK_ENV", "TEST_HOOK_TEXT", "test_hook_enabled", "test_hook_spec"]

TEST_HOOK_ENV = "DYN_ENABLE_TEST_LOGITS_PROCESSOR"
TEST_HOOK_TEXT = "Hello world!"


def test_hook_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """On only when the variable is exactly ``"1"``."""
    return environ.get(TEST_HOOK_ENV) == "1"


def test_hook_spec(
    tokenizer: Callable[[], TextTokenizer],
    *,
    disaggregation_mode: DisaggregationMode,
    environ: Mapping[str, str] = os.environ,
) -> LogitsProcessorSpec | None:
    """The hook's spec, resolved once with the worker's tokenizer, or ``None``.

    ``tokenizer`` is called only when the hook is on and the role generates, so
    workers that never use the hook never load a tokenizer for it.
    """
    if not test_hook_enabled(environ) or not is_generation_stage(disaggregation_mode):
        return None
    forced = resolve_forced_text(TEST_HOOK_TEXT, tokenizer(), path=TEST_HOOK_ENV)
    return LogitsProcessorSpec(entries=(forced,))


# pytest would otherwise collect ``test_hook_*`` functions imported into test modules.
test_hook_enabled.__test__ = False  # type: ignore[attr-defined]  # tells pytest this is no test
test_hook_spec.__test__ = False  # type: ignore[attr-defined]  # as above
