"""``python -m dynlogits.tools.bench admission``: ms of admission CPU per consistency check for named
worst payloads within the default limits, admitted or refused, against the 50 ms target.

Each family is a payload shape built to be costly for one part of the checks (choices met by
phrases, bans or triggers; forced sequences through phrase automata; position grids; ``min_tokens``
unions; thinking budgets; triggers; 131,072-id allowed sets as ``prompt_tokens`` ``restrict``
realizes them), grown by one knob. For each family the bench finds the largest knob the admission
work budget (``max_admission_work``) admits and times that payload and the next one (refused by the
budget), each check on a cold verdict memo (``consistency.VERDICTS`` cleared), as CPU time
(``time.process_time``), side by side in one run. Realistic payloads are timed too, with their
share of the budget. No torch."""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dynlogits.specs import SpecError
from dynlogits.specs.admission_work import admission_work
from dynlogits.specs.consistency import VERDICTS, check_consistency
from dynlogits.specs.entries import AllowedTokensSpec
from dynlogits.specs.limits import DEFAULT_LIMITS, SpecLimits
from dynlogits.specs.wire import decode_entries, decode_wire_payload

__all__ = ["CASES", "Case", "Row", "main", "measure", "run"]

#: The target: the worst payload within the default limits costs at most this much admission CPU.
TARGET_MS = 50.0
VOCAB = 151_936  # Qwen's logits width
REASONING = {"kind": "reasoning", "start_token_ids": [151_667], "end_token_ids": [151_668]}

Build = Callable[[int], tuple[list[Any], int | None]]
#: the wire payload each ``_wire`` built last, by the id of its decoded entries (the whole admission is timed on it)
_WIRE: dict[int, list[dict[str, Any]]] = {}


@dataclass(frozen=True)
class Case:
    """A named payload family: ``build(knob)`` gives the wire entries (decoded) and the vocabulary
    size; ``knob`` is the range searched for the largest payload the budget admits (``None``: one
    fixed payload)."""

    name: str
    what: str
    build: Build
    knob: tuple[int, int] | None = None
    realistic: bool = False


def _wire(payload: list[dict[str, Any]], vocab: int | None = VOCAB) -> tuple[list[Any], int | None]:
    entries = list(decode_entries(payload))
    _WIRE.clear()
    _WIRE[id(entries)] = payload
    return entries, vocab


def _ids(rng: random.Random, k: int, low: int = 1000, high: int = 150_000) -> list[int]:
    return sorted(rng.sample(range(low, high), k))


def _runs(count: int, a: int, c: int, length: int = 64) -> list[list[int]]:
    """``count`` choices of ``length`` tokens: runs of ``a`` with ``c`` at some of 8 places near the
    start (every pattern but none), so the trie branches early and then runs long."""
    return [[c if b < 8 and j >> b & 1 else a for b in range(length)] for j in range(1, count + 1)]


def _choices_phrases(k: int) -> tuple[list[Any], int | None]:
    """Issue 47's mix at ``k`` choices per entry: a 760-id ban, 6 phrases that follow the choices'
    runs without ever completing, 7 choice entries."""
    from dynlogits.tools.load.costly import costly_payload

    payload = costly_payload(1)
    for entry in payload[7:]:
        entry["choices"] = entry["choices"][:k]
    return _wire(payload, 1000)


def _choices_bans(k: int) -> tuple[list[Any], int | None]:
    rng = random.Random(3)
    choices = [[rng.randrange(10, 60) for _ in range(64)] for _ in range(k)]
    bans = [{"kind": "banned_tokens", "token_ids": _ids(rng, 4096)} for _ in range(14)]
    return _wire([*bans, {"kind": "multiple_choice", "choices": choices, "eos_token_id": 2},
                  {"kind": "multiple_choice", "choices": choices, "eos_token_id": 2}])


def _choices_triggers(k: int) -> tuple[list[Any], int | None]:
    triggers = [{"kind": "trigger", "trigger_token_ids": [7] * 62 + [8 + t], "phrase_token_ids": [7] * 64}
                for t in range(15)]
    return _wire([*triggers, {"kind": "multiple_choice", "choices": _runs(k, 7, 9), "eos_token_id": 2}])


