"""One request's processors inside a vLLM sampler, isolated from every other request.

Contract shared by both model runners:

* ``read_payload(params)`` is the only place that reads ``extra_args["dynamo_logits"]``. The value
  is a list of entries or the JSON text of one (``carried_payload``): text is what ``vllm_xargs`` of
  vLLM's own OpenAI server can carry (flat values only), so it is always a client's.
* ``validate(params)`` is the admission check (front-end process, before the request is queued):
  it raises ``SpecError`` (a ``ValueError`` naming the field) for anything malformed, so vLLM fails
  that request alone (HTTP 400 through ``vllm serve``). Who is trusted with what
  (``dynlogits.policy.engine_spec``): with the engine as the spec source (``DYN_LOGITS_SPEC_SOURCE=engine``)
  every payload is a client's, held to the operator's ``allow_request_kinds``; with the worker as
  the source (the default) a list was written by the engine's owner and is held to the wire rules,
  while text is a client's, held to ``DYN_LOGITS_REQUEST_KINDS`` (none by default) and the wire rules.
* ``validate`` also refuses what would let a client switch the deployment's entries off or escape
  them (``dynlogits.policy.request``): an entry that needs a stop token on a request without one
  (``ignore_eos`` and no ``stop_token_ids``), and, with the engine as the spec source, a client's
  ``reasoning`` entry where the operator's entries act by the delimiters.
* ``realize_request(params, vocab_size, ...)`` runs in the engine process when the request enters
  the batch and returns a fresh ``VllmRequest`` (or ``None`` when the request carries no payload,
  or only prefills for a remote decode worker). It never raises: a payload that only fails here (a
  token id beyond the logits width, which admission cannot know) yields a request that is already
  failed. Given the engine's resolved ``engine_spec``, the request runs the deployment's entries
  plus its own allowed ones, gated by role; where its own fail here, the deployment's still run
  (the request is reported failed, and fail-stopped where it has a stop token). A payload is held
  to the limits of a whole payload (``specs.wire.payload_limit_problems``): the deployment's
  entries never count against a client's ``max_entries``.
* A ``VllmRequest`` is also vLLM's per-request callable (``AdapterLogitsProcessor``'s
  ``RequestLogitsProcessor``): ``request(output_ids, logits_row)`` edits the row in place and returns it.

Failure policy: the SDK's (``dynlogits.sdk.guard``). vLLM gives a custom logits processor no way
to fail one request, and an exception escaping the sampler kills the whole engine, so a failing
request is fail-stopped to its EOS (unset under ``ignore_eos``), else its lowest explicit stop id.
"""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, Protocol

import torch

from dynlogits import sdk
from dynlogits.policy.config import DeploymentConfig
from dynlogits.policy.engine_spec import PAYLOAD_ROOT, admission_config, check_request_payload, client_payload_config
from dynlogits.policy.request import DEPLOYMENT_PATH, has_stop_token, reasoning_problem, stop_token_problem
from dynlogits.policy.roles import DisaggregationMode, is_generation_stage, logits_processors_for_request
from dynlogits.processors.base import SamplingView, Vocabulary
from dynlogits.sdk import FailureReport, GuardedRequest
from dynlogits.sdk.failure_reports import report_id_of
from dynlogits.specs import DEFAULT_LIMITS, WIRE_KEY, SpecError, SpecLimits
from dynlogits.specs.prompt_limit import prompt_limit_problem

__all__ = ["PayloadSource", "VllmRequest", "carried_payload", "client_payload", "payload_text_bound", "read_payload",
           "realize_request", "request_facts", "request_role", "stop_token", "validate"]

_KV_TRANSFER_PARAMS = "kv_transfer_params"

# Generous per-item sizes of a payload's JSON text (spaced separators, every text character escaped).
_ENTRY_CHARS = 512  # keys, kind, scalars
_ID_CHARS = 16  # "-2147483648, "
_TEXT_CHAR_CHARS = 12  # an astral character as two \\uXXXX escapes
_BIAS_ITEM_CHARS = 64  # "2147483647": -1.0000000000000002e-05,


