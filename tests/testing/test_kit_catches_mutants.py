"""The kit's checks can fail: with the hosted path's whole-row check of opaque processors
turned off (a row a plug-in left with no finite logit goes unnoticed, as before it existed), the
check that runs ``kit.keep_only`` fails on every shipped adapter; with phrase bans that ignore the
output, the golden vectors' check does."""

from __future__ import annotations

import pytest

from dynlogits.sdk import plans
from dynlogits.testing import CHECKS, SHIPPED, run_check
from dynlogits.testing.runner import drivers_for, resolve

EMPTIES = next(c for c in CHECKS if c.name == "a_plugin_kind_that_empties_its_row_fails_only_its_request")


@pytest.mark.parametrize("adapter", sorted(SHIPPED))
def test_the_empty_row_check_fails_when_opaque_rows_go_unchecked(adapter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = plans._empty_rows
    monkeypatch.setattr(plans, "_empty_rows", lambda logits, rows, witnesses, opaque: real(logits, rows, witnesses, set()))
    outcomes = [run_check(EMPTIES, driver) for driver in drivers_for(resolve(adapter))]
    assert outcomes and all(o.status == "failed" and "fail-stopped" in o.detail for o in outcomes), outcomes


VALID = next(c for c in CHECKS if c.name == "valid_vectors_behave_as_documented")


@pytest.mark.parametrize("adapter", sorted(SHIPPED))
def test_the_golden_vectors_catch_a_phrase_ban_that_ignores_the_output(adapter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``banned_phrases`` masking only its one-token phrases (never a phrase's last token after
    the rest of it), on the host (one processor or every row in one pass; V2's CPU route's walks) and
    on the device (a window that reads no token of the output),
    the valid golden vectors fail on every shipped adapter."""
    import torch

    from dynlogits.processors import banned_phrases, window

    monkeypatch.setattr(banned_phrases, "masked_after", lambda walks, histories, found, fail: None)
    monkeypatch.setattr(banned_phrases, "_walk_back", lambda node, history, i, first=0: ())  # V2's CPU route
    monkeypatch.setattr(window.TokenWindow, "tail",
                        lambda self, slots, width: torch.full((len(self.pos), width), -2, device=self.pos.device))
    monkeypatch.setattr(banned_phrases, "_tokens_at", lambda window, at: torch.full(at.shape, -2, device=at.device))
    outcomes = [run_check(VALID, driver) for driver in drivers_for(resolve(adapter))]
    assert outcomes and all(o.status == "failed" and "banned_phrases" in o.detail for o in outcomes), outcomes


SCOPED = next(c for c in CHECKS if c.name == "scoped_entries_act_in_their_phase_only")
OWN_PROMPT = next(c for c in CHECKS if c.name == "vectors_with_their_own_prompt_behave_as_documented")


@pytest.mark.parametrize("adapter", sorted(SHIPPED))
def test_the_scoped_check_catches_entries_that_ignore_their_scope(adapter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every scoped entry acting at every step (as if its scope were ``always``), the scoped
    check fails on every shipped adapter."""
    from dynlogits.sdk import realization

    monkeypatch.setattr(realization, "scoped", lambda processor, scope, phases: processor)
    outcomes = [run_check(SCOPED, driver) for driver in drivers_for(resolve(adapter))]
    assert outcomes and all(o.status == "failed" for o in outcomes), outcomes


@pytest.mark.parametrize("adapter", sorted(SHIPPED))
def test_the_own_prompt_vectors_catch_a_thinking_budget_that_ignores_the_prompt(adapter: str,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``thinking_budget`` following spans from the first generated token only (the request's
    prompt ignored), the vectors that name their own prompt fail on every shipped adapter."""
    from dynlogits.processors import thinking_budget

    real = thinking_budget.ThinkingBudgetProcessor
    monkeypatch.setattr(thinking_budget, "ThinkingBudgetProcessor",
                        lambda start, end, budget, prompt=(): real(start, end, budget))
    outcomes = [run_check(OWN_PROMPT, driver) for driver in drivers_for(resolve(adapter))]
    assert outcomes and all(o.status == "failed" and "reasoning_opened_by_the_prompt" in o.detail
                            for o in outcomes), outcomes
