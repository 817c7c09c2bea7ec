"""The conformance checks: what every backend adapter must do, each a function of a driver.

Each check drives a FRESH driver (``AdapterDriver``) through requests and steps with random
logits, and compares every processed row with what ``docs/specs.md`` says (``oracle``). A check
raises ``AssertionError`` (with the reason) when the adapter is wrong and ``Skip`` when it does
not apply to this driver; anything else it raises is a failure too.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from dynlogits.policy.roles import DisaggregationMode
from dynlogits.processors.base import SamplingView
from dynlogits.specs import WIRE_KEY, ForcedTokenSequenceSpec, LogitsProcessorSpec, encode_entries, kinds
from dynlogits.specs.prompt_limit import PROMPT_BOUND_KINDS
from dynlogits.specs.schema import golden_vectors

from . import plugin_factories, plugin_kinds
from .driver import AdapterDriver, EngineReadFaults
from .faults import BAN_ID_FACTORY, RAISE_AFTER_FACTORY, SCALE_FACTORY
from .oracle import OracleRequest, expected_row

__all__ = ["CHECKS", "Check", "Skip"]

#: The operator's allow-list of ``python`` factories (documented in README.md, "Plugging a processor
#: in"); named here rather than imported so the kit depends on the SDK's public contract only.
PYTHON_FACTORIES_ENV = "DYN_LOGITS_PYTHON_FACTORIES"

EOS = 1
PROMPT = (3, 4, 5)
STEPS = 6


class Skip(Exception):
    """The check does not apply to this driver; the message says why."""


@dataclass(frozen=True)
class Check:
    name: str
    doc: str
    run: Callable[[AdapterDriver], None]


# -- helpers ---------------------------------------------------------------------------------
@contextmanager
def _allow_python(*factories: str) -> Iterator[None]:
    old = os.environ.get(PYTHON_FACTORIES_ENV)
    os.environ[PYTHON_FACTORIES_ENV] = ",".join(factories)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PYTHON_FACTORIES_ENV, None)
        else:
            os.environ[PYTHON_FACTORIES_ENV] = old


def _logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def _assert_row(actual: torch.Tensor, expected: Sequence[float], what: str) -> None:
    got = actual.tolist()
    if len(got) != len(expected):
        raise AssertionError(f"{what}: row width {len(got)}, expected {len(expected)}")
    for i, (a, e) in enumerate(zip(got, expected)):
        same = (a == e) if (math.isinf(e) or math.isinf(a)) else math.isclose(a, e, rel_tol=1e-5, abs_tol=1e-5)
        if not same:
            raise AssertionError(f"{what}: logit {i} is {a}, expected {e}")


def _assert_stopped(row: torch.Tensor, eos: int, what: str) -> None:
    finite = torch.isfinite(row).nonzero().flatten().tolist()
    if finite != [eos] or float(row[eos]) != 0.0:
        raise AssertionError(f"{what}: expected the row fail-stopped to token {eos}, finite logits at {finite[:8]}")


def _forced(ids: Sequence[int], eos: int = EOS) -> list[dict[str, Any]]:
    return encode_entries([ForcedTokenSequenceSpec(token_ids=tuple(ids), eos_token_id=eos)])


def _step(driver: AdapterDriver, batch: Sequence[str], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    raw = _logits(len(batch), driver.vocab_size, seed)
    out = driver.step(list(batch), raw.clone())
    if out.shape != raw.shape:
        raise AssertionError(f"step returned shape {tuple(out.shape)} for {tuple(raw.shape)}")
    return raw, out


def _greedy(row: torch.Tensor) -> int:
    return int(row.argmax())


def _max_id(payload: Any) -> int:
    best = -1
    for e in payload:
        for key in ("token_ids", "start_token_ids", "end_token_ids", "stop_token_ids"):
            best = max([best, *e.get(key, ())])
        for key in ("eos_token_id",):
            if e.get(key) is not None:
                best = max(best, e[key])
        best = max([best, *(int(k) for k in e.get("bias", {}))])
    return best


#: A rule that lists the kinds in force (``unknown kind 'x' (expected one of 'a', 'b')``): the golden
#: vectors list the built-in kinds only, and every installed or registered plug-in kind joins the list.
_KIND_LIST = re.compile(r"(?P<head>.*\(expected one of )(?P<kinds>'[^)]*')\)")
_KIND_NAME = re.compile(r"'([^']*)'")


def _names_the_error(message: str, expected: str) -> bool:
    """Whether ``message`` (an admission error) carries the golden error ``expected``: verbatim, or,
    for a rule listing the kinds in force, with the same path and rule, every kind the vector lists,
    and otherwise only plug-in kinds in force in this process (in any order)."""
    if expected in message:
        return True
    golden = _KIND_LIST.fullmatch(expected)
    if golden is None:
        return False
    want = set(_KIND_NAME.findall(golden["kinds"]))
    found = re.search(re.escape(golden["head"]) + r"((?:'[^']*'(?:, )?)*)\)", message)
    if found is None:
        return False
    listed = set(_KIND_NAME.findall(found.group(1)))
    return want <= listed and listed - want <= set(kinds.plugin_kinds())


def _with_scale_factory(payload: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The vector with each ``python`` entry pointed at the kit's own allow-listed factory."""
    return [{**e, "factory": SCALE_FACTORY} if e.get("kind") == "python" else e for e in payload]