def _choices_restrict(k: int) -> tuple[list[Any], int | None]:
    rng = random.Random(4)
    allowed = AllowedTokensSpec.model_construct(token_ids=list(range(131_072)), eos_token_id=2, scope="always")
    entries, vocab = _wire([*({"kind": "banned_tokens", "token_ids": _ids(rng, 4096, 50_000, 131_000)}
                              for _ in range(3)),
                            {"kind": "multiple_choice", "choices": _runs(k, 7, 9), "eos_token_id": 2}])
    return [allowed, *entries], vocab


def _forced_phrases(k: int) -> tuple[list[Any], int | None]:
    """A forced run of 4096 ``a`` beside ``k`` phrase entries of 256 phrases of ``a`` runs ending in
    a token the run never writes: each automaton stays deep and never completes a phrase."""
    phrases = [{"kind": "banned_phrases", "phrases": [[7] * 63 + [1000 + 256 * e + p] for p in range(256)]}
               for e in range(k)]
    return _wire([{"kind": "forced_sequence", "token_ids": [7] * 4096, "eos_token_id": 2}, *phrases])


def _forced_random_phrases(k: int) -> tuple[list[Any], int | None]:
    """A forced sequence of 4096 random ids beside ``k`` entries of 256 random phrases of 64 tokens
    (no shared prefixes: every token a state of its automaton)."""
    rng = random.Random(12)
    phrases = [{"kind": "banned_phrases", "phrases": [[rng.randrange(10, 150_000) for _ in range(64)] for _ in range(256)]}
               for _ in range(k)]
    return _wire([{"kind": "forced_sequence", "token_ids": [rng.randrange(10, 150_000) for _ in range(4096)],
                   "eos_token_id": 2}, *phrases])


def _choices_random_phrases(k: int) -> tuple[list[Any], int | None]:
    """2 choice entries of 255 random choices of 64 tokens from a small alphabet beside ``k`` entries of
    256 random phrases from the same alphabet (long partial matches, many fallbacks)."""
    rng = random.Random(13)
    choices = [[rng.randrange(10, 14) for _ in range(64)] for _ in range(255)]
    phrases = [{"kind": "banned_phrases", "phrases": [[rng.randrange(10, 14) for _ in range(63)] + [9] for _ in range(256)]}
               for _ in range(k)]
    return _wire([*phrases, {"kind": "multiple_choice", "choices": choices, "eos_token_id": 2},
                  {"kind": "multiple_choice", "choices": choices, "eos_token_id": 2}])


def _forced_grid(k: int) -> tuple[list[Any], int | None]:
    rng = random.Random(5)
    forced = [{"kind": "forced_sequence", "token_ids": list(range(7, 4103)), "eos_token_id": 2} for _ in range(k)]
    return _wire([*forced, *({"kind": "banned_tokens", "token_ids": _ids(rng, 4096)} for _ in range(34 - k))])


def _mixed_grid(k: int) -> tuple[list[Any], int | None]:
    rng = random.Random(6)
    entries: list[dict[str, Any]] = [REASONING,
                                     {"kind": "forced_sequence", "token_ids": list(range(10, 4106)), "eos_token_id": 2},
                                     {"kind": "forced_sequence", "token_ids": list(range(10, 4106)), "eos_token_id": 2,
                                      "scope": "answer"}]
    for e in range(k):
        entries.append({"kind": "min_tokens", "min_tokens": 1 + e * 97, "stop_token_ids": _ids(rng, 4096, 140_000, 151_600),
                        "scope": "answer" if e % 2 else "always"})
    return _wire(entries)


def _min_unions(k: int) -> tuple[list[Any], int | None]:
    entries: list[dict[str, Any]] = [{"kind": "min_tokens", "min_tokens": 1 + e, "stop_token_ids": list(range(4096 * e, 4096 * e + 4096))}
                                     for e in range(k)]
    entries.append({"kind": "allowed_tokens", "token_ids": list(range(140_000, 144_096))})
    return _wire(entries)


