"""Worker side: what one SGLang request needs to run its gated entries.

``activate(target, entries)`` takes a sampling-params mapping (its ``custom_params`` gets the
payload, or loses a smuggled one) or a ``GenerateReqInput``-like object (the same, and its
``custom_logit_processor`` is set to this adapter's string), and returns
``SglangActivation(custom_logit_processor, custom_params)``. Beside the payload, ``custom_params``
carries the request's arrival (``ARRIVAL_KEY``, a float: a ``CustomParamValue`` scalar) when given;
a client's arrival is dropped. A client's ``custom_logit_processor`` (a dill string, i.e. code) is
never forwarded."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynlogits import sdk

from .custom_params import put_carried

__all__ = ["SglangActivation", "activate"]


@dataclass(frozen=True)
class SglangActivation:
    """The two request fields SGLang needs: ``custom_logit_processor`` (``None``: no processor) and
    ``custom_params`` (``None`` when empty)."""

    custom_logit_processor: str | None
    custom_params: dict[str, Any] | None


def _sampling_params(target: Any) -> MutableMapping[str, Any]:
    if isinstance(target, MutableMapping):
        return target
    params = getattr(target, "sampling_params", None)
    if params is None:
        params = {}
        target.sampling_params = params
    if not isinstance(params, MutableMapping):
        raise TypeError(
            f"activate() needs one request's sampling params as a dict, got {type(params).__name__} "
            "(batched GenerateReqInput: activate each request before batching)")
    return params


def activate(target: Any, entries: Sequence[Any], *, arrival_time: float | None = None) -> SglangActivation:
    """Put the payload for ``entries`` (and ``arrival_time``, ``time.time()`` when the deployment
    received the request) into ``target``'s ``custom_params`` and name this adapter's processor (see
    the module docstring); returns the fields set."""
    from .processor import processor_string  # needs sglang; keep the module importable without it

    params = _sampling_params(target)
    current = params.get("custom_params")
    custom: dict[str, Any] = dict(current) if isinstance(current, Mapping) else {}
    payload = sdk.encode_payload(entries)
    put_carried(custom, payload)
    sdk.put_arrival(custom, arrival_time if payload is not None else None)
    params["custom_params"] = custom or None
    processor = processor_string() if payload is not None else None
    if not isinstance(target, MutableMapping):
        target.custom_logit_processor = processor
    return SglangActivation(custom_logit_processor=processor, custom_params=custom or None)
