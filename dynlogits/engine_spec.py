"""The engine as the spec source, for runtimes that own the frontend (NVIDIA Dynamo, ``vllm serve``).

With our own worker (``python -m dynlogits.worker``) the worker is the spec source: it resolves the
operator's spec and the test hook, gates them by role and writes ``extra_args["dynamo_logits"]``;
the engine-loaded adapter realizes whatever arrives there. Where another runtime owns the frontend
and the worker (``python -m dynamo.frontend`` + ``python -m dynamo.vllm``), nothing writes that
payload, and what does arrive in ``extra_args`` came from a client. There the operator sets
``DYN_LOGITS_SPEC_SOURCE=engine`` and the adapter, inside the engine process:

* resolves the deployment spec once at start-up, with the engine's tokenizer and logits width:
  the operator config (``DYN_LOGITS_SPEC``) and the test hook (``DYN_ENABLE_TEST_LOGITS_PROCESSOR=1``);
* gates it by the engine's own role (a prefill worker activates nothing) and applies it to every
  request;
* treats a payload arriving in ``extra_args["dynamo_logits"]`` as a client request: honoured only
  for kinds in the config's ``allow_request_kinds`` (none by default), within its ``limits``;
  ``python`` never (it would run code on the worker).

The rules are those of the worker (``dynlogits.policy``), applied in the engine process.
Nothing here imports torch or an engine; each adapter supplies its role, tokenizer and width
(``dynlogits.adapters.vllm.engine_spec``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any

from dynlogits.config import SPEC_FILE_ENV, DeploymentConfig, config_from_sources
from dynlogits.policy import RequestPolicy, build_policy
from dynlogits.roles import DisaggregationMode
from dynlogits.sdk import encode_payload
from dynlogits.specs import WIRE_KEY, Entry, SpecError, parse_entries
from dynlogits.text import TextTokenizer

__all__ = [
    "PAYLOAD_ROOT",
    "SPEC_SOURCE_ENV",
    "EngineSpec",
    "SpecSource",
    "admission_config",
    "check_request_payload",
    "resolve_engine_spec",
    "spec_source",
]

SPEC_SOURCE_ENV = "DYN_LOGITS_SPEC_SOURCE"
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


def admission_config(environ: Mapping[str, str] = os.environ) -> DeploymentConfig | None:
    """The operator config when the engine is the spec source, else ``None``.

    Read once per config file and process (admission runs on every request).
    """
    if spec_source(environ) is not SpecSource.ENGINE:
        return None
    return _load_config(environ.get(SPEC_FILE_ENV) or None)


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
            policy = RequestPolicy(role=role, deployment=policy.deployment, config=policy.config,
                                   tokenizer=policy.tokenizer, vocab_size=policy.vocab_size)
        return encode_payload(policy.entries_for(request_payload, root=PAYLOAD_ROOT))


def resolve_engine_spec(
    role: DisaggregationMode,
    tokenizer: Callable[[], TextTokenizer],
    vocab_size: int,
    environ: Mapping[str, str] = os.environ,
) -> EngineSpec | None:
    """Resolve the deployment spec once at engine start-up; ``None`` unless the engine is the source.

    ``tokenizer`` is the engine's (``forced_text`` and the test hook need it); ``vocab_size`` is
    the logits width every id is checked against. A bad config raises ``SpecError`` here, so the
    engine fails to start instead of failing every request.
    """
    config = admission_config(environ)
    if config is None:
        return None
    return EngineSpec(build_policy(DisaggregationMode(role), config, _once(tokenizer), vocab_size, environ=environ))


def _once(factory: Callable[[], TextTokenizer]) -> Callable[[], TextTokenizer]:
    """``factory`` called at most once (``build_policy`` asks for the tokenizer more than once)."""
    cached: list[TextTokenizer] = []

    def get() -> TextTokenizer:
        if not cached:
            cached.append(factory())
        return cached[0]

    return get