def _bad_beside_good(driver: AdapterDriver, bad: Any, good: list[dict[str, Any]], *, steps: int, stopped_from: int,
                     what: str, report_says: str) -> None:
    """Run request ``bad`` beside ``good`` for ``steps`` steps: ``bad``'s row is untouched before
    step ``stopped_from`` and fail-stopped from it on; ``good``'s row is as documented throughout;
    exactly one failure is reported, containing ``report_says``."""
    driver.add("bad", bad, prompt_ids=PROMPT, eos_token_id=EOS)
    driver.add("good", good, prompt_ids=PROMPT, eos_token_id=EOS)
    history: list[int] = []
    for step in range(steps):
        raw, out = _step(driver, ["bad", "good"], seed=step)
        if step < stopped_from:
            _assert_row(out[0], raw[0].tolist(), f"{what} before its fault, step {step}")
        else:
            _assert_stopped(out[0], EOS, f"{what}, step {step}")
        _assert_row(out[1], expected_row(good, history, raw[1].tolist()), f"other request at step {step}")
        driver.commit("bad", _greedy(out[0]))
        token = _greedy(out[1])
        driver.commit("good", token)
        history.append(token)
    reports = driver.failures()
    if len(reports) != 1 or report_says not in reports[0]:
        raise AssertionError(f"expected one failure report containing {report_says!r}, got {reports!r}")


# -- checks ----------------------------------------------------------------------------------
def _reads_prompt(payload: Any) -> bool:
    return any(isinstance(e, dict) and e.get("kind") in PROMPT_BOUND_KINDS for e in payload)


def _request(arrival: float, temperature: float | None = None) -> OracleRequest:
    """What the oracle knows of a kit request added at ``arrival`` with ``PROMPT`` and ``EOS``, now
    (``temperature``: what the driver's requests sample at, its ``temperature`` attribute if any)."""
    return OracleRequest(prompt=PROMPT, stop_token_ids=(EOS,), arrival=arrival, now=time.time(), temperature=temperature)


def valid_vectors_behave_as_documented(driver: AdapterDriver) -> None:
    """Every valid golden vector is admitted, realized, and changes each row exactly as
    docs/specs.md says, step after step (greedy histories); a vector naming ids beyond the logits
    width fails only its own request; ``python`` entries need the operator's allow-list. Vectors of
    kinds that read the prompt run in ``prompt_bound_vectors_behave_as_documented``."""
    vectors = [(name, v["payload"]) for name, v in golden_vectors() if v["valid"] and not _reads_prompt(v["payload"])]
    if not vectors:
        raise AssertionError("no valid golden vectors found")
    for n, (name, payload) in enumerate(vectors):
        if any(e.get("kind") == "python" for e in payload):
            try:
                driver.admit(payload)
            except ValueError as err:
                if ".factory" not in str(err) or "allow-listed" not in str(err):
                    raise AssertionError(f"{name}: rejected for another reason than the allow-list: {err}") from None
            else:
                raise AssertionError(f"{name}: a python entry was admitted without the operator's allow-list")
            payload = _with_scale_factory(payload)
        beyond = _max_id(payload) >= driver.vocab_size
        with _allow_python(SCALE_FACTORY):
            try:
                driver.admit(payload)
            except ValueError as err:
                if not beyond or "vocab size" not in str(err):
                    raise AssertionError(f"{name}: a valid vector was refused at admission: {err}") from None
                continue  # refused at admission for naming ids beyond the logits width: allowed
            req = f"v{n}"
            arrival = time.time()  # no later than the adapter's own clock at realization
            driver.add(req, payload, prompt_ids=PROMPT, eos_token_id=EOS)
            history: list[int] = []
            for step in range(STEPS):
                raw, out = _step(driver, [req], seed=100 * n + step)
                what = f"{name} step {step}"
                if beyond:
                    _assert_stopped(out[0], EOS, what + " (ids beyond the logits width)")
                else:
                    request = _request(arrival, getattr(driver, "temperature", None))
                    _assert_row(out[0], expected_row(payload, history, raw[0].tolist(), request), what)
                token = _greedy(out[0])
                driver.commit(req, token)
                history.append(token)
            driver.remove(req)
            if beyond and len(driver.failures()) < 1:
                raise AssertionError(f"{name}: the failed request was not reported")


