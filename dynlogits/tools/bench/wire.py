"""The ``wire`` suite: one request's payload across the process boundary, msgspec path vs pydantic path.

Payloads ``forced_sequence_64`` and ``mixed`` (``workloads``), ids valid for vocab 151936. ``encode``:
entries -> msgpack bytes (``msgspec``: ``dynlogits.specs.fast`` structs; ``pydantic``:
``encode_entries``). ``decode``: bytes -> validated entries, ids checked against the width
(``msgspec``: ``decode_wire_payload``, the engine's path; ``pydantic``: ``decode_strict``, the path
of plug-in kinds). Both must decode each other's bytes to equal entries before timing; a figure is
the median over interleaved rounds of the mean time per call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from . import workloads
from .records import WireRecord

__all__ = ["WIRE_KINDS", "WIRE_VOCAB", "WireOptions", "run_wire"]

WIRE_VOCAB = 151936
WIRE_KINDS = ("forced_sequence_64", "mixed")


@dataclass(frozen=True)
class WireOptions:
    rounds: int = 15
    calls_per_round: int = 500


def _payload(kind: str) -> list[dict[str, Any]]:
    source = "forced_sequence" if kind == "forced_sequence_64" else kind
    return workloads.payload(source, vocab_size=WIRE_VOCAB, eos_token_id=1)


def _paths(payload: list[dict[str, Any]]) -> dict[tuple[str, str], Callable[[], Any]]:
    from dynlogits.specs import DEFAULT_LIMITS, SpecError, check_vocab, decode_wire_payload, encode_entries
    from dynlogits.specs.fast import FastEntry
    from dynlogits.specs.limits import limit_problems
    from dynlogits.specs.wire import WIRE_KEY, decode_strict

    def decode_pydantic(data: bytes) -> tuple[Any, ...]:
        entries = decode_strict(msgspec.msgpack.decode(data))
        problems = list(limit_problems(entries, DEFAULT_LIMITS, root=WIRE_KEY))
        if problems:
            raise SpecError(problems)
        check_vocab(entries, WIRE_VOCAB, root=WIRE_KEY)
        return entries

    def decode_msgspec(data: bytes) -> tuple[Any, ...]:
        return decode_wire_payload(msgspec.msgpack.decode(data), vocab_size=WIRE_VOCAB)

    models = decode_strict(payload)
    structs = msgspec.convert(payload, list[FastEntry], strict=True)
    encoded = {"msgspec": msgspec.msgpack.encode(structs), "pydantic": msgspec.msgpack.encode(encode_entries(models))}
    decoded = {(impl, source): decode(encoded[source])
               for impl, decode in (("msgspec", decode_msgspec), ("pydantic", decode_pydantic)) for source in encoded}
    if len({repr(entries) for entries in decoded.values()}) != 1:
        raise RuntimeError(f"the msgspec and pydantic paths disagree on a payload: {decoded}")
    return {
        ("msgspec", "encode"): lambda: msgspec.msgpack.encode(structs),
        ("pydantic", "encode"): lambda: msgspec.msgpack.encode(encode_entries(models)),
        ("msgspec", "decode"): lambda: decode_msgspec(encoded["pydantic"]),
        ("pydantic", "decode"): lambda: decode_pydantic(encoded["pydantic"]),
    }


def run_wire(opts: WireOptions) -> list[WireRecord]:
    """Measure every (kind, impl, stage) of the suite."""
    records: list[WireRecord] = []
    for kind in WIRE_KINDS:
        paths = _paths(_payload(kind))
        rounds: dict[tuple[str, str], list[float]] = {key: [] for key in paths}
        for _ in range(opts.rounds):
            for key, call in paths.items():
                start = time.perf_counter_ns()
                for _ in range(opts.calls_per_round):
                    call()
                rounds[key].append((time.perf_counter_ns() - start) / 1e3 / opts.calls_per_round)
        records += [WireRecord(kind=kind, impl=impl, stage=stage, median_us=statistics.median(values))
                    for (impl, stage), values in rounds.items()]
    return records
