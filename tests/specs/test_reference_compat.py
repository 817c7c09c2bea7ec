"""forced_sequence is byte-compatible with the reference (ai-dynamo 1.6.1) in both directions."""

import json

import pytest

from dynlogits.specs import ForcedTokenSequenceSpec, decode_wire_payload, encode_entries

reference = pytest.importorskip(
    "dynamo.common.backend.engine",
    reason="ai-dynamo 1.6.1 not importable (scripts/setup-env.sh installs it with --no-deps)",
)


@pytest.mark.parametrize("ids,eos", [((9906, 1917, 0), 128009), ((0,), 0), (tuple(range(50)), 2)])
def test_our_payload_is_byte_identical_to_the_reference(ids, eos):
    ours = encode_entries([ForcedTokenSequenceSpec(token_ids=ids, eos_token_id=eos)])
    theirs = reference.serialize_logits_processor_entries([reference.ForcedTokenSequenceSpec(token_ids=ids, eos_token_id=eos)])
    assert json.dumps(ours).encode() == json.dumps(theirs).encode()


def test_reference_reads_our_payload():
    ours = encode_entries([ForcedTokenSequenceSpec(token_ids=(5, 6, 7), eos_token_id=1)])
    (entry,) = reference.deserialize_logits_processor_entries(ours)
    assert entry == reference.ForcedTokenSequenceSpec(token_ids=(5, 6, 7), eos_token_id=1)


def test_we_read_the_reference_payload():
    theirs = reference.serialize_logits_processor_entries([reference.ForcedTokenSequenceSpec(token_ids=(5, 6), eos_token_id=1)])
    (entry,) = decode_wire_payload(theirs)
    assert (entry.kind, entry.token_ids, entry.eos_token_id) == ("forced_sequence", (5, 6), 1)
