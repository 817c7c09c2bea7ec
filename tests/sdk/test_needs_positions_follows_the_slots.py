"""``SlotBatch.needs_positions`` (kept between steps) follows every change of the groups' members:
a positional request entering a slot, leaving it, and failing."""

from __future__ import annotations

from dynlogits import sdk
from dynlogits.sdk.resident.slot_batch import SlotBatch

V = 64
EOS = 1


def realize(payload: list[dict]) -> sdk.GuardedRequest:
    request = sdk.realize(payload, vocab_size=V, stop_token_id=EOS, facts=sdk.RequestFacts(prompt_ids=()))
    assert request is not None and request.resident
    return request


BAN = [{"kind": "banned_tokens", "token_ids": [5, 6]}]
FORCE = [{"kind": "forced_sequence", "token_ids": [7, 8], "eos_token_id": EOS}]


def test_positions_are_needed_exactly_while_a_slot_holds_a_positional_request() -> None:
    batch = SlotBatch(num_slots=4, vocab_size=V, device="cpu", token_window=True)
    assert not batch.needs_positions
    batch.assign(0, realize(BAN))
    assert not batch.needs_positions
    batch.assign(1, realize(FORCE))
    assert batch.needs_positions
    batch.assign(1, None)  # it left
    assert not batch.needs_positions
    batch.assign(1, realize(FORCE))
    assert batch.needs_positions
    batch.assign(1, realize(BAN))  # another request took its slot
    assert not batch.needs_positions
    batch.assign(2, realize(FORCE))
    assert batch.needs_positions
    batch.mark_failed(2)  # its program stops running
    assert not batch.needs_positions
