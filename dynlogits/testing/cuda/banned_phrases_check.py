"""``banned_phrases``' fused Triton kernel (``dynlogits.kernels.banned_phrases``, what Model Runner
V2's steady step runs on CUDA once its ``GATE`` probed it) on a real CUDA device.

``run(device)`` (CUDA), per batch (1, 64, 256 requests) and drafts (none, 2 a request): random
steps of a real ``BannedPhrasesGroup`` (``group_case``: phrases of 1 to ``longest`` tokens over few
ids, outputs often ending with a prefix, prompts, prefill rows, rows outside the group, a sentinel
row), figures one line each:

* ``bits``: the kernel's logits against the group's eager device path on the same device, against
  the CPU implementation (``ban_reference``) on host copies, and against the hosted processor
  (``BannedPhrasesProcessor.banned`` of each decoding row's output), rows differing (each must be 0),
  float32 and bfloat16;
* ``steady``: device ops (kernels, copies, memsets) of one steady call from ``torch.profiler``
  (must be 1) beside the eager path's; one call under ``torch.cuda.set_sync_debug_mode("error")``
  (must raise nothing); per call, the kernel and the eager path timed (CUDA events: printed, not
  judged).

``python -m dynlogits.testing.cuda.banned_phrases_check --cpu`` is the CPU self test: ``bits`` with
the kernel in Triton's interpreter (``TRITON_INTERPRET=1``, a subprocess) against the eager path and
``ban_reference`` on the CPU and the hosted processor (small batches; no profiler, sync or time)."""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from dynlogits.kernels.banned_phrases import OUT_OF_PHASE, ban_reference
from dynlogits.processors.banned_phrases import BannedPhrasesGroup, BannedPhrasesProcessor, BannedPhrasesTemplate
from dynlogits.processors.slots import GatheredRows, StepInputs
from dynlogits.processors.window import TokenWindow

from .timing import device_ops, sync_error, timed

__all__ = ["BATCHES", "DRAFTS", "GroupCase", "bits", "eager", "fused", "fused_args", "group_case", "interpreted_check",
           "main", "run"]

BATCHES = (1, 64, 256)
DRAFTS = (0, 2)
#: the few ids prefixes and outputs are drawn from (so they meet often)
ALPHABET = 4


class GroupCase(NamedTuple):
    """A random step of a ``BannedPhrasesGroup``: the group (its tables flushed), the step's rows and
    window, logits (no NaN, no ``-inf``), and per row the ids the hosted processor masks after its
    output (``None``: a row outside the group, masking nothing, or a prefill chunk's row, whose
    sample the runner discards), each from its stretch where the step has per-row floors
    (``floor``: a scoped entry's, ``scope.FloorScopeTables``)."""

    group: BannedPhrasesGroup
    rows: GatheredRows
    window: TokenWindow
    logits: torch.Tensor
    wants: list[list[int] | None]
    floor: torch.Tensor | None = None


def _phrases(rng: random.Random, longest: int, vocab: int) -> list[list[int]]:
    """1 to 6 phrases of 1 to ``longest`` tokens (one at least 2 long): prefixes over ``ALPHABET``
    ids, last tokens below ``vocab``."""
    made = []
    for k in range(rng.randint(1, 6)):
        n = rng.randint(2 if k == 0 else 1, longest)
        made.append([rng.randrange(ALPHABET) for _ in range(n - 1)] + [rng.randrange(vocab)])
    return made


