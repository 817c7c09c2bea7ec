"""Operator configuration: a YAML or JSON file with the deployment's spec and request policy.

```yaml
entries: [...]                # the deployment spec (optional; may be empty): entries as docs/specs.md lists them
generation_only: true
allow_request_kinds: [...]    # the kinds clients may ask for per request
limits: {max_entries: 8}      # tighten the default bounds
reasoning: {start_text: "<think>", end_text: "</think>"}   # the model's reasoning delimiters
```
``reasoning:`` (text or token ids, the fields of the entry kind that declares delimiters) joins every
request that activates entries; a request's own delimiters entry replaces it. Without it, a model folder's own default
(``model_reasoning``, given by the worker as ``default_reasoning``) applies.
Found via ``--logits-spec FILE`` or ``DYN_LOGITS_SPEC=FILE``. Installed plug-in kinds
(``dynlogits.specs.kinds``) may appear in ``entries`` and ``allow_request_kinds`` like
built-in ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from dynlogits.specs import (
    DEFAULT_LIMITS,
    ENTRY_KINDS,
    REQUEST_FORBIDDEN_KINDS,
    Entry,
    LogitsProcessorSpec,
    Problem,
    SpecError,
    SpecLimits,
)
from dynlogits.specs.entries import DELIMITER_KINDS, ReasoningSpec
from dynlogits.specs.entry_base import EntryLike
from dynlogits.specs.errors import problems_from_pydantic
from dynlogits.specs.kinds import plugin_kinds
from dynlogits.specs.limits import limit_problems
from dynlogits.specs.union import kind_tags, open_entries

from .watermark_key import resolve_key_sources

__all__ = ["SPEC_FILE_ENV", "DeploymentConfig", "config_from_sources", "load_config", "load_deployment_config", "parse_config",
           "declares_delimiters", "parse_reasoning", "split_kinds"]

SPEC_FILE_ENV = "DYN_LOGITS_SPEC"


class _LimitsModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_entries: StrictInt = Field(default=DEFAULT_LIMITS.max_entries, ge=1)
    max_token_ids: StrictInt = Field(default=DEFAULT_LIMITS.max_token_ids, ge=1)
    max_text_chars: StrictInt = Field(default=DEFAULT_LIMITS.max_text_chars, ge=1)
    max_bias_entries: StrictInt = Field(default=DEFAULT_LIMITS.max_bias_entries, ge=1)
    max_budget: StrictInt = Field(default=DEFAULT_LIMITS.max_budget, ge=1)
    max_phrases: StrictInt = Field(default=DEFAULT_LIMITS.max_phrases, ge=1)
    max_phrase_tokens: StrictInt = Field(default=DEFAULT_LIMITS.max_phrase_tokens, ge=1)
    max_prompt_tokens: StrictInt = Field(default=DEFAULT_LIMITS.max_prompt_tokens, ge=1)
    max_admission_work: StrictInt = Field(default=DEFAULT_LIMITS.max_admission_work, ge=1)


class _ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    entries: tuple[Entry, ...] = ()
    generation_only: StrictBool = True
    allow_request_kinds: tuple[StrictStr, ...] = ()
    limits: _LimitsModel = _LimitsModel()
    reasoning: Any = None  # a reasoning entry's fields, checked by ``parse_reasoning`` (paths named "reasoning")

    @field_validator("entries", mode="wrap")
    @classmethod
    def _admit_plugin_kinds(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return open_entries(value, handler, min_length=0)


@dataclass(frozen=True)
class DeploymentConfig:
    """What a worker/frontend needs from the operator: spec, request policy, limits."""

    spec: LogitsProcessorSpec | None = None
    allow_request_kinds: frozenset[str] = frozenset()
    limits: SpecLimits = field(default=DEFAULT_LIMITS)
    #: the deployment's reasoning delimiters (``reasoning:``), still as text where given as text
    reasoning: ReasoningSpec | None = None

    @property
    def active(self) -> bool:
        """Whether any source can activate processors (adapter registration needs this)."""
        return self.spec is not None or bool(self.allow_request_kinds)

    def __repr__(self) -> str:
        """The entries' kinds, never their fields: an operator's entry may hold a secret (a key, ``watermark_key``)."""
        kinds = [e.kind for e in self.spec.entries] if self.spec is not None else None
        return (f"DeploymentConfig(kinds={kinds!r}, allow_request_kinds={sorted(self.allow_request_kinds)!r}, "
                f"limits={self.limits!r}, reasoning={self.reasoning!r})")


def parse_config(data: Any, *, source: str = "config", environ: Mapping[str, str] | None = None,
                 base_dir: Path | None = None) -> DeploymentConfig:
    """Validate a loaded document; ``SpecError`` whose paths name the bad fields.

    Plug-in kinds in force count as known kinds (a broken plug-in raises its ``KindError``).
    An entry's ``key_env`` / ``key_file`` (a keyed kind's secret) are read first, from ``environ``
    (default: the process's) and ``base_dir`` (a relative file's folder): ``dynlogits.policy.watermark_key``.
    """
    plugins = plugin_kinds()
    if isinstance(data, Mapping) and "entries" in data:  # the operator's keys, read at start-up
        entries, key_problems = resolve_key_sources(data["entries"], environ=environ, base_dir=base_dir)
        if key_problems:
            raise SpecError(key_problems)
        data = {**data, "entries": entries}
    try:
        model = _ConfigModel.model_validate(data)
    except ValidationError as err:
        raise SpecError(problems_from_pydantic(err.errors(), root="", tags=kind_tags(plugins))) from None
    limits = SpecLimits(**model.limits.model_dump())
    problems = list(limit_problems(model.entries, limits, root="entries"))
    forbidden = REQUEST_FORBIDDEN_KINDS | {name for name, kind in plugins.items() if not kind.client_allowed}
    allowable = (ENTRY_KINDS | frozenset(plugins)) - forbidden
    for i, kind in enumerate(model.allow_request_kinds):
        if kind in forbidden:
            problems.append(Problem(f"allow_request_kinds[{i}]", f"kind {kind!r} runs code on workers and may never be allowed in requests"))
        elif kind not in allowable:
            problems.append(Problem(f"allow_request_kinds[{i}]", f"unknown kind {kind!r} (expected one of {sorted(allowable)})"))
    reasoning = None
    if model.reasoning is not None:
        try:
            reasoning = parse_reasoning(model.reasoning, source="reasoning")
        except SpecError as err:
            problems += err.problems
        if any(declares_delimiters(e) for e in model.entries):
            problems.append(Problem("reasoning", "the entries declare reasoning delimiters already; give reasoning: or a "
                                                 "reasoning entry, not both"))
    if problems:
        raise SpecError(problems)
    spec = LogitsProcessorSpec(entries=model.entries, generation_only=model.generation_only) if model.entries else None
    return DeploymentConfig(spec=spec, allow_request_kinds=frozenset(model.allow_request_kinds), limits=limits,
                            reasoning=reasoning)


def declares_delimiters(entry: EntryLike) -> bool:
    """Whether ``entry`` (a model or its wire dict) declares the request's reasoning delimiters
    (its built-in kind's ``ProcessorKind.delimiters``)."""
    return (entry.get("kind") if isinstance(entry, Mapping) else getattr(entry, "kind", None)) in DELIMITER_KINDS


def parse_reasoning(data: Any, *, source: str) -> ReasoningSpec:
    """Reasoning delimiters given as a ``reasoning`` entry's fields (``start_text``/``end_text`` or
    ``start_token_ids``/``end_token_ids``, e.g. a model folder's default); ``SpecError`` naming
    ``source`` and the field."""
    if not isinstance(data, Mapping):
        raise SpecError.single(source, f"must be an object with the delimiters (start_text and end_text, or "
                                       f"start_token_ids and end_token_ids), got {type(data).__name__}")
    try:
        return ReasoningSpec.model_validate({**data, "kind": ReasoningSpec.model_fields["kind"].default})
    except ValidationError as err:
        raise SpecError(problems_from_pydantic(err.errors(), root=source, tags=frozenset())) from None


def load_config(path: str | os.PathLike[str]) -> DeploymentConfig:
    """Read and validate a ``.yaml``/``.yml``/``.json`` file; errors name the file and field."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise SpecError.single(str(p), f"cannot read: {err.strerror}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise SpecError.single(str(p), f"not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {_parse_error(err)}") from None
    try:
        return parse_config(data if data is not None else {}, base_dir=p.parent)
    except SpecError as err:
        raise SpecError([Problem(f"{p.name}: {pr.path}" if pr.path else p.name, pr.rule) for pr in err.problems]) from None


def _parse_error(err: Exception) -> str:
    """What is wrong and where, never quoting the file (it may hold a key): YAML's own
    message shows the line around the error."""
    mark = getattr(err, "problem_mark", None)
    if isinstance(err, yaml.MarkedYAMLError) and mark is not None:
        return f"{err.problem or 'syntax error'} at line {mark.line + 1}, column {mark.column + 1}"
    return str(err) if isinstance(err, json.JSONDecodeError) else type(err).__name__


def config_from_sources(cli_path: str | None, environ: Mapping[str, str] = os.environ) -> DeploymentConfig:
    """``--logits-spec`` wins over ``DYN_LOGITS_SPEC``; neither gives an inactive config.

    Loads the installed plug-in kinds either way, so a broken plug-in stops a process
    at start-up (``KindError``) rather than failing its first request.
    """
    plugin_kinds()
    path = cli_path or environ.get(SPEC_FILE_ENV)
    return load_config(path) if path else DeploymentConfig()


def split_kinds(value: str | None) -> frozenset[str]:
    """``"a,b"`` -> ``{"a", "b"}``; empty items are ignored."""
    return frozenset(k.strip() for k in (value or "").split(",") if k.strip())


def load_deployment_config(logits_spec: str | None, allow_request_kinds: frozenset[str]) -> DeploymentConfig:
    """The operator's config (``--logits-spec`` or ``$DYN_LOGITS_SPEC``) with the CLI's
    ``--allow-request-kinds`` added; ``SpecError`` naming the bad file field or kind."""
    config = config_from_sources(logits_spec)
    if not allow_request_kinds:
        return config
    # Validate the CLI kinds with the config file's own rules (operator-only kinds never allowed).
    extra = parse_config({"allow_request_kinds": sorted(allow_request_kinds)})
    return dataclasses.replace(config, allow_request_kinds=config.allow_request_kinds | extra.allow_request_kinds)
