"""vLLM's own controls beside a payload on the same request: what composes and what is refused.

vLLM's ``thinking_token_budget`` (its ``ThinkingBudgetStateHolder``, fed by ``--reasoning-parser``;
NVIDIA Dynamo maps ``nvext.max_thinking_tokens`` onto it) and a ``thinking_budget`` entry each end a
thinking span on their own count, and vLLM's lifts the end token to ``1e9`` whatever the row holds:
one request never carries both. ``refuse_conflicts`` runs at admission, after the payload's own
checks, and names both (docs/vllm.md, "Engine-native controls")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dynlogits.policy.engine_spec import PAYLOAD_ROOT, admission_config, client_payload_config
from dynlogits.specs import Problem, SpecError

from .request import carried_payload, read_payload

__all__ = ["refuse_conflicts"]


def _thinking_budgets(params: Any) -> Iterable[str]:
    """Where the request's ``thinking_budget`` entries are: its payload's, and, with the engine as the
    spec source, the deployment's (``DYN_LOGITS_SPEC``) that every request runs."""
    raw = read_payload(params)
    if raw is not None:
        payload = carried_payload(raw, client_payload_config().limits)
        if isinstance(payload, list):
            yield from (f"{PAYLOAD_ROOT}[{i}]" for i, e in enumerate(payload)
                        if isinstance(e, dict) and e.get("kind") == "thinking_budget")
    config = admission_config()
    if config is not None and config.spec is not None:
        yield from (f"deployment entries[{i}]" for i, e in enumerate(config.spec.entries) if e.kind == "thinking_budget")


def refuse_conflicts(params: Any) -> None:
    """``SpecError`` naming ``thinking_token_budget`` and the ``thinking_budget`` entry when a request
    sets both (see the module doc); nothing otherwise."""
    if getattr(params, "thinking_token_budget", None) is None:
        return
    for where in _thinking_budgets(params):
        raise SpecError([Problem("thinking_token_budget", f"vLLM's own thinking budget and {where} (thinking_budget) "
                                                          "would both end the request's thinking span, each on its own "
                                                          "count; set one of them")])