def _thinking(k: int) -> tuple[list[Any], int | None]:
    rng = random.Random(7)
    budgets = [{"kind": "thinking_budget", "budget": 9, "start_token_ids": [5], "end_token_ids": _ids(rng, 4096, 200, 60_000)}
               for _ in range(k)]
    bans = [{"kind": "banned_tokens", "token_ids": _ids(rng, 4096, 60_000, 150_000)} for _ in range(34 - k)]
    return _wire([*budgets, *bans])


def _triggers_phrases(k: int) -> tuple[list[Any], int | None]:
    phrases = [{"kind": "banned_phrases", "phrases": [[7] * 63 + [1000 + 256 * e + p] for p in range(256)]}
               for e in range(k)]
    triggers = [{"kind": "trigger", "trigger_token_ids": [7] * 64, "phrase_token_ids": [7] * 64} for _ in range(34 - k)]
    return _wire([*phrases, *triggers])


def _triggers_forced(k: int) -> tuple[list[Any], int | None]:
    forced = [{"kind": "forced_sequence", "token_ids": [7] * 4096, "eos_token_id": 2} for _ in range(k)]
    triggers = [{"kind": "trigger", "trigger_token_ids": [7] * 63 + [8], "phrase_token_ids": [7] * 64}
                for _ in range(34 - k)]
    return _wire([*forced, *triggers])


def _realistic_choice(_: int) -> tuple[list[Any], int | None]:
    rng = random.Random(8)
    choices = [[rng.randrange(1000, 100_000) for _ in range(rng.randint(1, 4))] for _ in range(256)]
    return _wire([{"kind": "banned_tokens", "token_ids": _ids(rng, 100)}, {"kind": "banned_tokens", "token_ids": _ids(rng, 100)},
                  {"kind": "banned_phrases", "phrases": [_ids(rng, 3) for _ in range(20)]},
                  {"kind": "multiple_choice", "choices": choices, "eos_token_id": 2},
                  {"kind": "banned_phrases", "phrases": [_ids(rng, 3) for _ in range(20)]},
                  {"kind": "banned_tokens", "token_ids": _ids(rng, 100)}])


def _realistic_forced(_: int) -> tuple[list[Any], int | None]:
    rng = random.Random(9)
    return _wire([{"kind": "banned_tokens", "token_ids": _ids(rng, 100)},
                  {"kind": "forced_sequence", "token_ids": [rng.randrange(1000, 100_000) for _ in range(300)], "eos_token_id": 2},
                  *({"kind": "banned_phrases", "phrases": [_ids(rng, 4) for _ in range(50)]} for _ in range(3))])


def _realistic_sets(_: int) -> tuple[list[Any], int | None]:
    rng = random.Random(10)
    return _wire([REASONING, {"kind": "banned_tokens", "token_ids": _ids(rng, 4096)},
                  {"kind": "allowed_tokens", "token_ids": _ids(rng, 4096), "eos_token_id": 2},
                  {"kind": "min_tokens", "min_tokens": 16, "stop_token_ids": _ids(rng, 4096)},
                  {"kind": "thinking_budget", "budget": 512},
                  {"kind": "forced_sequence", "token_ids": [rng.randrange(1000, 100_000) for _ in range(64)], "eos_token_id": 2,
                   "scope": "answer"}])


def _restrict(k: int, prompt: int = 131_072) -> tuple[list[Any], int | None]:
    """``prompt_tokens`` ``restrict`` as realized for a prompt of ``prompt`` distinct ids beside a
    4096-id ban, a forced sequence of ``k`` tokens and 256 choices of 4."""
    rng = random.Random(11)
    allowed = AllowedTokensSpec.model_construct(token_ids=sorted(rng.sample(range(151_000), prompt)), eos_token_id=2,
                                                scope="always")
    entries, vocab = _wire([{"kind": "banned_tokens", "token_ids": _ids(rng, 4096)},
                            {"kind": "forced_sequence", "token_ids": [rng.randrange(1000, 100_000) for _ in range(k)],
                             "eos_token_id": 2},
                            {"kind": "multiple_choice", "choices": [[rng.randrange(1000, 100_000) for _ in range(4)]
                                                                    for _ in range(256)], "eos_token_id": 2}])
    return [entries[0], allowed, *entries[1:]], vocab


