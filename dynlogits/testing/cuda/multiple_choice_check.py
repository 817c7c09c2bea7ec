"""``multiple_choice``' fused Triton kernel (``dynlogits.kernels.multiple_choice``, the op Model
Runner V2's steady step runs on CUDA once its ``GATE`` probed it) on a real CUDA device.

``run(device)`` (CUDA), per batch (1, 64, 256 requests) and token dtype (int32 as vLLM's, int64):
random steps of a real ``MultipleChoiceGroup`` (``group_case``: choices of 1 to ``longest`` tokens
over few ids, outputs following a choice part of the way, to its end and EOS or leaving it, prefill
rows, rows outside the group, a sentinel row, logits with NaNs; with ``scoped`` each row's history
from a stretch start after its prompt, some rows out of phase; with ``drafts`` up to that many
drafts a request, a row per draft, mostly following a choice, some placeholders), figures one line
each:

* ``bits``: the kernel's logits against the op's eager reference (``keep_reference``) on the same
  device, against the group's eager path on host copies (``decide_from_window`` and
  ``apply_device_decisions``, or scoped ``apply_floored``: with drafts the rows' tokens read by
  ``TokenWindow.head``), each bit for bit, and against the hosted processor
  (``MultipleChoiceProcessor.allowed`` of each row's history, drafts included: the ids a member row
  keeps), rows differing (each must be 0), float32 and bfloat16, without drafts and with 2 a
  request;
* ``kernels``: device ops of one call from ``torch.profiler`` (must be 1) beside the eager ones
  (int32 tokens without drafts, int64 with up to 2 a request);
* ``sync``: one call under ``torch.cuda.set_sync_debug_mode("error")`` (must raise nothing);
* ``time``: per call, the kernel and the eager reference (CUDA events), printed, not judged.

``python -m dynlogits.testing.cuda.multiple_choice_check --cpu`` is the CPU self test: the same
``bits`` with the kernel in Triton's interpreter (``TRITON_INTERPRET=1``, a subprocess) on small
batches, rows of 256 columns a program (several programs a row, as ``CHUNK`` at a real vocabulary)."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from dynlogits.kernels import multiple_choice as K
from dynlogits.processors.multiple_choice import MultipleChoiceGroup, MultipleChoiceProcessor
from dynlogits.processors.slots import GatheredRows, StepInputs
from dynlogits.processors.window import TokenWindow

from . import kernel_check
from .kernel_check import interpreted, line, measure

__all__ = ["BATCHES", "EOS", "GroupCase", "bits", "cpu_check", "eager_group", "fused_args", "group_case", "hosted_rows",
           "main", "run"]

BATCHES = (1, 64, 256)
MODULE = "dynlogits.testing.cuda.multiple_choice_check"
#: the few ids choices and outputs are drawn from (so they meet often), after ``EOS``
ALPHABET = 4
EOS = 1


class GroupCase(NamedTuple):
    """A random step of a ``MultipleChoiceGroup`` built on the CPU (its tables flushed): the step's
    rows and window, logits (NaNs among them), each row's ``base`` (its prompt's length, or with
    ``scoped`` its stretch's start or ``OUT_OF_PHASE``), and per row the ids its processor allows
    after its history, drafts before it included (``None``: a row left as it is, outside the group
    or out of phase); ``scoped``: whether the bases are stretch starts."""

    group: MultipleChoiceGroup
    rows: GatheredRows
    window: TokenWindow
    logits: torch.Tensor
    base: torch.Tensor
    wants: list[list[int] | None]
    scoped: bool = False


def group_case(seed: int, *, requests: int = 6, tokens_dtype: torch.dtype = torch.int32, longest: int = 4,
               vocab: int = 50, scoped: bool = False, drafts: int = 0) -> GroupCase:
    """A random step on the CPU (see ``GroupCase``): ``requests`` requests, about one in five
    outside the group, one in seven in prefill (its history counts as empty); 1 to 4 choices each of
    1 to ``longest`` tokens; the matrix as wide as the longest sequence (a row's first tokens may
    reach past it: the last column read); the cells outside a request's tokens random (``-1``
    placeholders among them). With ``scoped``: tokens between the prompt and each row's stretch, a
    tenth of the rows out of phase. With ``drafts``: each request not in prefill 0 to ``drafts``
    drafts (a row each, its ``local_pos``; mostly the choice's next tokens, a tenth placeholders
    ``-1``), fed in ``input_ids`` after its last committed token; the matrix holds committed tokens
    only (its cells past them random), ``drafts`` columns wider."""
    rng = random.Random(seed)
    group = MultipleChoiceGroup(0, requests + 1, torch.device("cpu"))
    group.from_window = True
    sequences: list[list[int]] = []
    prompt_len: list[int] = []
    base: list[int] = []
    pos: list[int] = []
    wants: list[list[int] | None] = []
    slot_of_row: list[int] = []
    local_pos: list[int] = []
    fed: list[int] = []  # each row's input id
    for slot in range(requests):
        choices = [[rng.randrange(2, 2 + ALPHABET) for _ in range(rng.randint(1, longest))]
                   for _ in range(rng.randint(1, 4))]
        processor = MultipleChoiceProcessor(choices, EOS)
        member = slot == 0 or rng.random() < 0.8
        if member:
            group.assign(slot, processor.template)
        prompt = [rng.randrange(2, 2 + ALPHABET) for _ in range(rng.randint(1, 5))]
        before = [rng.randrange(1, 2 + ALPHABET) for _ in range(rng.randint(0, 3) if scoped else 0)]
        choice = rng.choice(choices)
        output = choice[:rng.randint(0, len(choice))]
        if rng.random() < 0.3:
            output = choice + [EOS] * rng.randint(1, 2)
        if rng.random() < 0.2:
            output = output + [rng.randrange(2, 2 + ALPHABET)]  # may leave every choice
        sequences.append(prompt + before + output)
        prompt_len.append(len(prompt))
        start = len(prompt) + len(before)
        prefill = rng.random() < 1 / 7
        at = rng.randrange(start) if prefill else len(sequences[-1]) - 1
        out_of_phase = scoped and rng.random() < 0.1
        drafted: list[int] = []
        for _ in range(rng.randint(0, drafts) if drafts and not prefill else 0):
            ahead = (choice + [EOS, EOS])[len(output) + len(drafted):]
            if rng.random() < 0.1:
                drafted.append(-1)  # a placeholder
            else:
                drafted.append(ahead[0] if ahead and rng.random() < 0.8 else rng.randrange(1, 2 + ALPHABET))
        for k in range(len(drafted) + 1):  # a row per draft: fed the last committed token, then the drafts
            slot_of_row.append(slot)
            pos.append(at + k)
            local_pos.append(k)
            fed.append(drafted[k - 1] if k else sequences[-1][at])
            base.append(K.OUT_OF_PHASE if out_of_phase else start)
            seen = [] if prefill else output + drafted[:k]
            wants.append(list(processor.allowed(seen)) if member and not out_of_phase else None)
    length = max(map(len, sequences)) + drafts
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(-1, 2 + ALPHABET, (requests, length), generator=g)
    for slot, sequence in enumerate(sequences):
        tokens[slot, :len(sequence)] = torch.tensor(sequence)
    pos.append(rng.randrange(length))  # the sentinel row: the tables' last slot, past the engine's
    base.append(rng.randrange(length + 2))
    wants.append(None)
    slot_of_row.append(requests)
    local_pos.append(0)
    fed.append(rng.randrange(1, 2 + ALPHABET))
    group.flush()
    window = TokenWindow("cpu").at(tokens.to(tokens_dtype), torch.tensor(prompt_len, dtype=torch.int32),
                                   torch.tensor(pos), torch.tensor(fed).to(tokens_dtype) if drafts else None,
                                   torch.tensor(local_pos) if drafts else None)
    rows = group.every_row(torch.tensor(slot_of_row))
    logits = torch.randn(len(pos), vocab, generator=g)
    logits[torch.rand(len(pos), vocab, generator=g) < 0.05] = float("nan")
    return GroupCase(group, rows, window, logits, torch.tensor(base), wants, scoped)


def fused_args(case: GroupCase, logits: torch.Tensor) -> tuple[Any, ...]:
    """The op's arguments for ``case``'s step writing into ``logits``, on ``logits``' device."""
    g, w, device = case.group, case.window, logits.device
    made = (w.tokens, case.base, w.pos, case.rows.slot_of_row, case.rows.member, g.prefix.dev, g.depth.dev,
            g.at_least.dev, g.ids.dev)
    drafts = tuple(None if t is None else t.to(device) for t in (w.input_ids, w.local_pos))
    return (logits, *(t.to(device) for t in made), *drafts, g.entries, g.width)


