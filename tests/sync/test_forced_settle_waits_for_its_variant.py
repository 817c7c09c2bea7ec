"""A forced sequence's gathered rows (Model Runner V2's, or the V1 runner's scoped rows decided on
the host; plain, or scoped to a phase and counted from its stretch) settle in one fused op
(``ForcedSequenceGroup.settle_at_counts``). On CUDA its kernel
variant may not have compiled yet: the gate (``thinking_force.run_gated``) then runs the step
without the settle while the variant compiles off the step. That step must write what the settle
writes and report the same failures, or a request's output would depend on when a compile landed."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from dynlogits.kernels import thinking_force
from dynlogits.testing.cuda.drive import EOS, Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda


def _plain(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"kind": "forced_sequence", "token_ids": rng.sample(range(10, 60), rng.randint(1, 5)),
             "eos_token_id": EOS}]


def _scoped(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
            {"kind": "forced_sequence", "token_ids": rng.sample(range(10, 60), 3), "eos_token_id": EOS,
             "scope": rng.choice(["answer", "reasoning"])}]


def _stretches(seed: int) -> list[dict[str, Any]]:
    """Phases that alternate: the answer's bias opens a reasoning span, whose scoped forced sequence
    ends it, so rows go out of phase and each new stretch counts from 0 again."""
    rng = random.Random(seed)
    return [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
            {"kind": "logit_bias", "bias": {"5": 60.0}, "scope": "answer"},
            {"kind": "forced_sequence", "token_ids": [*rng.sample(range(10, 60), rng.randint(1, 3)), 7],
             "eos_token_id": EOS, "scope": "reasoning"}]


def _drive(runner: str, sim: SimCuda, scenario: Scenario):  # noqa: ANN202
    return drive_v1(sim, scenario) if runner == "v1" else drive_v2(sim, scenario, drafts=int(runner[-1]))


#: the V1 runner settles only a scoped sequence's rows this way (its plain rows are listed)
CASES = [(payload, runner) for payload in (_plain, _scoped, _stretches) for runner in ("v1", "v2 drafts 0", "v2 drafts 2")
         if not (payload is _plain and runner == "v1")]


@pytest.mark.parametrize(("payload", "runner"), CASES, ids=[f"{p.__name__[1:]}-{r}" for p, r in CASES])
def test_the_step_without_the_settle_writes_what_the_settle_writes(monkeypatch: pytest.MonkeyPatch, payload,  # noqa: ANN001
                                                                    runner: str) -> None:
    scenario = Scenario(vocab=256, payloads=[payload(i) for i in range(4)], steps=9)
    with SimCuda() as sim:
        settled = _drive(runner, sim, scenario)
    waited: list[int] = []

    def not_landed(device: torch.device, args: tuple[Any, ...], fused: Any, eager: Any) -> Any:
        waited.append(int(args[-1]))  # scoped or not
        return eager()

    monkeypatch.setattr(thinking_force, "run_gated", not_landed)
    with SimCuda() as sim:
        unsettled = _drive(runner, sim, scenario)
    assert waited, "no step reached the settle"
    assert len(settled.logits) == len(unsettled.logits) == scenario.steps
    for step, (a, b) in enumerate(zip(settled.logits, unsettled.logits, strict=True)):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()), step
    assert settled.failures == unsettled.failures and [str(s) for s in unsettled.syncs] == []