def invalid_vectors_are_rejected_naming_the_field(driver: AdapterDriver) -> None:
    """Every invalid golden vector is refused at admission with its expected error path(s) (a rule
    listing the kinds in force may add the installed plug-in kinds to the vector's list)."""
    vectors = [(name, v) for name, v in golden_vectors() if not v["valid"]]
    if not vectors:
        raise AssertionError("no invalid golden vectors found")
    for name, vector in vectors:
        expected = vector.get("errors") or [vector["error"]]
        try:
            driver.admit(vector["payload"])
        except ValueError as err:
            message = str(err)
            missing = [e for e in expected if not _names_the_error(message, e)]
            if missing:
                raise AssertionError(f"{name}: error {message!r} does not contain {missing}") from None
        else:
            raise AssertionError(f"{name}: admitted, expected {expected}")


def state_is_fresh_per_request(driver: AdapterDriver) -> None:
    """Two requests with the same payload at different positions do not interfere."""
    ids = [10, 11, 12, 13, 14]
    payload = _forced(ids)
    driver.add("a", payload, prompt_ids=PROMPT, eos_token_id=EOS)
    for step in range(2):
        _, out = _step(driver, ["a"], seed=step)
        driver.commit("a", _greedy(out[0]))
    driver.add("b", payload, prompt_ids=(7, 8), eos_token_id=EOS)
    for step in range(3):
        raw, out = _step(driver, ["a", "b"], seed=10 + step)
        _assert_row(out[0], expected_row(payload, ids[: 2 + step], raw[0].tolist()), f"a at step {2 + step}")
        _assert_row(out[1], expected_row(payload, ids[:step], raw[1].tolist()), f"b at step {step}")
        driver.commit("a", _greedy(out[0]))
        driver.commit("b", _greedy(out[1]))


def no_state_is_left_after_requests_end(driver: AdapterDriver) -> None:
    """Ended requests leave no per-request state (slot engines: none once their slots are reused)."""
    names = ["r0", "r1", "r2"]
    for i, name in enumerate(names):
        driver.add(name, _forced([20 + i]), prompt_ids=PROMPT, eos_token_id=EOS)
    _step(driver, names, seed=1)
    if driver.held_requests() != len(names):
        raise AssertionError(f"holds state for {driver.held_requests()} requests, expected {len(names)}")
    for name in names:
        driver.remove(name)
    if not driver.releases_on_finish:
        for i in range(len(names)):
            driver.add(f"plain{i}", None, prompt_ids=PROMPT, eos_token_id=EOS)
        _step(driver, [f"plain{i}" for i in range(len(names))], seed=2)
    if driver.held_requests() != 0:
        raise AssertionError(f"still holds state for {driver.held_requests()} requests after they ended")


def rows_follow_their_requests_when_the_batch_changes(driver: AdapterDriver) -> None:
    """Row <-> request mapping holds when the batch is shuffled, shrinks and grows."""
    seqs = {f"q{i}": [30 + 8 * i + k for k in range(8)] for i in range(4)}
    history: dict[str, list[int]] = {q: [] for q in seqs}
    for q, ids in seqs.items():
        driver.add(q, _forced(ids), prompt_ids=PROMPT, eos_token_id=EOS)
    driver.add("free", None, prompt_ids=PROMPT, eos_token_id=EOS)
    layouts = [["q0", "q1", "q2", "q3", "free"], ["q2", "free", "q0"], ["q3", "q1", "q0", "free", "q2"], ["q1", "q3"]]
    for step, batch in enumerate(layouts):
        raw, out = _step(driver, batch, seed=50 + step)
        for row, q in enumerate(batch):
            if q == "free":
                _assert_row(out[row], raw[row].tolist(), f"request without payload, row {row}, step {step}")
                continue
            _assert_row(out[row], expected_row(_forced(seqs[q]), history[q], raw[row].tolist()), f"{q} in row {row}, step {step}")
            token = _greedy(out[row])
            driver.commit(q, token)
            history[q].append(token)
        if "free" in batch:
            driver.commit("free", _greedy(out[batch.index("free")]))


def preempted_requests_resume_where_they_were(driver: AdapterDriver) -> None:
    """A request removed and re-added with its generated tokens continues from the same position."""
    ids = [40, 41, 42, 43, 44, 45]
    payload = _forced(ids)
    driver.add("p", payload, prompt_ids=PROMPT, eos_token_id=EOS)
    done: list[int] = []
    for step in range(3):
        _, out = _step(driver, ["p"], seed=step)
        token = _greedy(out[0])
        driver.commit("p", token)
        done.append(token)
    driver.remove("p")
    driver.add("p", payload, prompt_ids=PROMPT, output_ids=done, eos_token_id=EOS)
    raw, out = _step(driver, ["p"], seed=9)
    _assert_row(out[0], expected_row(payload, done, raw[0].tolist()), "resumed request")
    if _greedy(out[0]) != ids[3]:
        raise AssertionError(f"resumed request produced {_greedy(out[0])}, expected {ids[3]}")


