"""``EntryTablesGroup`` (the device entry tables of ``banned_phrases`` and ``multiple_choice`` under
Model Runner V2): sized by the requests in the slots now, through random arrivals and departures."""

from __future__ import annotations

import random

import pytest
import torch

from dynlogits.processors.banned_phrases import BannedPhrasesGroup, BannedPhrasesProcessor
from dynlogits.processors.multiple_choice import MultipleChoiceGroup, MultipleChoiceProcessor

EOS = 1


def _template(kind: type, rng: random.Random):  # noqa: ANN202
    ids = list(range(2, 12))
    if kind is BannedPhrasesGroup:
        phrases = [[rng.choice(ids) for _ in range(rng.randint(2, 5))] for _ in range(rng.randint(1, 6))]
        return BannedPhrasesProcessor(phrases).template
    choices = [[rng.choice(ids) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 8))]
    return MultipleChoiceProcessor(choices, EOS).template


@pytest.mark.parametrize("kind", [BannedPhrasesGroup, MultipleChoiceGroup])
def test_the_tables_hold_every_member_and_admission_counts_the_members_in_the_slots_now(kind: type) -> None:
    rng = random.Random(kind.__name__)
    group = kind(0, 9, torch.device("cpu"))
    group.from_window = True
    held: dict[int, tuple[int, int]] = {}
    grew_smaller = False
    for _ in range(400):
        slot = rng.randrange(3)
        if slot in held and rng.random() < 0.5:
            group.assign(slot, None)
            del held[slot]
        else:
            if slot in held:
                group.assign(slot, None)  # as SlotBatch.assign detaches a slot before it is reused
            template = _template(kind, rng)
            before = (group.entries, group.width)
            group.assign(slot, template)
            held[slot] = template.geometry
            after = (group.entries, group.width)
            grew_smaller |= after != before and (after[0] < before[0] or after[1] < before[1])
        want = (max((e for e, _ in held.values()), default=0), max((w for _, w in held.values()), default=0))
        assert group.members_geometry() == want
        assert group.entries >= want[0] and group.width >= want[1]  # every member's entries fit
        assert group.prefix.dev.shape[1] == max(1, group.entries * group.width)
    assert grew_smaller  # a rebuild dropped the geometry of a member that had left
