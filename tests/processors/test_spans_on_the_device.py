"""``DeviceThinking`` follows every slot's span as the host automaton (``SpanScanner``) does, from the
engine's token matrix and the step's drafts: random delimiters of one to three tokens (overlapping,
equal, one a suffix of the other), short prompts a delimiter may straddle or leave a span open in,
steps that commit no token or as many as a request had rows, resumed requests (followed on the device
or scanned once on the host) and reused slots. Checked on ``thinking_budget`` (its span start and
the token each row is forced to), ``trigger`` (where it fired and the phrase token forced) and a
scoped entry (whether each row is in its phase), on both paths of a step: the eager rounds and
decisions (the CPU), and the fused op ``spans_advance_`` (every round and, for ``thinking_budget``
and ``trigger``, each slot's decision; its CPU implementation, the eager reference the Triton
kernel is checked against in tests/kernels/test_spans_kernels.py)."""

from __future__ import annotations

import random

import pytest
import torch

from dynlogits import sdk
from dynlogits.kernels.spans import GATE
from dynlogits.processors.device_thinking import CLOSED, DeviceThinking
from dynlogits.processors.ops import ForceToken
from dynlogits.processors.scope import Phases, ScopedGroup
from dynlogits.processors.slots import GatheredRows
from dynlogits.processors.spans import SpanScanner
from dynlogits.processors.thinking_budget import ThinkingBudgetGroup, ThinkingBudgetProcessor
from dynlogits.processors.trigger import TriggerGroup, TriggerProcessor
from dynlogits.sdk.realization import RequestFacts

V, EOS, SLOTS, WIDTH = 32, 1, 4, 96
TOKENS = [5, 6, 7]  # few ids: delimiters occur often and overlap


def _delimiter(rng: random.Random) -> list[int]:
    return [rng.choice(TOKENS) for _ in range(rng.randint(1, 3))]


def _thinking(rng: random.Random, prompt: list[int]) -> tuple[list[dict], ThinkingBudgetProcessor]:
    start, end, budget = _delimiter(rng), _delimiter(rng), rng.randint(1, 4)
    payload = [{"kind": "thinking_budget", "start_token_ids": start, "end_token_ids": end, "budget": budget}]
    return payload, ThinkingBudgetProcessor(start, end, budget, prompt)


def _trigger(rng: random.Random, prompt: list[int]) -> tuple[list[dict], TriggerProcessor]:
    trigger, phrase = _delimiter(rng), [rng.choice([11, 12, 13]) for _ in range(rng.randint(1, 3))]
    payload = [{"kind": "trigger", "trigger_token_ids": trigger, "phrase_token_ids": phrase}]
    return payload, TriggerProcessor(trigger, phrase)


Scope = tuple[tuple[int, ...], tuple[int, ...], str]
Host = ThinkingBudgetProcessor | TriggerProcessor | Scope
GROUPS = {"thinking_budget": ThinkingBudgetGroup, "trigger": TriggerGroup, "scoped": ScopedGroup}


def _scoped(rng: random.Random, prompt: list[int]) -> tuple[list[dict], Scope]:
    start, end, scope = _delimiter(rng), _delimiter(rng), rng.choice(["reasoning", "answer"])
    payload = [{"kind": "reasoning", "start_token_ids": start, "end_token_ids": end},
               {"kind": "banned_tokens", "token_ids": [20, 21], "scope": scope}]
    return payload, (tuple(start), tuple(end), scope)


def _request(kind: str, rng: random.Random, prompt: list[int]) -> tuple[list[dict], Host]:
    if kind == "thinking_budget":
        return _thinking(rng, prompt)
    return _trigger(rng, prompt) if kind == "trigger" else _scoped(rng, prompt)