def prefill_and_encode_workers_activate_nothing(driver: AdapterDriver) -> None:
    """Activation puts the payload on aggregated and decode workers only."""
    spec = LogitsProcessorSpec(entries=(ForcedTokenSequenceSpec(token_ids=(5, 6), eos_token_id=EOS),))
    want = encode_entries(spec.entries)
    for role in (DisaggregationMode.AGGREGATED, DisaggregationMode.DECODE):
        got = driver.activate(spec, role)
        if got != want:
            raise AssertionError(f"{role.value} worker activated {got!r}, expected {want!r}")
    for role in (DisaggregationMode.PREFILL, DisaggregationMode.ENCODE):
        got = driver.activate(spec, role)
        if got:
            raise AssertionError(f"{role.value} worker activated {got!r}, expected nothing")
    if driver.activate(None, DisaggregationMode.AGGREGATED):
        raise AssertionError("no spec, yet a payload was activated")


def a_raising_processor_fails_only_its_request(driver: AdapterDriver) -> None:
    """A processor that raises fail-stops its own request (reported once); the others go on."""
    bad = [{"kind": "python", "factory": RAISE_AFTER_FACTORY, "kwargs": {"after": 1}}]
    good = _forced([60, 61, 62, 63])
    with _allow_python(RAISE_AFTER_FACTORY):
        driver.admit(bad)
        _bad_beside_good(driver, bad, good, steps=3, stopped_from=1, what="raising request", report_says="injected fault")


def ids_beyond_the_logits_width_fail_only_their_request(driver: AdapterDriver) -> None:
    """An id >= the logits width is refused at admission naming the field, or fail-stops only
    its own request from its first row (the width may be unknown at admission)."""
    bad = [{"kind": "banned_tokens", "token_ids": [driver.vocab_size]}]
    good = _forced([70, 71])
    try:
        driver.admit(bad)
    except ValueError as err:
        if f"{WIRE_KEY}[0].token_ids[0]" not in str(err):
            raise AssertionError(f"admission error does not name the field: {err}") from None
        return
    _bad_beside_good(driver, bad, good, steps=2, stopped_from=0, what=f"request naming id {driver.vocab_size}",
                     report_says="vocab size")


def a_row_operation_beyond_the_width_fails_only_its_request(driver: AdapterDriver) -> None:
    """A processor (plug-in or ``python``) whose batched row operation names an id beyond the
    logits width fail-stops its own request (reported once) instead of reaching a tensor op that
    would fail the whole batch; the others are applied in full."""
    bad = [{"kind": "python", "factory": BAN_ID_FACTORY, "kwargs": {"token_id": driver.vocab_size}}]
    good = _forced([80, 81, 82])
    with _allow_python(BAN_ID_FACTORY):
        driver.admit(bad)
        _bad_beside_good(driver, bad, good, steps=2, stopped_from=0, what="request whose row op is out of range",
                         report_says="outside the logits width")


def a_raising_plugin_kind_fails_only_its_request(driver: AdapterDriver) -> None:
    """A plug-in kind (the kit's own ``kit.raise_after``, ``dynlogits.testing.plugin_kinds``) whose
    processor raises fail-stops its own request (reported once); the others go on."""
    bad = [{"kind": "kit.raise_after", "after": 1}]
    with plugin_kinds.registered():
        driver.admit(bad)
        _bad_beside_good(driver, bad, _forced([64, 65, 66, 67]), steps=3, stopped_from=1,
                         what="raising plug-in request", report_says="injected fault")


def a_plugin_kind_that_empties_its_row_fails_only_its_request(driver: AdapterDriver) -> None:
    """A plug-in kind's processor (``kit.keep_only``) that restricts its row to ids another entry
    banned leaves no finite logit: that request is fail-stopped from that step and reported once
    (its row is checked whole: the adapter cannot know what an opaque processor kept); the others
    are applied in full."""
    kept = [84, 85]
    bad = [{"kind": "banned_tokens", "token_ids": kept}, {"kind": "kit.keep_only", "token_ids": kept}]
    with plugin_kinds.registered():
        driver.admit(bad)
        _bad_beside_good(driver, bad, _forced([86, 87, 88]), steps=2, stopped_from=0,
                         what="request a plug-in left with no finite logit", report_says="no token left to sample")


def a_plugin_row_operation_beyond_the_width_fails_only_its_request(driver: AdapterDriver) -> None:
    """A plug-in kind (``kit.ban_beyond``) whose row operation names an id beyond the logits width
    fail-stops its own request (reported once); the others are applied in full."""
    bad = [{"kind": "kit.ban_beyond", "beyond": 0}]
    with plugin_kinds.registered():
        driver.admit(bad)
        _bad_beside_good(driver, bad, _forced([94, 95, 96]), steps=2, stopped_from=0,
                         what="plug-in request whose row op is out of range", report_says="outside the logits width")


