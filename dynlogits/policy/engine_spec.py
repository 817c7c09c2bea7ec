"""The engine as the spec source, for runtimes that own the frontend (NVIDIA Dynamo, ``vllm serve``).

With ``DYN_LOGITS_SPEC_SOURCE=engine`` the adapter does the worker's job inside the engine process:
it resolves the deployment spec once at start-up (``DYN_LOGITS_SPEC``, the test hook) with the
engine's tokenizer and logits width, gates it by the engine's role, applies it to every request,
and treats a payload in ``extra_args["dynamo_logits"]`` as a client's (allowed kinds and limits
only, operator-only kinds never). With the worker as the source, a payload in ``extra_args`` is trusted
except one arriving as JSON text (the only form an engine's own HTTP server carries), which
``client_payload_config`` holds to ``DYN_LOGITS_REQUEST_KINDS``, the default limits, no operator-only kind.

The rules are the worker's (``dynlogits.policy.request``). No torch or engine import; each adapter
supplies role, tokenizer and width (``dynlogits.adapters.vllm.engine_spec``). See docs/dynamo.md."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any

from dynlogits.policy.config import SPEC_FILE_ENV, DeploymentConfig, config_from_sources, parse_config
from dynlogits.policy.request import RequestPolicy, build_policy
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.policy.text import TextTokenizer
from dynlogits.specs import WIRE_KEY, Entry, Problem, SpecError, encode_entries, parse_entries
from dynlogits.specs.entries import BUILTIN, ReasoningSpec

__all__ = [
    "PAYLOAD_ROOT",
    "REQUEST_KINDS_ENV",
    "SPEC_SOURCE_ENV",
    "EngineSpec",
    "SpecSource",
    "admission_config",
    "check_request_payload",
    "client_payload_config",
    "request_kinds",
    "resolve_engine_spec",
    "spec_source",
]

SPEC_SOURCE_ENV = "DYN_LOGITS_SPEC_SOURCE"
#: Operator setting: the kinds a payload sent by a client itself may carry (comma-separated).
REQUEST_KINDS_ENV = "DYN_LOGITS_REQUEST_KINDS"
#: Where a request's own entries are named in error messages.
PAYLOAD_ROOT = f"extra_args.{WIRE_KEY}"


class SpecSource(str, Enum):
    """Who resolves the deployment spec and writes the payload. Values are the env spellings."""

    WORKER = "worker"  # a dynlogits worker upstream gates and writes extra_args (the default)
    ENGINE = "engine"  # the adapter resolves the spec in the engine; extra_args is a client's


def spec_source(environ: Mapping[str, str] = os.environ) -> SpecSource:
    """``DYN_LOGITS_SPEC_SOURCE`` (unset or empty: ``worker``); ``SpecError`` naming it otherwise."""
    value = environ.get(SPEC_SOURCE_ENV, "") or SpecSource.WORKER.value
    try:
        return SpecSource(value)
    except ValueError:
        raise SpecError.single(SPEC_SOURCE_ENV, f"must be one of {[s.value for s in SpecSource]}, got {value!r}") from None


@lru_cache(maxsize=8)
def _load_config(spec_file: str | None) -> DeploymentConfig:
    return config_from_sources(spec_file, environ={})


@lru_cache(maxsize=8)
def _parse_request_kinds(value: str) -> frozenset[str]:
    kinds = sorted({k.strip() for k in value.split(",") if k.strip()})
    try:  # the config file's rule for allow_request_kinds: known kinds only, operator-only kinds never
        return parse_config({"allow_request_kinds": kinds}).allow_request_kinds
    except SpecError as err:
        raise SpecError([Problem(REQUEST_KINDS_ENV, p.rule) for p in err.problems]) from None


def request_kinds(environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """``DYN_LOGITS_REQUEST_KINDS`` (unset or empty: no kind); ``SpecError`` naming it for an
    operator-only or an unknown kind."""
    return _parse_request_kinds(environ.get(REQUEST_KINDS_ENV, ""))


def _allowing(config: DeploymentConfig, kinds: frozenset[str]) -> DeploymentConfig:
    if kinds <= config.allow_request_kinds:
        return config
    return dataclasses.replace(config, allow_request_kinds=config.allow_request_kinds | kinds)


def _resolved_on_worker(kind: str) -> bool:
    """Whether entries of built-in ``kind`` never cross the wire (the worker resolves them first)."""
    declared = BUILTIN.get(kind)
    return declared is not None and not declared.wire


def admission_config(environ: Mapping[str, str] = os.environ) -> DeploymentConfig | None:
    """The operator config when the engine is the spec source, else ``None``; its
    ``allow_request_kinds`` include ``DYN_LOGITS_REQUEST_KINDS``. Read once per file and process."""
    if spec_source(environ) is not SpecSource.ENGINE:
        return None
    return _allowing(_load_config(environ.get(SPEC_FILE_ENV) or None), request_kinds(environ))


def client_payload_config(environ: Mapping[str, str] = os.environ) -> DeploymentConfig:
    """What a payload a client sent itself is held to: ``admission_config`` when the engine is the
    spec source, else the default limits and ``DYN_LOGITS_REQUEST_KINDS`` (see the module doc)."""
    config = admission_config(environ)
    if config is not None:
        return config
    kinds = request_kinds(environ)
    resolved = sorted(k for k in kinds if _resolved_on_worker(k))  # built-in ones: the engine's tokenizer resolves them
    if resolved:
        raise SpecError.single(REQUEST_KINDS_ENV, f"kind {resolved[0]!r} is resolved with the engine's tokenizer, "
                                                  f"only when the engine is the spec source ({SPEC_SOURCE_ENV}=engine)")
    return _allowing(DeploymentConfig(), kinds)


def check_request_payload(payload: Any, config: DeploymentConfig) -> tuple[Entry, ...]:
    """Admission: a client's ``extra_args`` payload against the operator's allow-list and limits.

    ``SpecError`` names the field (``extra_args.dynamo_logits[i]...``); ``None`` is no entries.
    """
    if payload is None:
        return ()
    return parse_entries(payload, root=PAYLOAD_ROOT, limits=config.limits,
                         allowed_kinds=sorted(config.allow_request_kinds))


@dataclass(frozen=True)
class EngineSpec:
    """The deployment spec resolved in one engine, and the rule for each request's payload."""

    policy: RequestPolicy

    @property
    def role(self) -> DisaggregationMode:
        return self.policy.role

    def payload_for(self, request_payload: Any, *, role: DisaggregationMode | None = None) -> list[dict[str, Any]] | None:
        """The wire payload one request runs: the deployment's entries plus the request's allowed
        ones, gated by ``role`` (default: the engine's). ``SpecError`` names the bad field."""
        if request_payload is not None and not isinstance(request_payload, list):
            raise SpecError.single(PAYLOAD_ROOT, f"must be a list of entries, got {type(request_payload).__name__}")
        policy = self.policy
        if role is not None and role is not policy.role:
            policy = dataclasses.replace(policy, role=role)
        entries = policy.entries_for(request_payload, root=PAYLOAD_ROOT)
        return encode_entries(entries) if entries else None


def resolve_engine_spec(
    role: DisaggregationMode,
    tokenizer: Callable[[], TextTokenizer],
    vocab_size: int,
    environ: Mapping[str, str] = os.environ,
    *,
    default_reasoning: ReasoningSpec | None = None,
) -> EngineSpec | None:
    """Resolve the deployment spec once at engine start-up; ``None`` unless the engine is the source.

    ``tokenizer`` is the engine's (text and the test hook need it); ``vocab_size`` is the logits
    width every id is checked against; ``default_reasoning`` the model's reasoning delimiters (the
    operator's ``reasoning:`` wins). A bad config raises ``SpecError`` here, so the engine fails to
    start instead of failing every request.
    """
    config = admission_config(environ)
    if config is None:
        return None
    return EngineSpec(build_policy(DisaggregationMode(role), config, _once(tokenizer), vocab_size, environ=environ,
                                   default_reasoning=default_reasoning))


def _once(factory: Callable[[], TextTokenizer]) -> Callable[[], TextTokenizer]:
    """``factory`` called at most once (``build_policy`` asks for the tokenizer more than once)."""
    cached: list[TextTokenizer] = []

    def get() -> TextTokenizer:
        if not cached:
            cached.append(factory())
        return cached[0]

    return get