class PayloadSource(Protocol):
    """Where a request's payload comes from when the engine is the spec source
    (``dynlogits.adapters.vllm.engine_spec.VllmEngineSpec``)."""

    @property
    def limits(self) -> SpecLimits:
        """The operator's limits the client's payload is held to."""

    def payload_for(self, params: Any) -> list[dict[str, Any]] | None:
        """The wire payload this request runs; ``SpecError`` naming the field if the client's is bad."""


class VllmRequest(GuardedRequest):
    """One request's ``GuardedRequest``, callable as vLLM's per-request logits processor.

    ``request(output_ids, logits_row)``: ``output_ids`` are the tokens the request generated so far
    (the row is for the next position), ``logits_row`` its 1-D logits; edits the row in place and
    returns it. A failing processor fail-stops this request only; nothing is raised.
    """

    __slots__ = ()

    def __call__(self, output_ids: list[int], logits_row: torch.Tensor) -> torch.Tensor:
        return sdk.apply_row(self, output_ids, logits_row)

    @classmethod
    def adopt(cls, request: GuardedRequest | None) -> VllmRequest | None:
        """``request`` itself (same object, same state) as a ``VllmRequest``; ``None`` stays ``None``."""
        if request is not None:
            request.__class__ = cls  # same slots: the subclass adds none
        return request  # type: ignore[return-value]  # its class was just set to this one


def read_payload(params: Any) -> Any | None:
    """The raw ``dynamo_logits`` value of a ``SamplingParams`` (list or JSON text), or ``None`` when absent."""
    extra = getattr(params, "extra_args", None)
    if not extra:
        return None
    return extra.get(WIRE_KEY)


def request_role(params: Any, engine: DisaggregationMode) -> DisaggregationMode:
    """``PREFILL`` for a request that only prefills for a remote decode worker (its
    ``extra_args["kv_transfer_params"]["do_remote_decode"]`` is true), else ``engine``."""
    extra = getattr(params, "extra_args", None) or {}
    kv_params = extra.get(_KV_TRANSFER_PARAMS) if isinstance(extra, Mapping) else None
    if isinstance(kv_params, Mapping) and kv_params.get("do_remote_decode") is True:
        return DisaggregationMode.PREFILL
    return engine


def payload_text_bound(limits: SpecLimits) -> int:
    """The most characters of JSON text a payload within ``limits`` can take, counted generously
    (per entry: two id lists, a text with every character escaped, a bias map); longer text is
    refused before it is parsed."""
    entry = (_ENTRY_CHARS + 2 * limits.max_token_ids * _ID_CHARS + limits.max_text_chars * _TEXT_CHAR_CHARS
             + limits.max_bias_entries * _BIAS_ITEM_CHARS)
    return limits.max_entries * entry


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def carried_payload(raw: Any, limits: SpecLimits) -> Any:
    """The payload ``raw`` carries: JSON text parsed once (size-checked first), anything else as it is.

    ``SpecError`` naming ``extra_args.dynamo_logits`` when the text is longer than
    ``payload_text_bound(limits)`` or is not JSON. Text that decodes to text is not parsed again.
    """
    if not isinstance(raw, str):
        return raw
    bound = payload_text_bound(limits)
    if len(raw) > bound:
        raise SpecError.single(PAYLOAD_ROOT, f"JSON text of {len(raw)} characters is longer than a payload within "
                                             f"the limits can be ({bound})")
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as err:
        raise SpecError.single(PAYLOAD_ROOT, f"must be a list of entries or its JSON text; this text is not valid "
                                             f"JSON ({err or 'nested too deeply'})") from None