def _context_is(seen: dict[str, list[Any]], tag: str, want: dict[str, Any], what: str) -> None:
    """Every context ``kit.facts`` recorded under ``tag`` holds ``want`` (a value, or a predicate)."""
    if not seen.get(tag):
        raise AssertionError(f"{what}: the plug-in factory was never called")
    for ctx in seen[tag]:
        for name, value in want.items():
            got = getattr(ctx, name)
            if not (value(got) if callable(value) else got == value):
                raise AssertionError(f"{what}: the factory was given {name}={got!r}, expected "
                                     f"{'a value in range' if callable(value) else repr(value)}")


def a_plugin_factory_is_given_the_request_facts(driver: AdapterDriver) -> None:
    """A plug-in kind's factory (``kit.facts``) is given exactly its request's facts in its
    ``RealizeContext``: the logits width, the prompt (for a resumed request too, without the tokens
    it generated), the stop ids (its EOS first, then the others ascending), the arrival the
    deployment stamped (unstamped: a time during its realization) and its payload's reasoning
    delimiters, a request id for logs and a ``SamplingView``; its processor, which keeps the prompt's
    and stop ids' logits only, acts on its rows."""
    arrival = time.time() - 3600.0  # stamped an hour ago: never mistaken for the realization time
    stamped = [{"kind": "reasoning", "start_token_ids": [50], "end_token_ids": [51]}, {"kind": "kit.facts", "tag": "stamped"}]
    plain = [{"kind": "kit.facts", "tag": "plain"}]
    prompts = {"stamped": (3, 4, 50, 9), "plain": (12, 13)}
    stops = (7, 2)
    kept = {"stamped": {*prompts["stamped"], EOS, *stops}, "plain": {*prompts["plain"], EOS}}
    done: dict[str, list[int]] = {"stamped": [], "plain": []}

    def run(batch: list[str], steps: int, seed: int) -> None:
        for step in range(steps):
            raw, out = _step(driver, batch, seed=seed + step)
            for row, req in enumerate(batch):
                want = [v if i in kept[req] else -math.inf for i, v in enumerate(raw[row].tolist())]
                _assert_row(out[row], want, f"{req} at step {step} (the plug-in keeps its prompt's and stop ids' logits)")
                driver.commit(req, _greedy(out[row]))
                done[req].append(_greedy(out[row]))

    with plugin_kinds.registered(), plugin_factories.recording() as seen:
        driver.admit(stamped)
        driver.admit(plain)
        before = time.time()
        driver.add("stamped", stamped, prompt_ids=prompts["stamped"], eos_token_id=EOS, stop_token_ids=stops,
                   arrival_time=arrival)
        driver.add("plain", plain, prompt_ids=prompts["plain"], eos_token_id=EOS)
        run(["stamped", "plain"], 2, seed=70)
        after = time.time()
        _context_is(seen, "stamped", {"vocab_size": driver.vocab_size, "prompt_ids": prompts["stamped"],
                                      "stop_token_ids": (EOS, *sorted(stops)), "arrival_time": arrival,
                                      "reasoning": ((50,), (51,)), "request_id": lambda v: isinstance(v, str) and v,
                                      "sampling": lambda v: isinstance(v, SamplingView)},
                    "request with a stamped arrival")
        _context_is(seen, "plain", {"vocab_size": driver.vocab_size, "prompt_ids": prompts["plain"],
                                    "stop_token_ids": (EOS,), "arrival_time": lambda t: before <= t <= after,
                                    "reasoning": None}, "request without a stamped arrival")
        driver.remove("stamped")
        seen.clear()
        driver.add("stamped", stamped, prompt_ids=prompts["stamped"], output_ids=done["stamped"], eos_token_id=EOS,
                   stop_token_ids=stops, arrival_time=arrival)
        run(["stamped"], 1, seed=80)
        _context_is(seen, "stamped", {"prompt_ids": prompts["stamped"], "arrival_time": arrival},
                    "request resumed after preemption")


#: What an adapter reports when it gave a prompt-bound kind no prompt (``processors.prompt_tokens``).
_NO_PROMPT = "needs the request's prompt"


def prompt_bound_vectors_behave_as_documented(driver: AdapterDriver) -> None:
    """Every valid golden vector of a kind that reads the request's prompt (``PROMPT_BOUND_KINDS``)
    changes each row as docs/specs.md says for the prompt the request was added with, step after
    step, and again after the request is preempted and resumed (the prompt, never its generated
    tokens). Skipped, naming the missing fact, where the adapter gives realization no prompt ids."""
    vectors = [(name, v["payload"]) for name, v in golden_vectors() if v["valid"] and _reads_prompt(v["payload"])]
    if not vectors:
        raise AssertionError("no valid golden vectors of a prompt-bound kind found")
    for n, (name, payload) in enumerate(vectors):
        driver.admit(payload)

        def no_prompt() -> None:
            if any(_NO_PROMPT in r for r in driver.failures()):
                raise Skip(f"{driver.name}: the adapter gives realization no prompt ids (RequestFacts.prompt_ids): "
                           f"{driver.failures()[0]}")

        _greedy_with_a_resume(driver, f"p{n}", payload, _request(time.time()), seed=300 + 100 * n, name=name,
                              after_first_step=no_prompt)


