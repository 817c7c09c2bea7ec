"""The two admission gaps of issue 47, through ``launch/agg.sh`` (``open_agg``: the operator's
reasoning delimiters ``<think>``/``</think>``) and the real ``openai`` client: each payload used to be
admitted and then act wrongly or fail while it ran; now each is a 400 naming the field."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from .conftest import model_name, openai_client
from .launcher import Deployment

pytestmark = pytest.mark.engine


def _refusal(d: Deployment, entries: list[dict[str, Any]], **fields: Any) -> Any:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(d).chat.completions.create(model=model_name(d), messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=8, temperature=0,
                                                 extra_body={"logits_processors": entries, **fields})
    return caught.value.body


def test_a_thinking_budget_scoped_to_the_answer_on_the_reasoning_delimiters_is_refused(open_agg: Deployment) -> None:
    """It would count a span the prompt opened in the answer and force ``</think>`` there."""
    error = _refusal(open_agg, [{"kind": "thinking_budget", "budget": 2, "scope": "answer"}])
    assert error["param"] == "logits_processors[0].scope", error
    assert "cannot be scoped to answer" in error["message"], error


def test_a_phrase_ban_on_the_end_tag_beside_a_thinking_budget_is_refused_like_the_id_ban(
        open_agg: Deployment) -> None:
    """``bad_words`` maps onto ``banned_phrases``: banning the end tag leaves the forced close no token,
    exactly as the same ban through ``banned_tokens`` does (which was already refused)."""
    error = _refusal(open_agg, [{"kind": "thinking_budget", "budget": 4}], bad_words=["</think>"])
    assert "end_token_ids" in error["param"] and "thinking span" in error["message"], error