def client_payload(text: str, config: DeploymentConfig | None = None, *, admitted: bool = False) -> Any:
    """The payload a client sent as JSON ``text`` to an engine whose worker is the spec source:
    parsed and held to ``config`` (default ``client_payload_config()``: ``DYN_LOGITS_REQUEST_KINDS``
    and the default limits), then to the wire rules (``admitted``: vLLM's ``validate_params`` checked
    them where the request entered, so only the O(payload) parse and allow-list here). ``SpecError``
    naming the field."""
    config = config if config is not None else client_payload_config()
    payload = carried_payload(text, config.limits)
    check_request_payload(payload, config)
    if not admitted:
        sdk.validate(payload, limits=config.limits)
    return payload


def validate(params: Any, *, vocab_size: int | None = None) -> None:
    """Admission check: raise ``SpecError`` (``ValueError``) naming the bad field.

    The logits width is unknown in vLLM's front-end process (``vocab_size`` ``None``), so ids are
    checked against it there only when the request is realized in the engine (see the module's
    failure policy); a caller that knows it passes it. Then what would switch the deployment's
    entries off or escape them (``_escape_problem``).
    """
    raw = read_payload(params)
    engine_config = admission_config()
    if engine_config is not None:
        payload = carried_payload(raw, engine_config.limits)
        own = check_request_payload(payload, engine_config)
        _escape_problem(params, own, engine_config, root=PAYLOAD_ROOT)
    elif isinstance(raw, str):
        _escape_problem(params, client_payload(raw), None, root=PAYLOAD_ROOT)
    else:
        sdk.validate(raw, vocab_size=vocab_size)
        _escape_problem(params, raw if isinstance(raw, list) else (), None, root=WIRE_KEY)


def _escape_problem(params: Any, own: Sequence[Any], config: DeploymentConfig | None, *, root: str) -> None:
    """``SpecError`` when the request's own entries (``own``, named under ``root``) or ``config``'s
    (the operator's, with the engine as the spec source) need a stop token the request lacks
    (``ignore_eos`` without ``stop_token_ids``), or when its own ``reasoning`` entry would replace the
    delimiters the operator's entries act by. A prefill for a remote decode worker runs nothing."""
    if not is_generation_stage(request_role(params, DisaggregationMode.AGGREGATED)):
        return
    deployment = list(logits_processors_for_request(config.spec, disaggregation_mode=DisaggregationMode.AGGREGATED)
                      if config is not None else ())
    paths = [f"{DEPLOYMENT_PATH}[{i}]" for i in range(len(deployment))]
    problem = None
    if not has_stop_token(ignore_eos=bool(getattr(params, "ignore_eos", False)),
                          stop_token_ids=getattr(params, "stop_token_ids", None)):
        problem = stop_token_problem(own, deployment, root=root, deployment_paths=paths)
    if problem is None:
        problem = reasoning_problem(own, deployment, root=root, deployment_paths=paths)
    if problem is not None:
        raise SpecError([problem])


def stop_token(params: Any, vocab_size: int) -> int | None:
    """The token that ends a failed request (``dynlogits.sdk.pick_stop_token``): its EOS (unset under
    ``ignore_eos``), else its lowest ``stop_token_ids`` entry, inside the logits width."""
    return sdk.pick_stop_token(getattr(params, "eos_token_id", None), getattr(params, "stop_token_ids", None), vocab_size)


def request_facts(params: Any, prompt_ids: Sequence[int] | None, vocabulary: Vocabulary | None = None) -> sdk.RequestFacts:
    """What the adapter knows of a request: its prompt (``None`` where the runner does not say), the
    ids it stops on (its EOS unless ``ignore_eos``, then ``stop_token_ids``), its arrival
    (``extra_args[ARRIVAL_KEY]``, ``sdk.carried_arrival``), its sampling parameters, its id for logs
    (the worker's report id where it carries one: neither runner tells a logits processor vLLM's
    request id), the engine's ``vocabulary``, and that it was admitted: vLLM runs
    ``validate_params`` on every request where it enters (``vllm/v1/engine/input_processor.py``,
    ``InputProcessor.process_inputs`` -> ``_validate_params``, vLLM 0.32; once per request:
    ``AsyncLLM.add_request`` fans ``n`` out after it), so the model runner never repeats the
    consistency walks."""
    return sdk.RequestFacts.of(prompt_ids=prompt_ids, eos_token_id=getattr(params, "eos_token_id", None),
                               stop_token_ids=getattr(params, "stop_token_ids", None) or (),
                               arrival_time=sdk.carried_arrival(getattr(params, "extra_args", None)), admitted=True,
                               request_id=report_id_of(params), sampling=SamplingView.read(params),
                               vocabulary=vocabulary)