def _greedy_with_a_resume(driver: AdapterDriver, req: str, payload: Any, oracle: OracleRequest, *, seed: int, name: str,
                          after_first_step: Callable[[], None] | None = None) -> None:
    """``req`` (``payload``, ``oracle.prompt``) for ``STEPS`` greedy steps, each row as the oracle
    says at the time of the step, preempted and resumed with what it generated half-way, then removed."""
    prompt, history = tuple(oracle.prompt), list[int]()
    driver.add(req, payload, prompt_ids=prompt, eos_token_id=EOS)
    for step in range(STEPS):
        if step == STEPS // 2:  # preempted, then resumed with what it generated
            driver.remove(req)
            driver.add(req, payload, prompt_ids=prompt, output_ids=history, eos_token_id=EOS)
        raw, out = _step(driver, [req], seed=seed + step)
        if step == 0 and after_first_step is not None:
            after_first_step()
        now = replace(oracle, now=time.time())
        _assert_row(out[0], expected_row(payload, history, raw[0].tolist(), now), f"{name} step {step}")
        token = _greedy(out[0])
        driver.commit(req, token)
        history.append(token)
    driver.remove(req)


def _no_prompt(driver: AdapterDriver) -> str | None:
    """Why the adapter gives realization no prompt ids (probed with a ``prompt_tokens`` request),
    or ``None`` when it gives them."""
    before = len(driver.failures())
    driver.add("prompt-probe", [{"kind": "prompt_tokens", "mode": "boost", "boost": 1.0}], prompt_ids=PROMPT,
               eos_token_id=EOS)
    _step(driver, ["prompt-probe"], seed=7)
    driver.remove("prompt-probe")
    reports = [r for r in driver.failures()[before:] if _NO_PROMPT in r]
    return f"{driver.name}: the adapter gives realization no prompt ids (RequestFacts.prompt_ids): {reports[0]}" if reports else None


def vectors_with_their_own_prompt_behave_as_documented(driver: AdapterDriver) -> None:
    """Every valid golden vector that names its own ``prompt`` (a reasoning span the prompt opens,
    docs/specs.md ``reasoning``) changes each row as documented for that prompt, step after step
    (greedy histories), and again after the request is preempted and resumed. Skipped, naming the
    missing fact, where the adapter gives realization no prompt ids."""
    vectors = [(name, v) for name, v in golden_vectors() if v["valid"] and "prompt" in v]
    if not vectors:
        raise AssertionError("no valid golden vector names its own prompt")
    why = _no_prompt(driver)
    if why is not None:
        raise Skip(why)
    for n, (name, vector) in enumerate(vectors):
        driver.admit(vector["payload"])
        oracle = OracleRequest(prompt=tuple(vector["prompt"]), stop_token_ids=(EOS,))
        _greedy_with_a_resume(driver, f"own-prompt{n}", vector["payload"], oracle, seed=700 + 100 * n, name=name)


