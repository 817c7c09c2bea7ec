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
    the rest of it), the valid golden vectors fail on every shipped adapter."""
    from dynlogits.processors import banned_phrases

    monkeypatch.setattr(banned_phrases.BannedPhrasesProcessor, "after", lambda self, ids: ())
    outcomes = [run_check(VALID, driver) for driver in drivers_for(resolve(adapter))]
    assert outcomes and all(o.status == "failed" and "banned_phrases" in o.detail for o in outcomes), outcomes