CASES: tuple[Case, ...] = (
    Case("issue47", "issue 47's payload: 760-id ban, 6 phrases, 7 x 255 choices of 64 tokens",
         lambda _: _wire(__import__("dynlogits.tools.load.costly", fromlist=["x"]).costly_payload(1), 1000)),
    Case("choices x phrases", "7 choice entries of k choices of 64 tokens, 6 phrases following their runs",
         _choices_phrases, (1, 255)),
    Case("choices x bans", "2 choice entries of k random choices of 64 tokens, 14 bans of 4096 ids", _choices_bans, (1, 256)),
    Case("choices x triggers", "k choices of 64-token runs, 15 triggers of 63-token runs", _choices_triggers, (1, 255)),
    Case("choices x restrict", "131,072-id allowed set, 3 bans of 4096 ids, k choices of 64 tokens", _choices_restrict,
         (1, 255)),
    Case("forced x phrases", "a 4096-token forced run, k entries of 256 phrases of 64 tokens", _forced_phrases, (1, 33)),
    Case("forced x random phrases", "a 4096-token random forced sequence, k entries of 256 random phrases of 64 tokens",
         _forced_random_phrases, (1, 33)),
    Case("choices x random phrases", "2 x 255 random choices of 64 tokens, k entries of 256 phrases of the same 4 ids",
         _choices_random_phrases, (1, 30)),
    Case("forced grid", "k forced sequences of 4096 distinct tokens, 34 - k bans of 4096 ids", _forced_grid, (1, 33)),
    Case("mixed grid", "reasoning, 4096-token forced always and in the answer, k min_tokens of 4096 ids mixed scopes",
         _mixed_grid, (1, 31)),
    Case("min_tokens unions", "k min_tokens of 4096 stop ids, distinct boundaries, a 4096-id allowed set", _min_unions,
         (1, 33)),
    Case("thinking", "k thinking budgets of 4096 end tokens, 34 - k bans of 4096 ids", _thinking, (1, 33)),
    Case("triggers x phrases", "k entries of 256 phrases of 64 tokens, 34 - k triggers of 64 + 64 tokens",
         _triggers_phrases, (1, 33)),
    Case("restrict x forced", "131,072-id allowed set (prompt), 4096-id ban, k-token forced, 256 choices of 4", _restrict,
         (1, 4096)),
    Case("triggers x forced", "k forced runs of 4096 tokens, 34 - k triggers of 64 + 64 tokens", _triggers_forced, (1, 33)),
    Case("realistic choice", "256 choices of 1-4 tokens, 3 bans of 100 ids, 2 x 20 phrases", _realistic_choice,
         realistic=True),
    Case("realistic forced", "a 300-token forced sequence, 3 x 50 phrases of 4 tokens, a ban", _realistic_forced,
         realistic=True),
    Case("realistic sets", "reasoning, 4096-id ban, allowed set and min_tokens, a thinking budget, a forced answer",
         _realistic_sets, realistic=True),
    Case("realistic restrict", "16,000-id allowed set (a 32k-token prompt), 4096-id ban, 256-token forced, 256 "
         "choices of 4", lambda _: _restrict(256, 16_000), realistic=True),
)


@dataclass(frozen=True)
class Row:
    """One timed payload: its case, knob, entries, work units, verdict, ms per check (median and
    max), and ms of the whole wire admission (decode, limits, ids, check; ``None``: no wire form)."""

    case: str
    knob: int | None
    entries: int
    units: int
    verdict: str
    median_ms: float
    max_ms: float
    decode_ms: float | None


def measure(entries: Sequence[Any], vocab: int | None, limits: SpecLimits, repeats: int) -> tuple[str, list[float]]:
    """The verdict (``admitted``, ``budget`` or ``refused``) and the CPU ms of each of ``repeats``
    checks, each on a cold verdict memo."""
    times, verdict = [], "admitted"
    for _ in range(repeats):
        VERDICTS.clear()
        started = time.process_time()
        try:
            check_consistency(entries, root="p", vocab_size=vocab, limits=limits)
            verdict = "admitted"
        except SpecError as err:
            verdict = "budget" if "max_admission_work" in str(err) else "refused"
        times.append((time.process_time() - started) * 1000)
    return verdict, times