def eager_group(case: GroupCase, logits: torch.Tensor) -> None:
    """The group's eager device path on the CPU, writing into ``logits`` (host): ``decide_from_window``
    and ``apply_device_decisions`` (each row's history from its prompt's length), or for a
    ``scoped`` case ``apply_floored`` with each row's base as its floor (``OUT_OF_PHASE``:
    ``device_thinking.NEVER``); with drafts the rows' tokens by ``TokenWindow.head``."""
    step = StepInputs(logits, logits.view(-1), logits.shape[1], None, torch.empty(0, dtype=torch.long))
    if case.scoped:
        case.group.apply_floored(step, case.rows, case.window, case.base)
        return
    case.group.apply_device_decisions(step, case.rows, case.group.decide_from_window(case.rows, case.window))


def hosted_rows(case: GroupCase, got: torch.Tensor, logits: torch.Tensor) -> int:
    """Rows of ``got`` (host) that differ from the hosted processor's: a member row in phase keeps
    exactly its processor's ids (those not ``-inf``; ``logits`` holds no ``-inf``), every other row
    is ``logits``' bit for bit."""
    bad = 0
    for row, want in enumerate(case.wants):
        if want is None:
            bad += not K.same_bits(got[row], logits[row])
        else:
            bad += (~torch.isneginf(got[row])).nonzero().flatten().tolist() != sorted(set(want))
    return bad