#: A request with reasoning delimiters 20 / 21 and an entry scoped to each phase: in reasoning the
#: sequence 22, 23 and then the end tag 21 is forced; in the answer 30 and 31 are banned, EOS is
#: masked for its first two tokens and 40 is raised.
_SCOPED: list[dict[str, Any]] = [
    {"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21]},
    {"kind": "forced_sequence", "token_ids": [22, 23, 21], "eos_token_id": EOS, "scope": "reasoning"},
    {"kind": "banned_tokens", "token_ids": [30, 31], "scope": "answer"},
    {"kind": "min_tokens", "min_tokens": 2, "stop_token_ids": [EOS], "scope": "answer"},
    {"kind": "logit_bias", "bias": {"40": 5.0}, "scope": "answer"},
]


def scoped_entries_act_in_their_phase_only(driver: AdapterDriver) -> None:
    """Entries scoped to ``reasoning`` or ``answer`` act only at that phase's steps and count their
    positions from the start of the phase's current stretch: two requests in one batch, one whose
    prompt opened a span and one that opens spans itself (twice), their answer tokens chosen by the
    kit among those the row kept, and the first preempted and resumed inside a span."""
    driver.admit(_SCOPED)
    prompts = {"opens": PROMPT, "opened": (3, 20)}  # "opened": generation starts inside a span
    script = {"opens": [40, 20, None, None, None, 40, 41, 20, None],  # None: the greedy (forced) token
              "opened": [None, None, None, 40, 41, 42, 7, 20, None]}
    history: dict[str, list[int]] = {req: [] for req in script}
    for req, prompt in prompts.items():
        driver.add(req, _SCOPED, prompt_ids=prompt, eos_token_id=EOS)
    for step in range(len(script["opens"])):
        if step == 3:  # "opens" is inside its span (22 written, 23 due): preempted, resumed
            driver.remove("opens")
            driver.add("opens", _SCOPED, prompt_ids=prompts["opens"], output_ids=history["opens"], eos_token_id=EOS)
        raw, out = _step(driver, ["opened", "opens"], seed=800 + step)
        for row, req in enumerate(["opened", "opens"]):
            want = expected_row(_SCOPED, history[req], raw[row].tolist(),
                                OracleRequest(prompt=prompts[req], stop_token_ids=(EOS,)))
            _assert_row(out[row], want, f"{req} at step {step}")
            token = script[req][step]
            token = _greedy(out[row]) if token is None else token
            if not math.isfinite(float(out[row, token])):
                raise AssertionError(f"{req} at step {step}: the kit's token {token} was masked")
            driver.commit(req, token)
            history[req].append(token)


def a_trigger_fires_once_per_request_on_its_own_history(driver: AdapterDriver) -> None:
    """Two requests with the same ``trigger`` entry, in one batch: each forces the phrase after its
    own first occurrence of the trigger, once, whatever the other does (histories chosen by the
    kit, the phrase's tokens committed as forced)."""
    payload = [{"kind": "trigger", "trigger_token_ids": [40, 41], "phrase_token_ids": [42, 43]}]
    driver.admit(payload)
    script = {"a": [40, 41, None, None, 40, 41, 7], "b": [41, 40, 40, 41, None, None, 40]}  # None: the forced token
    history: dict[str, list[int]] = {"a": [], "b": []}
    for req in script:
        driver.add(req, payload, prompt_ids=PROMPT, eos_token_id=EOS)
    for step in range(len(script["a"])):
        raw, out = _step(driver, ["b", "a"], seed=500 + step)
        for row, req in enumerate(["b", "a"]):
            _assert_row(out[row], expected_row(payload, history[req], raw[row].tolist()), f"{req} at step {step}")
            token = script[req][step]
            token = _greedy(out[row]) if token is None else token
            driver.commit(req, token)
            history[req].append(token)


def _takes_arrival(driver: AdapterDriver) -> bool:
    try:
        return "arrival_time" in inspect.signature(driver.add).parameters
    except (TypeError, ValueError):
        return False


def a_deadline_forces_the_stop_token_once_due(driver: AdapterDriver) -> None:
    """A ``deadline`` counts from the arrival the deployment stamped: a request that arrived before
    its deadline's length has its stop token (its EOS, the first of its stop ids) forced at every
    step, after preemption too; one due in an hour is untouched; one due while it runs is untouched
    at a step that ran before its due time and stopped from the first step after it (a bounded wait
    on the clock, no fixed sleep). Skipped where the driver cannot stamp an arrival."""
    if not _takes_arrival(driver):
        raise Skip(f"{driver.name}: its add() takes no arrival_time, so the kit cannot stamp a request's arrival "
                   "(RequestFacts.arrival_time)")
    late, later = [{"kind": "deadline", "seconds": 60}], [{"kind": "deadline", "seconds": 3600}]
    soon_s = 0.5
    soon = [{"kind": "deadline", "seconds": soon_s}]
    for payload in (late, later, soon):
        driver.admit(payload)
    now = time.time()
    arrivals = {"late": now - 120.0, "later": now, "soon": now}
    payloads = {"late": late, "later": later, "soon": soon}
    for req in payloads:
        driver.add(req, payloads[req], prompt_ids=PROMPT, eos_token_id=EOS, stop_token_ids=(7,), arrival_time=arrivals[req])
    batch = list(payloads)
    due = arrivals["soon"] + soon_s
    started = time.time()
    raw, out = _step(driver, batch, seed=600)
    ended = time.time()
    _assert_stopped(out[0], EOS, "a request past its deadline")
    _assert_row(out[1], raw[1].tolist(), "a request due in an hour")
    if ended < due:
        _assert_row(out[2], raw[2].tolist(), "a request before its deadline")
    elif started >= due:
        _assert_stopped(out[2], EOS, "a request past its deadline")
    for row, req in enumerate(batch):
        driver.commit(req, _greedy(out[row]))
    limit = due + 30.0  # a bounded wait on the clock
    while time.time() < due:
        if time.time() > limit:
            raise AssertionError("the clock did not reach the deadline")
        time.sleep(min(0.02, max(0.0, due - time.time())))
    driver.remove("late")  # preempted: resumed with its tokens, still past its deadline
    driver.add("late", late, prompt_ids=PROMPT, output_ids=[EOS], eos_token_id=EOS, stop_token_ids=(7,),
               arrival_time=arrivals["late"])
    raw, out = _step(driver, batch, seed=601)
    _assert_stopped(out[0], EOS, "a resumed request past its deadline")
    _assert_row(out[1], raw[1].tolist(), "a request due in an hour")
    _assert_stopped(out[2], EOS, "a request whose deadline passed while it ran")
    if driver.failures():
        raise AssertionError(f"a deadline is not a failure, yet the adapter reported {driver.failures()!r}")


def forcing_never_unmasks_a_token_the_engine_masked(driver: AdapterDriver) -> None:
    """A forced token the engine already masked (its grammar bitmask: ``-inf`` in the logits the
    adapter receives) stays masked: that request has no token left, so it is fail-stopped and
    reported once, naming the position; a request forcing the same token in an unmasked row is
    forced as documented."""
    payload = _forced([90, 91, 92])
    driver.add("masked", payload, prompt_ids=PROMPT, eos_token_id=EOS)
    driver.add("free", payload, prompt_ids=PROMPT, eos_token_id=EOS)
    raw = _logits(2, driver.vocab_size, seed=5)
    raw[0, 90] = -math.inf  # the engine's grammar forbids the forced token in the first row only
    out = driver.step(["masked", "free"], raw.clone())
    _assert_stopped(out[0], EOS, "row whose forced token the engine masked")
    _assert_row(out[1], expected_row(payload, [], raw[1].tolist()), "the other request")
    driver.commit("masked", _greedy(out[0]))
    driver.commit("free", 90)
    raw = _logits(2, driver.vocab_size, seed=6)
    out = driver.step(["masked", "free"], raw.clone())
    _assert_stopped(out[0], EOS, "the failed request at its next step")
    _assert_row(out[1], expected_row(payload, [90], raw[1].tolist()), "the other request at its next step")
    reports = driver.failures()
    if len(reports) != 1 or "no token left to sample at output position 0" not in reports[0]:
        raise AssertionError(f"expected one failure report saying no token was left at position 0, got {reports!r}")


def a_failed_engine_read_fails_only_its_request(driver: AdapterDriver) -> None:
    """Whatever the adapter reads from the engine's objects at each step (a request's committed
    length, its token list, a slot table) is read so that a read that fails (the attribute is
    missing on this engine version, or holds something unexpected) fail-stops that request only,
    reported once; it never raises into the engine's sampler, and the others are applied in full.
    Drivers opt in with ``break_engine_reads(req_id)`` (``EngineReadFaults``)."""
    if not isinstance(driver, EngineReadFaults):
        raise Skip("the driver has no break_engine_reads: its adapter reads no engine object per step")
    bad, good = _forced([100, 101, 102]), _forced([110, 111, 112])
    driver.add("bad", bad, prompt_ids=PROMPT, eos_token_id=EOS)
    driver.add("good", good, prompt_ids=PROMPT, eos_token_id=EOS)
    driver.break_engine_reads("bad")
    history: list[int] = []
    for step in range(3):
        raw, out = _step(driver, ["bad", "good"], seed=step)
        _assert_stopped(out[0], EOS, f"request whose engine object lost what the adapter reads, step {step}")
        _assert_row(out[1], expected_row(good, history, raw[1].tolist()), f"other request at step {step}")
        driver.commit("bad", EOS)
        token = _greedy(out[1])
        driver.commit("good", token)
        history.append(token)
    reports = driver.failures()
    if len(reports) != 1:
        raise AssertionError(f"expected one failure report for the broken engine read, got {reports!r}")


def _check(fn: Callable[[AdapterDriver], None]) -> Check:
    return Check(fn.__name__, (fn.__doc__ or "").split("\n")[0], fn)


CHECKS: tuple[Check, ...] = tuple(
    _check(f)
    for f in (
        valid_vectors_behave_as_documented,
        invalid_vectors_are_rejected_naming_the_field,
        state_is_fresh_per_request,
        no_state_is_left_after_requests_end,
        rows_follow_their_requests_when_the_batch_changes,
        preempted_requests_resume_where_they_were,
        prefill_and_encode_workers_activate_nothing,
        a_raising_processor_fails_only_its_request,
        ids_beyond_the_logits_width_fail_only_their_request,
        a_row_operation_beyond_the_width_fails_only_its_request,
        a_raising_plugin_kind_fails_only_its_request,
        a_plugin_kind_that_empties_its_row_fails_only_its_request,
        a_plugin_row_operation_beyond_the_width_fails_only_its_request,
        a_plugin_factory_is_given_the_request_facts,
        prompt_bound_vectors_behave_as_documented,
        vectors_with_their_own_prompt_behave_as_documented,
        scoped_entries_act_in_their_phase_only,
        a_trigger_fires_once_per_request_on_its_own_history,
        a_deadline_forces_the_stop_token_once_due,
        forcing_never_unmasks_a_token_the_engine_masked,
        a_failed_engine_read_fails_only_its_request,
    )
)