def group_case(seed: int, device: torch.device, *, requests: int = 6, drafts: int = 0, longest: int = 6,
               vocab: int = 50, floors: bool = False) -> GroupCase:
    """A random step on ``device`` (see ``GroupCase``): ``requests`` requests, about one in six
    outside the group, one in eight in prefill; ``drafts`` drafts at most per request (one row per
    draft, as Model Runner V2 feeds them, placeholders among them); outputs that end with one of
    their phrases' prefixes half the time; the engine matrix's cells outside a request's tokens
    random. With ``floors``, a floor per row (a scoped entry's stretch start, from the prompt's
    start): before the output, inside it (a prefix may cross it), past the row, or ``OUT_OF_PHASE``."""
    rng = random.Random(seed)
    length = 30 + 2 * longest
    tokens = torch.randint(0, ALPHABET, (requests, length), generator=torch.Generator().manual_seed(seed),
                           dtype=torch.int32)
    group = BannedPhrasesGroup(0, requests + 1, device)
    group.from_window = True
    prompt_len: list[int] = []
    pos: list[int] = []
    slot_of_row: list[int] = []
    input_ids: list[int] = []
    local_pos: list[int] = []
    wants: list[list[int] | None] = []
    floor: list[int] = []
    for slot in range(requests):
        phrases = _phrases(rng, longest, vocab)
        processor = BannedPhrasesProcessor(phrases)
        member = slot == 0 or rng.random() > 1 / 6  # the group has a member
        if member:
            assert isinstance(processor.template, BannedPhrasesTemplate)
            group.assign(slot, processor.template)
        prompt = [rng.randrange(ALPHABET) for _ in range(rng.randint(1, 6))]
        output = [rng.randrange(ALPHABET) for _ in range(rng.randint(0, 12))]
        if rng.random() < 0.5:  # ends with a prefix: its last token is banned now
            phrase = rng.choice(phrases)
            output += phrase[:-1]
        committed = prompt + output
        tokens[slot, :len(committed)] = torch.tensor(committed, dtype=torch.int32)
        prompt_len.append(len(prompt))
        if rng.random() < 1 / 8:  # a prefill chunk's row, fed before the prompt's last token
            pos.append(rng.randrange(len(prompt)))
            slot_of_row.append(slot)
            input_ids.append(int(tokens[slot, pos[-1]]))
            local_pos.append(0)
            wants.append(None)
            floor.append(rng.randrange(len(committed) + 1))
            continue
        fed = [rng.choice([rng.randrange(ALPHABET), -1]) if rng.random() < 0.2 else rng.randrange(ALPHABET)
               for _ in range(rng.randint(0, drafts))]
        for k in range(len(fed) + 1):  # row k: fed the last committed token (k = 0), then draft k
            pos.append(len(committed) - 1 + k)
            slot_of_row.append(slot)
            input_ids.append(committed[-1] if k == 0 else fed[k - 1])
            local_pos.append(k)
            history: list[int] | None = output + fed[:k]
            if floors:  # the hosted processor sees the stretch from the floor on (``scope._own``)
                at = rng.choice([OUT_OF_PHASE, rng.randrange(pos[-1] + 3), pos[-1] - rng.randrange(min(longest, 8))])
                floor.append(at)
                history = (output + fed[:k])[max(0, at - len(prompt)):] if at <= pos[-1] + 1 else None
            wants.append(None if not member else [] if history is None else list(processor.banned(history)))
    pos.append(rng.randrange(length))  # the sentinel row: the tables' last slot, past the engine's
    slot_of_row.append(requests)
    input_ids.append(0)
    local_pos.append(0)
    wants.append(None)
    floor.append(0)
    group.flush()
    window = TokenWindow(device)
    window.at(tokens.to(device), torch.tensor(prompt_len, dtype=torch.int32, device=device),
              torch.tensor(pos, device=device),
              torch.tensor(input_ids, dtype=torch.int32, device=device) if drafts else None,
              torch.tensor(local_pos, device=device) if drafts else None)
    rows = group.every_row(torch.tensor(slot_of_row, device=device))
    logits = torch.randn(len(pos), vocab, generator=torch.Generator().manual_seed(seed)).to(device)
    return GroupCase(group, rows, window, logits, wants, torch.tensor(floor, device=device) if floors else None)