def _rows_differing(a: torch.Tensor, b: torch.Tensor) -> int:
    return sum(not K.same_bits(x, y) for x, y in zip(a.cpu(), b.cpu()))


def bits(device: torch.device, vocab: int, batches: Sequence[int]) -> list[dict[str, Any]]:
    """Per batch, token dtype, logits dtype, scope and drafts (none, or up to 2 a request): rows
    where the kernel differs from the eager reference on ``device`` (``vs_eager``), from the group's
    eager path on the host (``vs_group``: ``eager_group``) and from the hosted processor
    (``vs_hosted``; ``vs_host`` their sum; each must be 0), and the logits the member rows in phase
    kept."""
    found = []
    for batch in batches:
        for tokens_dtype in (torch.int32, torch.int64):
            for dtype in (torch.float32, torch.bfloat16):
                for drafts in (0, 2):
                    found.append(_bits_of(device, vocab, batch, tokens_dtype, dtype, drafts))
    return found


def _bits_of(device: torch.device, vocab: int, batch: int, tokens_dtype: torch.dtype, dtype: torch.dtype,
             drafts: int) -> dict[str, Any]:
    """``bits``' figures of one case, printed."""
    scoped = (tokens_dtype == torch.int64) == (dtype == torch.float32)
    case = group_case(2000 + batch + 7 * (tokens_dtype == torch.int64) + 13 * drafts, requests=batch,
                      tokens_dtype=tokens_dtype, longest=6 if batch % 2 else 12, vocab=vocab, scoped=scoped,
                      drafts=drafts)
    logits = case.logits.to(dtype)
    kernel, by_eager, host = logits.to(device), logits.to(device), logits.clone()
    K.launch(*fused_args(case, kernel), chunk=K.CHUNK if device.type == "cuda" else 256)
    K.keep_reference(*fused_args(case, by_eager))
    eager_group(case, host)
    vs_eager, vs_group = _rows_differing(kernel, by_eager), _rows_differing(kernel, host)
    vs_hosted = hosted_rows(case, kernel.cpu(), logits)
    vs_host = vs_group + vs_hosted
    decided = torch.tensor([w is not None for w in case.wants])  # members in phase
    kept = int((~torch.isneginf(host) & decided[:, None]).sum())
    name = str(dtype).removeprefix("torch.")
    tokens = str(tokens_dtype).removeprefix("torch.")
    good = vs_eager == 0 and vs_host == 0
    print(f"multiple_choice bits batch {batch} tokens {tokens} {name}{' scoped' if scoped else ''} drafts "
          f"{drafts} vocab {vocab}: kernel vs eager {vs_eager} rows, vs group {vs_group} rows, vs hosted "
          f"processor {vs_hosted} rows ({kept} kept) -> {line(good)}", flush=True)
    return {"batch": batch, "tokens": tokens, "dtype": name, "scoped": scoped, "drafts": drafts,
            "vs_eager": vs_eager, "vs_host": vs_host, "vs_group": vs_group, "vs_hosted": vs_hosted,
            "kept": kept}


def run(device: torch.device, *, vocab: int = 151936, steps: int = 200,
        batches: Sequence[int] = BATCHES) -> tuple[bool, dict[str, Any]]:
    """Every figure of the module doc on a CUDA ``device``."""
    results: dict[str, Any] = {"bits": bits(device, vocab, batches), "kernels": [], "sync": [], "time": []}
    ok = all(r["vs_eager"] == 0 and r["vs_host"] == 0 for r in results["bits"])
    ok &= sum(r["kept"] for r in results["bits"]) > 0
    for batch in batches:
        for tokens_dtype, drafts in ((torch.int32, 0), (torch.int64, 2)):
            case = group_case(5 + batch + 13 * drafts, requests=batch, tokens_dtype=tokens_dtype, vocab=vocab,
                              drafts=drafts)
            logits = case.logits.to(device)
            args = fused_args(case, logits)
            ok &= measure(results, "multiple_choice",
                          {"batch": batch, "tokens": str(tokens_dtype).removeprefix("torch."), "drafts": drafts},
                          lambda: K.launch(*args),  # noqa: B023  # called at once
                          lambda: K.keep_reference(*args),  # noqa: B023  # called at once
                          steps, 1)
    return ok, results


def cpu_check(vocab: int = 1003, batches: Sequence[int] = (1, 6, 33)) -> bool:
    """``bits`` on the CPU with the kernel in Triton's interpreter, in a subprocess."""
    return interpreted(MODULE, vocab, batches)


def main(argv: Sequence[str] | None = None) -> int:
    return kernel_check.main(argv, module=MODULE, doc=__doc__, bits=bits, run=run, counted="kept", cpu_vocab=1003,
                             cpu_batches=(1, 6, 33))


if __name__ == "__main__":
    sys.exit(main())