@pytest.mark.parametrize("path", ["eager", "fused"])
@pytest.mark.parametrize("kind", ["thinking_budget", "trigger", "scoped"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_every_row_follows_the_host_automatons_span(kind: str, drafts: int, path: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "fused":  # the fused op on the CPU (its CPU implementation), as the CUDA model runs it
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    rng = random.Random(f"{kind}-{drafts}")
    thinking = DeviceThinking(SLOTS + 1, "cpu", max_new=1 + drafts)
    tokens = torch.zeros(SLOTS, WIDTH, dtype=torch.int32)
    prompts: list[list[int]] = [[] for _ in range(SLOTS)]
    outputs: list[list[int]] = [[] for _ in range(SLOTS)]
    hosts: list[Host | None] = [None] * SLOTS
    checked = {"open": 0, "closed": 0}
    for _ in range(30):
        for slot in range(SLOTS):  # some slots get a new request (reused), some resumed
            if hosts[slot] is not None and rng.random() > 0.3:
                continue
            prompt = [rng.choice(TOKENS + [9]) for _ in range(rng.randint(1, 4))]
            output = [rng.choice(TOKENS + [9]) for _ in range(rng.choice([0, 0, 2, 5, 30]))]
            payload, hosts[slot] = _request(kind, rng, prompt)
            request = sdk.realize(payload, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=prompt))
            assert request is not None
            thinking.assign(slot, request, resumed=len(output))
            prompts[slot], outputs[slot] = prompt, output
        thinking.flush()
        for _ in range(3):
            for slot in range(SLOTS):
                history = prompts[slot] + outputs[slot]
                tokens[slot] = torch.tensor(rng.choices(TOKENS, k=WIDTH))  # stale ids past the history
                tokens[slot, : len(history)] = torch.tensor(history, dtype=torch.int32)
            prompt_len = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
            total_len = prompt_len + torch.tensor([len(o) for o in outputs], dtype=torch.int32)
            fed = [[rng.choice(TOKENS + [9]) for _ in range(rng.randint(0, drafts))] for _ in range(SLOTS)]
            rows = [(slot, k) for slot in range(SLOTS) for k in range(1 + len(fed[slot]))]
            # a request's first row is fed its last committed token, the next ones its drafts
            input_ids = torch.tensor([(prompts[s] + outputs[s])[-1] if k == 0 else fed[s][k - 1]
                                      for s, k in rows]) if drafts else None
            local_pos = torch.tensor([k for _, k in rows]) if drafts else None
            thinking.step(tokens, prompt_len, total_len, input_ids=input_ids, local_pos=local_pos,
                          rows_per_request=1 + drafts)
            ((level, group_type), tables), = thinking.tables.items()
            group = group_type(level, SLOTS + 1, torch.device("cpu"))
            assert isinstance(group, GROUPS[kind])
            for slot in range(SLOTS):  # the committed state
                host = hosts[slot]
                if isinstance(host, TriggerProcessor):
                    want = host.fired_at(outputs[slot])
                else:
                    want = SpanScanner(*tables._rows[slot][:2], prompts[slot]).span(outputs[slot])
                assert int(tables.span[slot]) == (CLOSED if want is None else want), (slot, prompts[slot], outputs[slot])
            decided = thinking.decide(group, GatheredRows(torch.tensor([s for s, _ in rows]), torch.ones(len(rows), dtype=torch.bool)))
            for r, (slot, k) in enumerate(rows):
                seen = outputs[slot] + fed[slot][:k]
                host = hosts[slot]
                if kind == "thinking_budget":
                    assert isinstance(host, ThinkingBudgetProcessor)
                    op = ThinkingBudgetProcessor(host.start, host.end, host.budget, prompts[slot]).row_op(seen)
                    assert int(decided[r]) == (op.token_id if isinstance(op, ForceToken) else -1), (slot, seen)
                    opened = host.span(seen) is not None
                elif kind == "trigger":
                    assert isinstance(host, TriggerProcessor)
                    op = TriggerProcessor(host.trigger, host.phrase).row_op(seen)
                    assert int(decided[r]) == (op.token_id if isinstance(op, ForceToken) else -1), (slot, seen)
                    opened = host.fired_at(seen) is not None
                    checked["forced"] = checked.get("forced", 0) + (op is not None)
                else:
                    assert isinstance(host, tuple)
                    start, end, scope = host
                    phase, _ = Phases((start, end), prompts[slot]).at(seen)
                    assert bool(decided[r]) == (phase == scope), (slot, prompts[slot], seen)
                    opened = phase == "reasoning"
                checked["open" if opened else "closed"] += 1
            for slot in range(SLOTS):  # commit nothing (not scheduled), or accepted drafts and one token
                if rng.random() > 0.2:
                    outputs[slot] += fed[slot][: rng.randint(0, len(fed[slot]))] + [rng.choice(TOKENS + [9])]
    assert checked["open"] > 100 and checked["closed"] > 100 and checked.get("forced", 20) >= 20, checked