def _check_prompt(payload: Any, prompt_ids: Sequence[int] | None, limits: SpecLimits) -> None:
    """``SpecError`` naming the prompt when a client's payload reads a prompt over ``max_prompt_tokens``."""
    if not payload or prompt_ids is None:
        return
    paths = [f"{PAYLOAD_ROOT}[{i}]" for i in range(len(payload))]
    problem = prompt_limit_problem(payload, len(prompt_ids), limits, path="prompt", paths=paths)
    if problem is not None:
        raise SpecError([problem])


def realize_request(params: Any, *, vocab_size: int, report: FailureReport | None = None,
                    engine_spec: PayloadSource | None = None, prompt_ids: Sequence[int] | None = None,
                    vocabulary: Vocabulary | None = None) -> VllmRequest | None:
    """Fresh processors for one request entering the batch; ``None`` without a payload. Never raises.
    ``vocabulary``: the engine's (``RealizeContext.vocabulary``; ``None``: no tokenizer).
    An arrival in ``extra_args`` counts only beside a payload the worker wrote (a list, with no engine
    spec source): the client's ``extra_args`` never set a deadline's clock. With the engine as the
    spec source, a client's payload refused here leaves the deployment's entries running (the
    request is reported failed; fail-stopped where it has a stop token)."""
    stop = stop_token(params, vocab_size)
    payload = read_payload(params)
    facts = request_facts(params, prompt_ids, vocabulary)
    limits = DEFAULT_LIMITS
    if engine_spec is not None or isinstance(payload, str):
        facts = dataclasses.replace(facts, arrival_time=None)
    try:
        if engine_spec is not None:
            limits = engine_spec.limits
            payload = engine_spec.payload_for(params)
            _check_prompt(payload, prompt_ids, limits)
        elif isinstance(payload, str):  # a client's (see the module doc); prefill-only requests run nothing
            generates = is_generation_stage(request_role(params, DisaggregationMode.AGGREGATED))
            config = client_payload_config()
            limits = config.limits
            payload = client_payload(payload, config, admitted=True) if generates else None
            _check_prompt(payload, prompt_ids, limits)
    except SpecError as err:
        reason = f"payload rejected in the engine: {err}"
        kept = _deployment_request(engine_spec, params, vocab_size=vocab_size, facts=facts, prompt_ids=prompt_ids)
        return VllmRequest.adopt(GuardedRequest.failed_at_realization(reason, stop_token_id=stop, report=report,
                                                                      processor=kept))
    return VllmRequest.adopt(sdk.realize(payload, vocab_size=vocab_size, stop_token_id=stop, report=report,
                                         facts=facts, limits=limits))


def _deployment_request(engine_spec: PayloadSource | None, params: Any, *, vocab_size: int, facts: sdk.RequestFacts,
                        prompt_ids: Sequence[int] | None) -> Any:
    """The processors of the deployment's entries alone for this request (its role's, the client's
    payload left out), ``None`` without an engine spec source or when they do not realize either."""
    if engine_spec is None:
        return None
    extra = getattr(params, "extra_args", None) or {}
    without = types.SimpleNamespace(extra_args={k: v for k, v in extra.items() if k != WIRE_KEY})
    try:
        payload = engine_spec.payload_for(without)
        _check_prompt(payload, prompt_ids, engine_spec.limits)
    except SpecError:
        return None
    request = sdk.realize(payload, vocab_size=vocab_size, stop_token_id=None, facts=facts, limits=engine_spec.limits)
    return request.processor if request is not None and not request.failed else None