def measure_decode(payload: list[dict[str, Any]], vocab: int | None, limits: SpecLimits, repeats: int) -> float:
    """The median CPU ms of ``decode_wire_payload`` on ``payload`` (cold verdict memo)."""
    times = []
    for _ in range(repeats):
        VERDICTS.clear()
        started = time.process_time()
        try:
            decode_wire_payload(payload, vocab_size=vocab, limits=limits)
        except SpecError:
            pass
        times.append((time.process_time() - started) * 1000)
    return statistics.median(times)


def _largest_within(case: Case, limits: SpecLimits) -> int:
    """The largest knob whose payload the budget admits (the low end when none is)."""
    assert case.knob is not None, "only a case with a knob has a largest one"
    low, high = case.knob
    units = lambda k: admission_work(*case.build(k)).units  # noqa: E731
    if units(high) <= limits.max_admission_work:
        return high
    if units(low) > limits.max_admission_work:
        return low
    while high - low > 1:
        mid = (low + high) // 2
        if units(mid) <= limits.max_admission_work:
            low = mid
        else:
            high = mid
    return low


def run(limits: SpecLimits = DEFAULT_LIMITS, repeats: int = 5, cases: Sequence[Case] = CASES) -> list[Row]:
    """Time every case: each family at the largest knob the budget admits and the next one."""
    rows = []
    for case in cases:
        knobs: list[int | None] = [None]
        if case.knob is not None:
            best = _largest_within(case, limits)
            knobs = [*sorted({best, min(best + 1, case.knob[1])})]
        for knob in knobs:
            entries, vocab = case.build(knob or 0)
            wire = _WIRE.get(id(entries))
            verdict, times = measure(entries, vocab, limits, repeats)
            decode = measure_decode(wire, vocab, limits, repeats) if wire is not None else None
            rows.append(Row(case.name, knob, len(entries), admission_work(entries, vocab).units, verdict,
                            statistics.median(times), max(times), decode))
    return rows


def table(rows: Sequence[Row], limits: SpecLimits) -> list[str]:
    """The rows as a markdown table, with the target's verdict per row."""
    lines = ["| payload | k | entries | work units | verdict | ms per check (median) | max | whole admission ms | "
             "<= 50 ms |", "|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in rows:
        share = f" ({r.units / limits.max_admission_work:.0%} of budget)" if r.verdict != "budget" else ""
        lines.append(f"| {r.case} | {'' if r.knob is None else r.knob} | {r.entries} | {r.units:,}{share} | {r.verdict} "
                     f"| {r.median_ms:.1f} | {r.max_ms:.1f} | {'' if r.decode_ms is None else f'{r.decode_ms:.1f}'} "
                     f"| {'met' if r.max_ms <= TARGET_MS else 'NOT MET'} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dynlogits.tools.bench admission", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="timed checks per payload (default 5)")
    p.add_argument("--max-admission-work", type=int, default=DEFAULT_LIMITS.max_admission_work,
                   help=f"the budget (default {DEFAULT_LIMITS.max_admission_work:,}, the limit's default)")
    p.add_argument("--case", action="append", help="only these cases (by name; repeatable)")
    args = p.parse_args(argv)
    limits = SpecLimits(max_admission_work=args.max_admission_work)
    cases = [c for c in CASES if not args.case or c.name in args.case]
    rows = run(limits, args.repeats, cases)
    print(f"## admission (CPU ms per consistency check, cold memo; max_admission_work {limits.max_admission_work:,})\n")
    print("\n".join(table(rows, limits)))
    worst_in = max((r.max_ms for r in rows if r.verdict != "budget"), default=0.0)
    worst_out = max((r.max_ms for r in rows if r.verdict == "budget"), default=0.0)
    print(f"\nworst admitted or refused after its walks: {worst_in:.1f} ms; worst refused by the budget: {worst_out:.1f} ms; "
          f"target {TARGET_MS:.0f} ms: {'met' if max(worst_in, worst_out) <= TARGET_MS else 'NOT MET'}")
    return 0
