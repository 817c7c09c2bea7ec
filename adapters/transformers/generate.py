"""Activation and admission for ``model.generate()``: spec -> payload -> ``generate()`` kwargs.

* ``activate(entries)``: the encoded wire payload (``None`` without entries); ``generate()`` carries
  no per-request data, so the payload is handed to ``generate_kwargs``, one per prompt.
* ``payload_for(spec, role, tokenizer)``: the role gate (``dynlogits.sdk.gate``), text resolved
  with the tokenizer, then ``activate``.
* ``validate(payloads, vocab_size=)``: admission. ``generate_kwargs(...)``: admission against the
  logits width (``SpecError`` naming ``payloads[k]`` and the field), then one ``DynamoLogitsProcessor``;
  the kwargs pin ``num_beams`` and ``num_return_sequences`` so rows expand as the processor maps them.

The logits width (``logits_width``) is the model's output-embedding rows (else ``config.vocab_size``)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import LogitsProcessorList

from dynlogits import sdk
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.policy.text import TextTokenizer, resolve_entries
from dynlogits.processors.base import SamplingView
from dynlogits.sdk import FailureReport
from dynlogits.specs import ForcedTextSpec, LogitsProcessorSpec, Problem, SpecError

from .processor import logits_processor

__all__ = ["activate", "generate_kwargs", "logits_width", "payload_for", "prompt_ids", "stop_token", "validate"]


def activate(entries: Sequence[Any]) -> list[dict[str, Any]] | None:
    """The payload one prompt carries into ``generate_kwargs`` for the gated wire ``entries``
    (text resolved), or ``None`` when there are none."""
    return sdk.encode_payload(entries)


def payload_for(
    spec: LogitsProcessorSpec | None, role: DisaggregationMode | str, tokenizer: TextTokenizer | None
) -> list[dict[str, Any]] | None:
    """The payload a worker of ``role`` puts on a request for ``spec``, or ``None``. ``tokenizer``
    resolves forced texts (``ForcedTextSpec``; may be ``None`` when no active entry holds text;
    ``SpecError`` names the entry otherwise)."""
    entries = sdk.gate(spec, role)
    if tokenizer is None:
        texts = [f"entries[{i}].text" for i, e in enumerate(entries) if isinstance(e, ForcedTextSpec)]
        if texts:
            raise SpecError([Problem(path, f"a {ForcedTextSpec.model_fields['kind'].default} entry needs a tokenizer "
                                           "to resolve it") for path in texts])
    else:
        entries = list(resolve_entries(entries, tokenizer, root="entries"))
    return activate(entries)


def logits_width(model: Any) -> int:
    """The width of the logits ``model`` produces: its output embedding's rows, else
    ``config.vocab_size`` (of the text config for multimodal models)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.ndim == 2:
        return int(weight.shape[0])
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


def _stop_ids(model: Any, tokenizer: Any) -> tuple[int | None, tuple[int, ...]]:
    """``(eos_token_id, stop_token_ids)`` that ``generate()`` stops on: the model's generation
    config (an int or a list; the first is the EOS), else the tokenizer's EOS."""
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        return config_eos, (config_eos,)
    if isinstance(config_eos, Sequence) and config_eos:
        ids = tuple(int(t) for t in config_eos)
        return ids[0], ids
    eos = getattr(tokenizer, "eos_token_id", None)
    return (eos, (eos,)) if isinstance(eos, int) else (None, ())


def stop_token(model: Any, vocab_size: int, tokenizer: Any = None) -> int | None:
    """The token that ends a failed request in ``generate()`` (``dynlogits.sdk.pick_stop_token``):
    the generation config's EOS, else its lowest stop id, else the tokenizer's EOS, inside the
    logits width."""
    eos, stops = _stop_ids(model, tokenizer)
    return sdk.pick_stop_token(eos, stops, vocab_size)


