"""Which entries one request activates: deployment spec + request entries, gated by role, and the
deployment's reasoning delimiters (operator ``reasoning:``, else the model's default) first wherever
any entry is activated, unless the request declares its own.

One rule for both spec sources: the worker (``dynlogits.serve.worker``) applies it before a request
reaches the engine, the engine-side spec source (``dynlogits.policy.engine_spec``) inside the engine.

A client can neither switch the deployment's entries off nor escape them (``docs/specs.md``):

* a request without a stop token (``ignore_eos`` and no stop ids) is refused when an entry needs one
  to end it (``needs_stop_token``), the client's own or the deployment's (``stop_token_problem``);
* a request's own delimiters entry (``ProcessorKind.delimiters``) is refused where the deployment has entries that act by the
  phases its delimiters mark (``reasoning_problem``): replacing them would move those phases.
* a request's own keyed entry (``watermark_key``) is refused where the deployment has one
  (``watermark_problem``): the operator's can be neither removed nor replaced; it is moved after the
  request's entries (``deployment_watermark_last``), since it draws from the row they leave.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynlogits.policy.config import DeploymentConfig, declares_delimiters
from dynlogits.policy.hook import test_hook_spec
from dynlogits.policy.roles import DisaggregationMode, is_generation_stage, logits_processors_for_request
from dynlogits.policy.text import TextTokenizer, resolve_entries
from dynlogits.policy.watermark_key import deployment_watermark_last, watermark_problem
from dynlogits.specs import LogitsProcessorSpec, Problem, SpecError, check_vocab, parse_entries
from dynlogits.specs.consistency import check_consistency
from dynlogits.specs.entries import ReasoningSpec, declaration
from dynlogits.specs.entry_base import EntryLike, field_of

__all__ = ["DEPLOYMENT_PATH", "IGNORE_EOS", "RequestPolicy", "build_policy", "has_stop_token", "needs_stop_token",
           "reads_delimiters", "reasoning_problem", "stop_token_problem"]

REQUEST_ROOT = "logits_processors"
#: How the deployment's entries are named in a request's errors (``deployment entries[0]``).
DEPLOYMENT_PATH = "deployment entries"
#: The client's field that leaves a request without its EOS as a stop token.
IGNORE_EOS = "ignore_eos"

_field = field_of


def needs_stop_token(entry: EntryLike) -> bool:
    """Whether ``entry`` realizes only for a request that has a stop token (its factory reads the
    first of ``RealizeContext.stop_token_ids``): what its kind's ``ProcessorKind.needs_stop_token``
    says of it. A model or its wire dict, resolved or not."""
    declared = declaration(_field(entry, "kind"))
    return declared is not None and declared.needs_stop_token is not None and declared.needs_stop_token(entry)


def _stop_token_use(entry: EntryLike) -> str:
    """What ``entry`` (one that ``needs_stop_token``) does with the stop token (its kind's ``stop_token_use``)."""
    declared = declaration(_field(entry, "kind"))
    return declared.stop_token_use if declared is not None else ""


def has_stop_token(*, ignore_eos: bool, stop_token_ids: Sequence[int] | None = ()) -> bool:
    """Whether a request has a stop token its entries can end it with: its EOS unless it ignores
    it, else an explicit stop id (the engine adds no other under ``ignore_eos``)."""
    return not ignore_eos or bool(stop_token_ids)


def stop_token_problem(own: Sequence[EntryLike], deployment: Sequence[EntryLike], *, root: str,
                       deployment_paths: Sequence[str] | None = None) -> Problem | None:
    """For a request without a stop token (``has_stop_token``), the first entry that needs one: the
    client's own named at its path (``root[j]``), else the deployment's under ``ignore_eos`` (the
    client's field that removed it), naming the entry. ``None`` when no entry needs one."""
    ending = "a request with ignore_eos: true and no stop_token_ids has none"
    for j, entry in enumerate(own):
        if needs_stop_token(entry):
            kind = _field(entry, "kind")
            return Problem(f"{root}[{j}]", f"{kind} {_stop_token_use(entry)}, and {ending}: send the request without "
                                           f"{IGNORE_EOS} or without this entry")
    for i, entry in enumerate(deployment):
        if needs_stop_token(entry):
            kind = _field(entry, "kind")
            path = deployment_paths[i] if deployment_paths is not None else f"{DEPLOYMENT_PATH}[{i}]"
            return Problem(IGNORE_EOS, f"{path} ({kind}) {_stop_token_use(entry)}, and {ending}: the deployment's "
                                       f"entries cannot be switched off; send the request without {IGNORE_EOS}")
    return None


def reads_delimiters(entry: EntryLike) -> bool:
    """Whether ``entry`` acts by the phases the reasoning delimiters mark: a ``scope`` other than
    ``always``, or what its kind's ``ProcessorKind.reads_delimiters`` says of it (e.g. a budget
    without delimiters of its own)."""
    if _field(entry, "scope", "always") != "always":
        return True
    declared = declaration(_field(entry, "kind"))
    return declared is not None and declared.reads_delimiters is not None and declared.reads_delimiters(entry)


def reasoning_problem(own: Sequence[EntryLike], deployment: Sequence[EntryLike], *, root: str,
                      deployment_paths: Sequence[str] | None = None) -> Problem | None:
    """The client's own delimiters entry (named at ``root[j]``) where a deployment entry reads the
    delimiters (``reads_delimiters``): a request's delimiters replace the deployment's, so they would
    move the phases the deployment's scoped entries act in. ``None`` otherwise."""
    j = next((j for j, e in enumerate(own) if declares_delimiters(e)), None)
    if j is None:
        return None
    i = next((i for i, e in enumerate(deployment) if reads_delimiters(e)), None)
    if i is None:
        return None
    entry = deployment[i]
    path = deployment_paths[i] if deployment_paths is not None else f"{DEPLOYMENT_PATH}[{i}]"
    scope = _field(entry, "scope", "always")
    how = f"scope {scope}" if scope != "always" else "on the deployment's delimiters"
    return Problem(f"{root}[{j}]", f"a request's reasoning entry would replace the deployment's reasoning delimiters, "
                                   f"which {path} ({_field(entry, 'kind')}, {how}) acts by; send the request without this entry "
                                   f"(the deployment's delimiters apply to it)")


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

    def entries_for(self, request_entries: Sequence[Any] | None, *, root: str = REQUEST_ROOT, ignore_eos: bool = False,
                    stop_token_ids: Sequence[int] | None = ()) -> list[Any]:
        """Wire entries for one request; ``SpecError`` (paths under ``root``) if invalid.

        The request's entries are validated again here (never trust the caller),
        even on roles that will not run them, so a bad request fails the same way everywhere.
        ``ignore_eos`` and ``stop_token_ids`` are the request's: without a stop token
        (``has_stop_token``) an entry that needs one is refused, the deployment's included
        (``stop_token_problem``). A request's own delimiters entry replaces the deployment's
        delimiters, unless a deployment entry acts by them (``reasoning_problem``: refused).
        Every limit is checked before any consistency walk runs.
        """
        requested: tuple[Any, ...] = ()
        if request_entries:
            requested = parse_entries(list(request_entries), root=root, limits=self.config.limits,
                                      allowed_kinds=sorted(self.config.allow_request_kinds))
        entries = logits_processors_for_request(self.deployment, disaggregation_mode=self.role)
        resolved: tuple[Any, ...] = ()
        if requested and self.generates:
            resolved = resolve_entries(requested, self.tokenizer, root=root, limits=self.config.limits)
            check_vocab(resolved, self.vocab_size, root=root)
        if self.generates and not has_stop_token(ignore_eos=ignore_eos, stop_token_ids=stop_token_ids):
            problem = stop_token_problem(resolved, entries, root=root)
            if problem is not None:
                raise SpecError([problem])
        if resolved:
            problem = reasoning_problem(resolved, entries, root=root) or watermark_problem(resolved, entries, root=root)
            if problem is not None:
                raise SpecError([problem])
            paths = [f"{DEPLOYMENT_PATH}[{i}]" for i in range(len(entries))]
            if any(declares_delimiters(e) for e in resolved):  # the request's own delimiters replace the deployment's
                kept = [i for i, e in enumerate(entries) if not declares_delimiters(e)]
                entries, paths = [entries[i] for i in kept], [paths[i] for i in kept]
            paths += [f"{root}[{j}]" for j in range(len(resolved))]
            deployment = len(entries)
            entries += logits_processors_for_request(LogitsProcessorSpec(entries=resolved),
                                                     disaggregation_mode=self.role)
            # the deployment's keyed entry draws from the row every other entry leaves: it stays last
            entries, paths = deployment_watermark_last(entries, paths, deployment=deployment)
            entries, paths = self._with_reasoning(entries, paths)
            # the request's entries must not contradict the deployment's (e.g. force a token it bans)
            check_consistency(entries, paths=paths, vocab_size=self.vocab_size, limits=self.config.limits)
            return entries
        return self._with_reasoning(entries, [])[0]

    def _with_reasoning(self, entries: list[Any], paths: list[str]) -> tuple[list[Any], list[str]]:
        """``entries`` led by the deployment's reasoning entry, where they activate something and
        declare no delimiters of their own."""
        if self.reasoning is None or not entries or any(declares_delimiters(e) for e in entries):
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
        if reasoning is not None and not any(declares_delimiters(e) for e in resolved):
            check_consistency([reasoning, *resolved], paths=["reasoning", *paths], vocab_size=vocab_size,
                              limits=config.limits)
        else:
            check_consistency(resolved, paths=paths, vocab_size=vocab_size, limits=config.limits)
        entries += resolved
        generation_only = config.spec.generation_only
    hook = test_hook_spec(tokenizer, disaggregation_mode=role, environ=environ)
    if hook is not None:
        entries += hook.entries
    deployment = LogitsProcessorSpec(entries=tuple(entries), generation_only=generation_only) if entries else None
    return RequestPolicy(role=role, deployment=deployment, config=config, tokenizer=tokenizer(), vocab_size=vocab_size,
                         reasoning=reasoning)