def fused_args(case: GroupCase, logits: torch.Tensor) -> tuple[Any, ...]:
    """The fused op's arguments for ``case``'s step writing into ``logits`` (as the group passes them)."""
    g, w = case.group, case.window
    drafts = w.input_ids is not None and w.local_pos is not None
    return (logits, w.tokens, w.prompt_len, w.pos, case.rows.slot_of_row, case.rows.member, g.prefix.dev, g.bans.dev,
            g.need.dev, w.input_ids if drafts else None, w.local_pos if drafts else None, case.floor, g.entries, g.width)


def fused(case: GroupCase, logits: torch.Tensor) -> None:
    """The Triton kernel on ``case`` (``dynlogits.kernels.banned_phrases.launch``)."""
    from dynlogits.kernels.banned_phrases import launch

    launch(*fused_args(case, logits))


def eager(case: GroupCase, logits: torch.Tensor) -> None:
    """The group's eager device path on ``case`` (``_decide_eager``, ``_write_eager``)."""
    step = StepInputs(logits, logits.view(-1), logits.shape[1], None, torch.empty(0, dtype=torch.long))
    case.group._write_eager(step, case.group._decide_eager(case.rows, case.window, case.floor))


def _host(case: GroupCase, logits: torch.Tensor) -> torch.Tensor:
    """``ban_reference`` on host copies of the step (``logits`` itself untouched, on any device)."""
    out = logits.to("cpu", copy=True)
    args: list[Any] = [x.cpu() if isinstance(x, torch.Tensor) else x for x in fused_args(case, out)]
    ban_reference(*args)
    return out


def _hosted_rows(case: GroupCase, got: torch.Tensor) -> int:
    """Rows of ``got`` (host) whose ``-inf`` ids differ from the hosted processor's (rows it
    decides); a row outside the group must be untouched."""
    bad = 0
    for row, want in enumerate(case.wants):
        ids = torch.isneginf(got[row]).nonzero().flatten().tolist()
        if want is not None:
            bad += ids != [t for t in want if t < got.shape[1]]
        elif not bool(case.rows.member[row]):
            bad += ids != []
    return bad


def _line(ok: bool) -> str:
    return "ok" if ok else "FAILED"


def bits(device: torch.device, vocab: int, batches: Sequence[int]) -> list[dict[str, Any]]:
    """Per batch, drafts and dtype: rows where the kernel differs from the eager path on ``device``,
    from ``ban_reference`` on the host and from the hosted processor (each must be 0), and the bans
    made; the bfloat16 steps with per-row floors (a scoped entry's)."""
    out = []
    for batch in batches:
        for drafts in DRAFTS:
            for dtype in (torch.float32, torch.bfloat16):
                longest = 6 if batch % 2 else 40  # past one block of columns
                floors = dtype == torch.bfloat16
                case = group_case(1000 + batch + drafts, device, requests=batch, drafts=drafts, longest=longest,
                                  vocab=vocab, floors=floors)
                logits = case.logits.to(dtype)
                kernel, by_eager = logits.clone(), logits.clone()
                fused(case, kernel)
                eager(case, by_eager)
                host = _host(case, logits)
                got = kernel.cpu()
                vs_eager = int((got != by_eager.cpu()).any(1).sum())
                vs_host = int((got != host).any(1).sum())
                vs_hosted = _hosted_rows(case, got)
                banned = int(torch.isneginf(host).sum())
                name = str(dtype).removeprefix("torch.")
                out.append({"batch": batch, "drafts": drafts, "dtype": name, "floors": floors, "vs_eager": vs_eager,
                            "vs_host": vs_host, "vs_hosted": vs_hosted, "banned": banned})
                good = vs_eager == 0 and vs_host == 0 and vs_hosted == 0
                print(f"banned_phrases fused bits batch {batch} drafts {drafts} {name}{' floors' if floors else ''} "
                      f"vocab {vocab}: kernel vs eager "
                      f"{vs_eager} rows, vs host {vs_host} rows, vs hosted processor {vs_hosted} rows ({banned} bans) "
                      f"-> {_line(good)}", flush=True)
    return out


