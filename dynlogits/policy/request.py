"""Which entries one request activates: deployment spec + request entries, gated by role, and the
deployment's reasoning delimiters (operator ``reasoning:``, else the model's default) first wherever
any entry is activated, unless the request declares its own.

One rule for both spec sources: the worker (``dynlogits.serve.worker``) applies it before a request
reaches the engine, the engine-side spec source (``dynlogits.policy.engine_spec``) inside the engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynlogits.policy.config import DeploymentConfig
from dynlogits.policy.roles import DisaggregationMode, is_generation_stage, logits_processors_for_request
from dynlogits.specs import LogitsProcessorSpec, check_vocab, parse_entries
from dynlogits.specs.entries import ReasoningSpec
from dynlogits.specs.consistency import check_consistency
from dynlogits.policy.hook import test_hook_spec
from dynlogits.policy.text import TextTokenizer, resolve_entries

__all__ = ["RequestPolicy", "build_policy"]

REQUEST_ROOT = "logits_processors"


@dataclass(frozen=True)
class RequestPolicy:
    """The worker's rule for turning a request into wire entries.

    ``deployment`` holds the operator's and the test hook's entries, already
    resolved to wire entries; ``allow_request_kinds`` and ``limits`` bound what a
    client may add. ``vocab_size`` is the logits width every id is checked against.
    ``reasoning``: the deployment's reasoning delimiters as a wire entry, or ``None``.
    """

    role: DisaggregationMode
    deployment: LogitsProcessorSpec | None
    config: DeploymentConfig
    tokenizer: TextTokenizer
    vocab_size: int
    reasoning: ReasoningSpec | None = None

    @property
    def generates(self) -> bool:
        return is_generation_stage(self.role)

    def entries_for(self, request_entries: Sequence[Any] | None, *, root: str = REQUEST_ROOT) -> list[Any]:
        """Wire entries for one request; ``SpecError`` (paths under ``root``) if invalid.

        The request's entries are validated again here (never trust the caller),
        even on roles that will not run them, so a bad request fails the same way everywhere.
        """
        requested: tuple[Any, ...] = ()
        if request_entries:
            requested = parse_entries(list(request_entries), root=root, limits=self.config.limits,
                                      allowed_kinds=sorted(self.config.allow_request_kinds))
        entries = logits_processors_for_request(self.deployment, disaggregation_mode=self.role)
        if requested and self.generates:
            resolved = resolve_entries(requested, self.tokenizer, root=root, limits=self.config.limits)
            check_vocab(resolved, self.vocab_size, root=root)
            paths = [f"deployment entries[{i}]" for i in range(len(entries))]
            if any(e.kind == "reasoning" for e in resolved):  # the request's own delimiters replace the deployment's
                kept = [i for i, e in enumerate(entries) if e.kind != "reasoning"]
                entries, paths = [entries[i] for i in kept], [paths[i] for i in kept]
            paths += [f"{root}[{j}]" for j in range(len(resolved))]
            entries += logits_processors_for_request(LogitsProcessorSpec(entries=resolved),
                                                     disaggregation_mode=self.role)
            entries, paths = self._with_reasoning(entries, paths)
            # the request's entries must not contradict the deployment's (e.g. force a token it bans)
            check_consistency(entries, paths=paths, vocab_size=self.vocab_size)
            return entries
        return self._with_reasoning(entries, [])[0]

    def _with_reasoning(self, entries: list[Any], paths: list[str]) -> tuple[list[Any], list[str]]:
        """``entries`` led by the deployment's reasoning entry, where they activate something and
        declare no delimiters of their own."""
        if self.reasoning is None or not entries or any(e.kind == "reasoning" for e in entries):
            return entries, paths
        return [self.reasoning, *entries], ["deployment reasoning", *paths]


def build_policy(role: DisaggregationMode, config: DeploymentConfig,
                 tokenizer: Callable[[], TextTokenizer], vocab_size: int,
                 environ: Mapping[str, str] = os.environ, *, default_reasoning: ReasoningSpec | None = None) -> RequestPolicy:
    """Resolve the operator's spec, its reasoning delimiters (``reasoning:``, else
    ``default_reasoning``: the model's) and the test hook (``DYN_ENABLE_TEST_LOGITS_PROCESSOR``) once."""
    entries: list[Any] = []
    generation_only = True
    reasoning = config.reasoning if config.reasoning is not None else default_reasoning
    if reasoning is not None:
        (reasoning,) = resolve_entries([reasoning], tokenizer(), root="reasoning", limits=config.limits)
        check_vocab([reasoning], vocab_size, root="reasoning")
    if config.spec is not None:
        resolved = resolve_entries(config.spec.entries, tokenizer(), root="entries", limits=config.limits)
        check_vocab(resolved, vocab_size, root="entries")
        paths = [f"entries[{i}]" for i in range(len(resolved))]
        if reasoning is not None and not any(e.kind == "reasoning" for e in resolved):
            check_consistency([reasoning, *resolved], paths=["reasoning", *paths], vocab_size=vocab_size)
        else:
            check_consistency(resolved, paths=paths, vocab_size=vocab_size)
        entries += resolved
        generation_only = config.spec.generation_only
    hook = test_hook_spec(tokenizer, disaggregation_mode=role, environ=environ)
    if hook is not None:
        entries += hook.entries
    deployment = LogitsProcessorSpec(entries=tuple(entries), generation_only=generation_only) if entries else None
    return RequestPolicy(role=role, deployment=deployment, config=config, tokenizer=tokenizer(), vocab_size=vocab_size,
                         reasoning=reasoning)
