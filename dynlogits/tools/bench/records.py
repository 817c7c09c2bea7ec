"""One record per measurement, in the JSON shape ``--json FILE`` writes.

* micro: ``{"suite": "micro", "kind", "batch", "vocab", "impl", "median_ms", "launches", "syncs"}``
  (``impl`` in ``MICRO_IMPLS``; ``launches`` of one steady step and ``syncs`` over a sequence, on
  the CUDA model, for ``adapter`` and ``adapter_v2`` only, else ``null``);
* engine: ``{"suite": "engine", "kind", "impl", "tok_per_s", "rounds", "paired_ratio",
  "paired_interval", "round_tok_per_s", "attributed_ratio", "round_adapter_ms", "attributed_share"}`` (``impl`` in
  ``ENGINE_IMPLS``; kind ``"none"``: requests without a payload; ``tok_per_s`` the median of
  ``round_tok_per_s``; ``paired_ratio`` the median per-round ratio to the same engine's ``none``
  kind and ``paired_interval`` ``{"low", "high", "confidence"}`` around it (``stats.median_interval``), both
  ``null`` for ``none`` and engines without it; ``round_adapter_ms`` the ms the engine spent in the adapter's
  calls per round's batch (impl ``floor``: in the floor processor's), ``attributed_ratio`` the paired ratio those times alone give and
  ``attributed_share`` their share of the batch's wall time, where the adapter was timed, else
  empty / ``null``: ``engine.records_for``);
* wire: ``{"suite": "wire", "kind", "impl", "stage", "median_us"}`` (``WIRE_IMPLS``, ``WIRE_STAGES``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Union

from .stats import MedianInterval

__all__ = ["ENGINE_IMPLS", "MICRO_IMPLS", "WIRE_IMPLS", "WIRE_STAGES", "EngineRecord", "MicroRecord", "Record",
           "WireRecord", "write_json"]

#: ``adapter``: the vLLM adapter on the V1 runner's interface; ``adapter_v2``: the same class on
#: Model Runner V2's; ``loop``: the same realized processors called row by row; ``reference``:
#: ai-dynamo-runtime 1.6.1 per row (forced_sequence only); ``floor``: one memset of the rows
#: (forced_sequence only); ``baseline``: the adapter on ``banned_tokens`` requests, timed in the same
#: loop on the same logits (banned_phrases only: its target is a ratio to banned_tokens).
MICRO_IMPLS = ("adapter", "adapter_v2", "loop", "reference", "floor", "baseline", "vllm_watermark")
#: ``floor``: ``timed.TimedFloorProcessor`` in the adapter's engine, ``-inf`` over every row of a batch
#: of its own (forced_sequence only; paired with that engine's no-payload batches, its time its own).
ENGINE_IMPLS = ("none", "adapter", "reference", "floor")
WIRE_IMPLS = ("msgspec", "pydantic")
#: ``encode``: entries -> msgpack bytes; ``decode``: msgpack bytes -> validated entries.
WIRE_STAGES = ("encode", "decode")


@dataclass(frozen=True)
class MicroRecord:
    kind: str
    batch: int
    vocab: int
    impl: str
    median_ms: float
    launches: int | None = None
    syncs: int | None = None
    #: the time of each timed repetition, in order (repetition ``i`` of every impl of a case ran side by side)
    rep_ms: tuple[float, ...] = ()
    suite: Literal["micro"] = "micro"


@dataclass(frozen=True)
class EngineRecord:
    kind: str
    impl: str
    tok_per_s: float
    rounds: int = 1
    paired_ratio: float | None = None
    paired_interval: MedianInterval | None = None
    round_tok_per_s: tuple[float, ...] = ()
    attributed_ratio: float | None = None
    round_adapter_ms: tuple[float, ...] = ()
    #: median over rounds of the adapter's own ms in the kind's batch over that batch's wall ms: its
    #: share of an engine step (``None`` where the adapter was not timed)
    attributed_share: float | None = None
    suite: Literal["engine"] = "engine"


@dataclass(frozen=True)
class WireRecord:
    kind: str
    impl: str
    stage: str
    median_us: float
    suite: Literal["wire"] = "wire"


Record = Union[MicroRecord, EngineRecord, WireRecord]


def _as_json(record: Record) -> dict[str, object]:
    data = asdict(record)
    return {"suite": data.pop("suite"), **data}


def write_json(path: str | Path, records: Iterable[Record]) -> None:
    """Write the records as one JSON list (suite first in each object)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps([_as_json(r) for r in records], indent=1) + "\n", encoding="utf-8")
