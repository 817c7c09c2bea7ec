"""The kit's checks for one kind, a plug-in's above all: ``dynlogits conformance ADAPTER --kind NAME``.

A kind's own per-row processor is its reference: the kit realizes the kind's example entries on the
host (``sdk.realize``, the request's facts as the driver gives them) and calls the processors one
row at a time, then checks that the adapter's rows equal that reference step after step, on every
path the adapter runs the kind by (hosted or resident), beside other requests, beside built-in
entries in one request, across batch changes and a preemption. So a kind passes only where its
effect depends on its entry, the context's facts and the history alone (never on a step counter,
a clock or a random draw), as docs/specs.md ("Writing a kind") asks.

Example entries (``examples_of``): those given (``--entry``), else the ``examples`` of the spec
model's JSON Schema (``model_config = ConfigDict(json_schema_extra={"examples": [...]})``), else
``{"kind": NAME}`` where the model's defaults make that an entry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

import torch
from pydantic import ValidationError

from dynlogits import sdk
from dynlogits.specs.kinds import ENTRY_POINT_GROUP, ProcessorKind, plugin_kinds

from .checks import EOS, PROMPT, STEPS, Check, _assert_row, _assert_stopped, _forced, _greedy, _step
from .driver import AdapterDriver
from .oracle import expected_row

__all__ = ["KindError", "describe_kind", "examples_of", "kind_checks", "plugin_kind"]

#: Built-in entries a kind's example is put between in one request (small biases and one ban: an
#: example that keeps any two ids keeps a token).
_BEFORE = {"kind": "logit_bias", "bias": {"20": 0.5, "21": -0.5}}
_AFTER = {"kind": "banned_tokens", "token_ids": [22]}


class KindError(ValueError):
    """The kind cannot be checked: not in force here, or no example entry; the message says which."""


def plugin_kind(name: str) -> ProcessorKind:
    """The plug-in kind ``name`` in force in this process (installed in the entry-point group
    ``dynlogits.processors``, or registered); ``KindError`` naming those that are."""
    kinds = plugin_kinds()
    if name not in kinds:
        known = ", ".join(sorted(kinds)) or "none"
        raise KindError(f"no plug-in kind {name!r} is installed in the {ENTRY_POINT_GROUP!r} entry-point group "
                        f"(installed: {known})")
    return kinds[name]


def describe_kind(kind: ProcessorKind) -> str:
    """One line naming ``kind`` and the distribution that publishes it (where one does)."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == kind.kind and ep.dist is not None:
            return f"kind {kind.kind} (distribution {ep.dist.name} {ep.dist.version}, entry point {ep.value})"
    return f"kind {kind.kind} (registered in this process)"