def validate(payloads: Sequence[Any], *, vocab_size: int) -> None:
    """Admission for a batch: ``SpecError`` listing every problem as ``payloads[k].<field>``."""
    problems: list[Problem] = []
    for k, payload in enumerate(payloads):
        try:
            sdk.validate(payload, vocab_size=vocab_size)
        except SpecError as err:
            problems += [Problem(f"payloads[{k}].{p.path}" if p.path else f"payloads[{k}]", p.rule) for p in err.problems]
    if problems:
        raise SpecError(problems)


def _input_ids(batch: Any) -> Any:
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else getattr(batch, "input_ids", batch)
    if ids is None or getattr(ids, "ndim", None) != 2:
        raise ValueError("batch must be a tokenizer output (or mapping) holding 2-D input_ids, or a 2-D tensor")
    return ids


def prompt_ids(batch: Any) -> list[list[int]]:
    """Each prompt's token ids without padding: the positions its ``attention_mask`` keeps (what
    ``generate()`` attends to), or the whole row when the batch has no mask."""
    ids = _input_ids(batch)
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else getattr(batch, "attention_mask", None)
    if mask is None:
        return [[int(t) for t in row] for row in ids.tolist()]
    if tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(f"attention_mask of shape {tuple(mask.shape)} for input_ids of shape {tuple(ids.shape)}")
    return [[int(t) for t, keep in zip(row, kept) if keep] for row, kept in zip(ids.tolist(), mask.tolist())]


def _sampling(config: Any, n: int) -> SamplingView:
    """The view of the model's ``generation_config``: a config that does not sample (``do_sample``
    false: greedy or beam search) says temperature 0, whatever its ``temperature`` field holds."""
    view = dataclasses.replace(SamplingView.read(config, max_tokens="max_new_tokens"), n=n)
    if config is not None and getattr(config, "do_sample", None) is False:
        view = dataclasses.replace(view, temperature=0.0)
    return view


def generate_kwargs(
    model: Any,
    tokenizer: Any,
    batch: Any,
    payloads: Sequence[Any],
    *,
    num_return_sequences: int = 1,
    num_beams: int = 1,
    report: FailureReport | None = None,
    arrival_time: float | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``model.generate(**batch, **kwargs)`` applying ``payloads[k]`` to prompt ``k``
    of ``batch`` (``None``: no processors): ``{"logits_processor": LogitsProcessorList([processor]),
    "num_beams": ..., "num_return_sequences": ...}`` (extend the list to add processors of your own).

    Raises ``SpecError`` for a bad payload, ``ValueError`` for arguments that do not fit the batch.
    ``report`` receives one line per request that fails while generating. Factories are told each
    prompt's ids without padding (``prompt_ids``), the ids ``generate()`` stops on and
    ``arrival_time`` (default: now, when the kwargs are built)."""
    input_ids = _input_ids(batch)
    if isinstance(payloads, (str, bytes, Mapping)) or not isinstance(payloads, Sequence):
        raise TypeError(f"payloads must be a sequence with one payload (or None) per prompt, got {type(payloads).__name__}")
    if len(payloads) != input_ids.shape[0]:
        raise ValueError(f"{len(payloads)} payloads for a batch of {input_ids.shape[0]} prompts")
    for name, value in (("num_beams", num_beams), ("num_return_sequences", num_return_sequences)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    width = logits_width(model)
    validate(payloads, vocab_size=width)
    eos, stops = _stop_ids(model, tokenizer)
    processor = logits_processor(
        payloads,
        vocab_size=width,
        prompt_width=int(input_ids.shape[1]),
        rows_per_request=max(num_beams, num_return_sequences),  # generate()'s expand_size
        eos_token_id=eos,
        stop_token_ids=stops,
        report=report,
        prompt_ids=prompt_ids(batch),
        arrival_time=time.time() if arrival_time is None else arrival_time,
        tokenizer=tokenizer,
        sampling=_sampling(getattr(model, "generation_config", None), num_return_sequences),
    )
    return {
        "logits_processor": LogitsProcessorList([processor]),
        "num_beams": num_beams,
        "num_return_sequences": num_return_sequences,
    }
