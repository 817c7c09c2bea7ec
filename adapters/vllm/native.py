"""vLLM's own controls beside a payload on the same request: what composes and what is refused.

A kind declares the engine sampling parameters one request may not set beside its entries
(``ProcessorKind.conflicts_with``): e.g. vLLM's ``thinking_token_budget`` (its
``ThinkingBudgetStateHolder``, fed by ``--reasoning-parser``; NVIDIA Dynamo maps
``nvext.max_thinking_tokens`` onto it) and a thinking-budget entry each end a thinking span on their
own count, and vLLM's lifts the end token to ``1e9`` whatever the row holds: one request never
carries both. ``refuse_conflicts`` runs at admission, after the payload's own checks, and names both
(docs/vllm.md, "Engine-native controls")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dynlogits.policy.engine_spec import PAYLOAD_ROOT, admission_config, client_payload_config
from dynlogits.specs import Problem, SpecError
from dynlogits.specs.entries import declaration

from .request import carried_payload, read_payload

__all__ = ["NATIVE_CONTROLS", "refuse_conflicts"]

#: vLLM's sampling parameters a kind may declare a conflict with -> (what the parameter is, why the
#: two cannot share a request), for the message.
NATIVE_CONTROLS: dict[str, tuple[str, str]] = {
    "thinking_token_budget": ("vLLM's own thinking budget",
                              "would both end the request's thinking span, each on its own count; set one of them"),
    **{penalty: (f"vLLM's {penalty.replace('_', ' ')}",
                 "cannot compose: the entry draws the sampled token itself, and vLLM's V1 runner applies penalties "
                 "after the request's processors (to the row the entry already forced); set one of them")
       for penalty in ("repetition_penalty", "frequency_penalty", "presence_penalty")},
}
#: A parameter's value that means "off" where it is not ``None`` (vLLM's defaults).
_OFF: dict[str, float] = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}


def _conflicts(kind: Any, param: str) -> bool:
    """Whether entries of ``kind`` may not share a request with the engine parameter ``param``."""
    declared = declaration(kind)
    return declared is not None and param in declared.conflicts_with


def _conflicting(params: Any, param: str) -> Iterable[tuple[str, str]]:
    """``(where, kind)`` of the request's entries that conflict with ``param``: its payload's, and,
    with the engine as the spec source, the deployment's (``DYN_LOGITS_SPEC``) that every request runs."""
    raw = read_payload(params)
    if raw is not None:
        payload = carried_payload(raw, client_payload_config().limits)
        if isinstance(payload, list):
            yield from ((f"{PAYLOAD_ROOT}[{i}]", e["kind"]) for i, e in enumerate(payload)
                        if isinstance(e, dict) and _conflicts(e.get("kind"), param))
    config = admission_config()
    if config is not None and config.spec is not None:
        yield from ((f"deployment entries[{i}]", e.kind) for i, e in enumerate(config.spec.entries)
                    if _conflicts(e.kind, param))


def refuse_conflicts(params: Any) -> None:
    """``SpecError`` naming the engine parameter and the entry when a request sets both (see the
    module doc); nothing otherwise."""
    for param, (what, why) in NATIVE_CONTROLS.items():
        value = getattr(params, param, None)
        if value is None or (param in _OFF and value == _OFF[param]):
            continue
        for where, kind in _conflicting(params, param):
            raise SpecError([Problem(param, f"{what} and {where} ({kind}) {why}")])
