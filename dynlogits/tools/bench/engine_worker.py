"""One engine configuration of the ``engine`` suite, run in its own process (``engine`` starts it).

``python -m dynlogits.tools.bench.engine_worker '<json>'`` starts one offline ``vllm.LLM`` with the
given ``logits_processors``, runs a warm-up round, then ``rounds`` rounds of one batch per kind in
``round_order`` (so no kind always runs first or after the same kind). Prints one
``[engine-worker] round`` line per round on stderr and, last, ``RESULT_PREFIX`` +
``{"tok_per_s": {kind: [per round]}, "adapter_ms": {kind: [per round]}, "adapter_update_ms": ...,
"floor_ms": ...}``: ``adapter_ms``, the time the engine spent in the adapter's calls during each
batch (``adapter_update_ms``: the part in ``update_state``), only with ``"call_times"`` (a file
path for ``timed.CallTimes``; the processor must be ``timed.TimedVllmLogitsProcessor``);
``floor_ms``, the time in ``timed.TimedFloorProcessor``'s calls, only with ``"floor_times"``.
Kind ``FLOOR_KIND`` is a batch whose requests carry ``timed.FLOOR_MARKER`` and no payload: the
floor processor fills their rows with ``-inf``. With ``"profile"`` (a folder) the timed adapter
profiles its calls per kind (``PROFILE_ENV``; files ``<kind>.prof``). Every batch's outputs
are checked (lengths, forced tokens, no banned id or phrase, the floor's id 0); otherwise it exits
non-zero with the reason."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from . import workloads
from .profile_env import PROFILE_ENV

__all__ = ["FLOOR_KIND", "PROFILE_ENV", "PROGRESS_PREFIX", "RESULT_PREFIX", "main", "round_order"]

RESULT_PREFIX = "DYNLOGITS_BENCH_RESULT "
PROGRESS_PREFIX = "[engine-worker] "
PROMPT_LEN = 16
#: the kind whose batch runs the floor processor (``timed.TimedFloorProcessor``) on every request
FLOOR_KIND = "floor"


def round_order(kinds: list[str] | tuple[str, ...], rnd: int) -> list[str]:
    """The kinds in the order round ``rnd`` runs them: rotated by ``rnd``, and reversed in every
    other cycle of ``len(kinds)`` rounds so that each kind also follows each other one."""
    shift = rnd % len(kinds)
    order = [*kinds[shift:], *kinds[:shift]]
    return order[::-1] if (rnd // len(kinds)) % 2 else order


def _check(kind: str, payloads: list[Any], outputs: list[Any], tokens: int, vocab: int) -> None:
    for i, out in enumerate(outputs):
        got = list(out.outputs[0].token_ids)
        if len(got) != tokens:
            raise SystemExit(f"{kind}: request {i} generated {len(got)} tokens, expected {tokens}")
        if kind == FLOOR_KIND and any(got):  # a row of -inf argmaxes to id 0: the floor ran on every row
            raise SystemExit(f"floor: request {i} generated {got[:8]}..., expected id 0 throughout")
        if kind == "forced_sequence":
            want = [workloads.next_token(payloads[i], n, vocab_size=vocab) for n in range(tokens)]
            if got != want:
                raise SystemExit(f"forced_sequence: request {i} generated {got[:8]}..., expected {want[:8]}...")
        elif kind == "banned_tokens" and set(got) & set(payloads[i][0]["token_ids"]):
            raise SystemExit(f"banned_tokens: request {i} generated a banned id")
        elif kind == "banned_phrases" and workloads.writes_a_banned_phrase(payloads[i], got):
            raise SystemExit(f"banned_phrases: request {i} generated a banned phrase")


def _marked(kind: str, payload: Any) -> dict[str, Any] | None:
    """A request's ``extra_args``: the floor's marker, its payload, or none."""
    from dynlogits.specs import WIRE_KEY

    from .timed import FLOOR_MARKER

    if kind == FLOOR_KIND:
        return {FLOOR_MARKER: True}
    return None if payload is None else {WIRE_KEY: payload}


def run(spec: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    import os

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from .timed import CALL_TIMES_ENV, FLOOR_TIMES_ENV, CallTimes

    times = floor = None
    if spec.get("call_times"):  # before the engine starts: its process inherits the variables
        os.environ[CALL_TIMES_ENV] = spec["call_times"]
        times = CallTimes(spec["call_times"], create=True)
        if spec.get("profile"):
            os.environ[PROFILE_ENV] = spec["profile"]
    if spec.get("floor_times"):
        os.environ[FLOOR_TIMES_ENV] = spec["floor_times"]
        floor = CallTimes(spec["floor_times"], create=True)
    vocab, eos, n, tokens = spec["vocab"], spec["eos_token_id"], spec["requests"], spec["tokens"]
    kinds, rounds = list(spec["kinds"]), int(spec["rounds"])
    llm = LLM(spec["model"], dtype="float32", enforce_eager=True, gpu_memory_utilization=0.2, seed=0,
              max_num_seqs=n, max_model_len=PROMPT_LEN + tokens + 16,
              logits_processors=list(spec["processors"]) or None)
    prompts = [TokensPrompt(prompt_token_ids=[(31 * i + j) % 900 + 5 for j in range(PROMPT_LEN)]) for i in range(n)]
    payloads: dict[str, list[Any]] = {}
    params: dict[str, list[Any]] = {}
    for kind in kinds:
        payloads[kind] = [None if kind in ("none", FLOOR_KIND) else
                          workloads.payload(kind, vocab_size=vocab, eos_token_id=eos, seed=i) for i in range(n)]
        params[kind] = [SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True,
                                       extra_args=_marked(kind, p)) for p in payloads[kind]]
    per_round: dict[str, list[float]] = {kind: [] for kind in kinds}
    timed = {"adapter_ms": times, "floor_ms": floor}
    spent: dict[str, dict[str, list[float]]] = {part: {kind: [] for kind in kinds} for part, t in timed.items()
                                                if t is not None}
    if times is not None:
        spent["adapter_update_ms"] = {kind: [] for kind in kinds}
    for rnd in range(rounds + 1):  # round 0 warms the engine up and is not counted
        got: dict[str, float] = {}
        took: dict[str, dict[str, float]] = {part: {} for part in spent}
        for kind in round_order(kinds, rnd):
            if times is not None:
                times.label = kinds.index(kind)  # the profile the adapter's calls go to (with "profile")
            before = {part: t.split() for part, t in timed.items() if t is not None}
            start = time.perf_counter()
            outputs = llm.generate(prompts, params[kind], use_tqdm=False)
            elapsed = time.perf_counter() - start
            for part, t in timed.items():  # the engine is idle once generate returns: the counters hold still
                if t is not None:
                    now, was = t.split(), before[part]
                    took[part][kind] = (now[0] - was[0] + now[2] - was[2]) / 1e6
                    if part == "adapter_ms":
                        took["adapter_update_ms"][kind] = (now[0] - was[0]) / 1e6
            _check(kind, payloads[kind], outputs, tokens, vocab)
            got[kind] = sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed
        if rnd:
            for kind, tok_per_s in got.items():
                per_round[kind].append(tok_per_s)
            for part, per_kind in took.items():
                for kind, ms in per_kind.items():
                    spent[part][kind].append(ms)
        label = "warm-up" if not rnd else f"round {rnd}/{rounds}"
        detail = ""
        if times is not None:
            detail = "; adapter ms (update_state + apply): " + ", ".join(
                f"{kind} {took['adapter_update_ms'][kind]:.1f} + {took['adapter_ms'][kind] - took['adapter_update_ms'][kind]:.1f}"
                for kind in got)
        if floor is not None:
            detail += "; floor ms: " + ", ".join(f"{kind} {ms:.1f}" for kind, ms in took["floor_ms"].items())
        print(PROGRESS_PREFIX + f"{label}: " + ", ".join(f"{kind} {tps:.0f}" for kind, tps in got.items()) + " tok/s"
              + detail, file=sys.stderr, flush=True)
    if times is not None and spec.get("profile"):  # a label of its own, so the last batch's profile is written
        times.label = len(kinds)
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    llm.llm_engine.engine_core.shutdown()
    for i, kind in enumerate(kinds if spec.get("profile") else ()):
        written = os.path.join(spec["profile"], f"{i}.prof")
        if os.path.exists(written):
            os.replace(written, os.path.join(spec["profile"], f"{kind}.prof"))
    return {"tok_per_s": per_round, **spent}


def main(argv: list[str]) -> int:
    result = run(json.loads(argv[1]))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
