"""A client of ``launch/agg.sh`` can neither switch the operator's entries off nor escape them, and its
limits count only its own entries (issue 47, items 3 and 6), through the stock ``openai`` client.

``open_agg`` (``tests/deploy/open_deployment.yaml``): the default limits, every kind but ``python``
allowed, operator entries banning ids 735 and 450, banning id 300 in the answer, and reasoning
delimiters ``<think>``/``</think>``: every request that activates anything carries 3 deployment
entries (the reasoning entry and the two bans)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from dynlogits.specs import DEFAULT_LIMITS

from .conftest import model_name, openai_client
from .launcher import Deployment

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "Tell me something."}]
BANNED = (735, 450)  # the operator's ban everywhere


def chat(d: Deployment, entries: list[dict[str, Any]] | None, **kwargs: Any) -> Any:
    body: dict[str, Any] = dict(kwargs.pop("extra_body", {}))
    if entries is not None:
        body["logits_processors"] = entries
    return openai_client(d).chat.completions.create(model=model_name(d), messages=MESSAGES, extra_body=body, **kwargs)


def refusal(d: Deployment, entries: list[dict[str, Any]] | None, **kwargs: Any) -> dict[str, Any]:
    """The 400's error object (``message``, ``param``) for a request that must be refused."""
    with pytest.raises(openai.BadRequestError) as info:
        chat(d, entries, **kwargs)
    assert info.value.status_code == 400
    return info.value.body  # type: ignore[return-value]


def one_token(tokenizer: Any, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text!r} is not one token: {ids}"
    return ids[0]


def _bans(n: int) -> list[dict[str, Any]]:
    """``n`` bans of one id each, none of them the operator's."""
    return [{"kind": "banned_tokens", "token_ids": [10 + i]} for i in range(n)]


# -- ignore_eos cannot switch the operator's entries off -------------------------------------------
@pytest.mark.parametrize("entry", [{"kind": "deadline", "seconds": 30},
                                   {"kind": "multiple_choice", "choices": [[40, 41], [42]]}],
                         ids=["deadline", "multiple_choice ids without eos"])
def test_ignore_eos_beside_an_entry_that_needs_a_stop_token_is_refused_naming_both(open_agg: Deployment,
                                                                                    entry: dict[str, Any]) -> None:
    """Before, the engine failed to realize the entry and dropped the whole payload, the operator's
    bans included, and the client got a normal answer."""
    error = refusal(open_agg, [entry], max_tokens=8, extra_body={"ignore_eos": True})
    assert error["param"] == "logits_processors[0]", error
    assert entry["kind"] in error["message"] and "ignore_eos" in error["message"], error


def test_an_entry_that_fails_in_the_engine_leaves_the_operators_ban_applying(open_agg: Deployment,
                                                                             tokenizer: Any) -> None:
    """A ``prompt_tokens`` restrict on a prompt made only of the banned ids realizes, in the engine,
    to an allowed set the operator's ban empties: that entry is left out and the failure reported;
    the others still apply on a request under ``ignore_eos``, which nothing can end. The client's
    bias prefers the banned ids to " the", so only the ban keeps them out: every token streamed is
    " the", up to the end of the answer or up to the error event that tells the client the request
    failed (naming the entry). Before, the whole payload was dropped and the request ran unconstrained."""
    the = one_token(tokenizer, " the")
    entries = [{"kind": "logit_bias", "bias": {"735": 100.0, "450": 100.0, str(the): 50.0}},
               {"kind": "prompt_tokens", "mode": "restrict"}]
    since = open_agg.log_size()
    stream = openai_client(open_agg).completions.create(
        model=model_name(open_agg), prompt=list(BANNED), max_tokens=8, temperature=0, stream=True,
        extra_body={"logits_processors": entries, "ignore_eos": True})
    text, error = "", None
    try:
        for chunk in stream:
            text += "".join(c.text for c in chunk.choices)
    except openai.APIError as err:  # the failure told to the client in-band
        error = str(err)
    assert text == " the" * (len(text) // 4), text
    assert (error is None and text == " the" * 8) or (error is not None and "logits_processors[1]" in error), (text, error)
    open_agg.wait_for_log("continues with the entries that were realized", since)


# -- a client's reasoning entry cannot move the operator's phases -----------------------------------
def test_a_clients_reasoning_entry_is_refused_naming_the_operators_scoped_entry(open_agg: Deployment) -> None:
    """Before, the client's delimiters replaced the operator's, so the ban scoped to the answer
    could be escaped by declaring the answer a reasoning span."""
    entry = {"kind": "reasoning", "start_token_ids": [8], "end_token_ids": [9]}
    error = refusal(open_agg, [{"kind": "banned_tokens", "token_ids": [5]}, entry], max_tokens=8)
    assert error["param"] == "logits_processors[1]", error
    assert "deployment entries[1] (banned_tokens, scope answer)" in error["message"], error


# -- limits count the client's own entries ------------------------------------------------------------
def test_a_clients_max_entries_counts_only_its_own_entries(open_agg: Deployment) -> None:
    """15 and 16 of the client's own beside the deployment's 3 are admitted, 17 refused naming the
    client's field. Before, the engine counted the deployment's entries against the client's 16:
    15 were refused with ``param: null`` and an internal name (``dynamo_logits``)."""
    for own in (15, DEFAULT_LIMITS.max_entries):
        reply = chat(open_agg, _bans(own), max_tokens=4, temperature=0)
        assert reply.choices[0].finish_reason in ("stop", "length")
    error = refusal(open_agg, _bans(DEFAULT_LIMITS.max_entries + 1), max_tokens=4)
    assert error["param"] == "logits_processors", error
    assert f"at most {DEFAULT_LIMITS.max_entries} entries (limit max_entries)" in error["message"], error