def _same(found: list[dict[str, Any]]) -> bool:
    same = all(r["vs_eager"] == 0 and r["vs_host"] == 0 and r["vs_hosted"] == 0 for r in found)
    return same and sum(r["banned"] for r in found) > 0  # the steps banned something


def _measured(case: GroupCase, steps: int, tmp: Path) -> dict[str, Any]:
    """One steady call of the kernel and of the eager path on ``case``: device ops (the kernel's
    names), the kernel's sync error, and both timed (ms, wall and device)."""
    logits = case.logits
    calls = {"fused": lambda: fused(case, logits), "eager": lambda: eager(case, logits)}
    made: dict[str, Any] = {}
    for name, call in calls.items():
        call()  # compiled, and the eager path's one-off gathers made, outside the steady call
        made[name], names = device_ops(call, 10, tmp)
        made[f"{name}_wall_ms"], made[f"{name}_device_ms"] = timed(call, steps)
        made.setdefault("names", names)
    made["sync"] = sync_error(calls["fused"])
    return made


def run(device: torch.device, *, vocab: int = 151936, steps: int = 200,
        batches: Sequence[int] = BATCHES) -> tuple[bool, dict[str, Any]]:
    """Every figure of the module doc on a CUDA ``device``."""
    results: dict[str, Any] = {"bits": bits(device, vocab, batches), "steady": []}
    ok = _same(results["bits"])
    with tempfile.TemporaryDirectory() as tmp:
        for batch in batches:
            for drafts in DRAFTS:
                m = _measured(group_case(7 + batch, device, requests=batch, drafts=drafts, vocab=vocab), steps,
                              Path(tmp))
                good = m["fused"] <= 1 and not m["sync"]
                ok &= good
                results["steady"].append({"batch": batch, "drafts": drafts, **m})
                print(f"banned_phrases fused steady batch {batch} drafts {drafts}: {m['fused']:.1f} device ops "
                      f"{m['names']} (eager {m['eager']:.1f}), sync {m['sync'] or 'none'}; kernel "
                      f"{m['fused_wall_ms']:.4f} ms wall {m['fused_device_ms']:.4f} ms device, eager "
                      f"{m['eager_wall_ms']:.4f} ms wall {m['eager_device_ms']:.4f} ms device -> {_line(good)}",
                      flush=True)
    return ok, results


def _interpreted(vocab: int = 1003, batches: Sequence[int] = (1, 6, 33)) -> int:
    """``bits`` on the CPU, the kernel in Triton's interpreter (the caller set ``TRITON_INTERPRET=1``
    before Triton was imported): 0 when every row matched and some were banned, else 1."""
    return 0 if _same(bits(torch.device("cpu"), vocab, batches)) else 1


def interpreted_check() -> bool:
    """``_interpreted`` in a subprocess with ``TRITON_INTERPRET=1``: whether it passed."""
    code = "import sys; from dynlogits.testing.cuda import banned_phrases_check as c; sys.exit(c._interpreted())"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                          check=False).returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: 0 when every check passed, 1 otherwise, 2 without CUDA (and no ``--cpu``)."""
    parser = argparse.ArgumentParser(prog="python -m dynlogits.testing.cuda.banned_phrases_check",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU self test (Triton's interpreter, small batches)")
    parser.add_argument("--vocab", type=int, default=151936, help="the logits' width on the GPU")
    parser.add_argument("--steps", type=int, default=200, help="timed calls per measurement")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("error: no CUDA device; --cpu runs the CPU self test", file=sys.stderr)
        return 2
    ok = interpreted_check() if args.cpu else run(torch.device("cuda"), vocab=args.vocab, steps=args.steps)[0]
    print("\nresult:", _line(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