def examples_of(kind: ProcessorKind, given: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The wire entries the kit runs ``kind`` with (see the module doc), each validated by the
    kind's spec model; ``KindError`` when one does not validate or there are none."""
    extra = kind.spec_model.model_config.get("json_schema_extra")
    declared = extra.get("examples") if isinstance(extra, Mapping) else None
    listed = [dict(e) for e in declared if isinstance(e, Mapping)] if isinstance(declared, list) else []
    candidates = [dict(e) for e in given] or listed or [{"kind": kind.kind}]
    examples = []
    for entry in candidates:
        entry.setdefault("kind", kind.kind)
        try:
            model = kind.spec_model.model_validate(entry)
        except ValidationError as err:
            raise KindError(f"kind {kind.kind}: the example entry {entry!r} does not validate ({err.errors()[0]['msg']}); "
                            "give one with --entry JSON or in the spec model's json_schema_extra examples") from None
        examples.append(model.model_dump(mode="json", exclude_none=True))
    return examples


class _Reference:
    """One request's processors realized on the host, called one row at a time: what the adapter's
    rows must equal."""

    def __init__(self, payload: list[dict[str, Any]], vocab_size: int, prompt: Sequence[int]) -> None:
        facts = sdk.RequestFacts.of(prompt_ids=prompt, eos_token_id=EOS, request_id="kit-reference")
        request = sdk.realize(payload, vocab_size=vocab_size, stop_token_id=EOS, facts=facts)
        if request is None or request.processor is None or request.failed:
            raise AssertionError(f"the payload {payload!r} does not realize on the host: "
                                 f"{request.error if request is not None else 'nothing realized'}")
        self.processor = request.processor

    def row(self, history: Sequence[int], raw: torch.Tensor) -> torch.Tensor:
        row = raw.clone()
        self.processor(list(history), row)
        return row


def _expect(out: torch.Tensor, want: torch.Tensor, what: str) -> bool:
    """``out`` equals the reference row ``want``; where ``want`` leaves no token the request must be
    fail-stopped (``False``: it ended)."""
    if not bool(torch.isfinite(want).any()):
        _assert_stopped(out, EOS, f"{what} (its own processor leaves no token)")
        return False
    _assert_row(out, want.tolist(), what)
    return True


def _rows_match_its_own_processor(entry: dict[str, Any]) -> Any:
    def check(driver: AdapterDriver) -> None:
        payload, forced = [entry], _forced([60, 61, 62, 63, 64, 65, 66])
        driver.admit(payload)
        reference = _Reference(payload, driver.vocab_size, PROMPT)
        driver.add("kind", payload, prompt_ids=PROMPT, eos_token_id=EOS)
        driver.add("built-in", forced, prompt_ids=PROMPT, eos_token_id=EOS)
        driver.add("free", None, prompt_ids=PROMPT, eos_token_id=EOS)
        history: list[int] = []
        others: dict[str, list[int]] = {"built-in": [], "free": []}
        for step in range(STEPS):
            if step == STEPS // 2:  # preempted, then resumed with what it generated
                driver.remove("kind")
                driver.add("kind", payload, prompt_ids=PROMPT, output_ids=history, eos_token_id=EOS)
            batch = ["free", "kind", "built-in"] if step % 2 else ["kind", "built-in", "free"]
            raw, out = _step(driver, batch, seed=900 + step)
            for row, req in enumerate(batch):
                if req == "kind":
                    if not _expect(out[row], reference.row(history, raw[row]), f"{entry['kind']} at step {step}"):
                        return
                    history.append(_greedy(out[row]))
                    driver.commit(req, history[-1])
                    continue
                want = expected_row(forced, others[req], raw[row].tolist()) if req == "built-in" else raw[row].tolist()
                _assert_row(out[row], want, f"the {req} request beside it at step {step}")
                others[req].append(_greedy(out[row]))
                driver.commit(req, others[req][-1])

    return check


def _runs_beside_built_in_entries(entry: dict[str, Any]) -> Any:
    def check(driver: AdapterDriver) -> None:
        for n, payload in enumerate(([_BEFORE, entry], [entry, _AFTER], [_BEFORE, entry, _AFTER])):
            driver.admit(payload)
            reference = _Reference(payload, driver.vocab_size, PROMPT)
            req = f"mixed{n}"
            driver.add(req, payload, prompt_ids=PROMPT, eos_token_id=EOS)
            history: list[int] = []
            for step in range(STEPS):
                raw, out = _step(driver, [req], seed=1000 + 10 * n + step)
                kinds = " + ".join(e["kind"] for e in payload)
                if not _expect(out[0], reference.row(history, raw[0]), f"{kinds} at step {step}"):
                    break
                history.append(_greedy(out[0]))
                driver.commit(req, history[-1])
            driver.remove(req)

    return check


def _state_is_fresh_per_request(entry: dict[str, Any]) -> Any:
    def check(driver: AdapterDriver) -> None:
        payload = [entry]
        prompts = {"a": PROMPT, "b": (7, 8)}
        references = {q: _Reference(payload, driver.vocab_size, p) for q, p in prompts.items()}
        histories: dict[str, list[int]] = {"a": [], "b": []}
        driver.add("a", payload, prompt_ids=prompts["a"], eos_token_id=EOS)
        layouts = [["a"], ["a"], ["b", "a"], ["a", "b"], ["b"], ["a", "b"]]
        live = {"a"}
        for step, batch in enumerate(layouts):
            if "b" in batch and "b" not in live:
                driver.add("b", payload, prompt_ids=prompts["b"], eos_token_id=EOS)
                live.add("b")
            batch = [q for q in batch if q in live]
            if not batch:
                break
            raw, out = _step(driver, batch, seed=1100 + step)
            for row, q in enumerate(batch):
                if not _expect(out[row], references[q].row(histories[q], raw[row]), f"request {q} in row {row}, step {step}"):
                    live.discard(q)
                    continue
                histories[q].append(_greedy(out[row]))
                driver.commit(q, histories[q][-1])

    return check


def kind_checks(kind: ProcessorKind, examples: Sequence[dict[str, Any]]) -> tuple[Check, ...]:
    """The checks of ``kind`` with each of its ``examples`` (``examples_of``), named ``NAME: check``
    (``NAME[i]`` for the ``i``-th of several examples)."""
    made = []
    for i, entry in enumerate(examples):
        label = kind.kind if len(examples) == 1 else f"{kind.kind}[{i}]"
        for name, build, doc in (
            ("rows_match_its_own_processor", _rows_match_its_own_processor,
             "its rows equal its own per-row processor, beside other requests, across a preemption"),
            ("runs_beside_built_in_entries", _runs_beside_built_in_entries,
             "in one request with built-in entries before and after it, the rows equal the entries applied in order"),
            ("state_is_fresh_per_request", _state_is_fresh_per_request,
             "two requests of the kind at different positions and rows do not interfere"),
        ):
            made.append(Check(f"{label}: {name}", doc, build(entry)))
    return tuple(made)
