"""``no_repeat_ngram``'s compiled pass reads (``no_repeat_ngram_pass_native``) held to their
contract: ``ngram_read`` steps every row or none (a rewrite inside the compared part, a wrong
length, a placeholder, a non-int, an int past int64, an item whose == empties the list), compares a short list whole
and a long one on its tail, and equal ints that are other objects match; ``ngram_gather`` copies
every row's ids and takes every node's newest link, or changes nothing (a stale base, a node of
another type, ids that do not fit). Needs a C compiler (``cc``)."""

from __future__ import annotations

import shutil
from array import array
from typing import Any

import pytest

from dynlogits.processors import no_repeat_ngram_pass_native as pass_native
from dynlogits.processors.no_repeat_ngram import _Node
from dynlogits.processors.no_repeat_ngram_pass_native import address

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")

BIG = 1 << 40


@pytest.fixture(scope="module")
def fns() -> tuple[Any, Any]:
    built = pass_native.functions(wait=True)
    assert built is not None, "the compiled pass did not load here"
    return built


def _read(fns: tuple[Any, Any], sources: list[list[Any]], mirrors: list[list[Any]], tail: int = 0) -> tuple[int, list[int]]:
    out = array("q", [-7] * len(sources))
    got = fns[0](len(sources), tuple(sources), tuple(mirrors), tail, address(out))
    return int(got), out.tolist()


def test_every_row_is_read_and_appended_where_each_holds(fns: tuple[Any, Any]) -> None:
    a, b = [3, BIG, 4], [5, 6]
    mirrors = [[3, int(str(BIG))], [5]]  # an equal int that is another object matches
    assert _read(fns, [a, b], mirrors) == (-1, [4, 6])
    assert mirrors == [[3, BIG, 4], [5, 6]] and mirrors[0][2] is a[2]


@pytest.mark.parametrize("case", ["rewritten", "longer", "same_length", "placeholder", "not_an_int", "past_int64"])
def test_a_row_that_does_not_hold_leaves_every_mirror_as_it_was(fns: tuple[Any, Any], case: str) -> None:
    good, bad = [7, 8, 9], [1, 2, 3]
    bad_items: list[Any] = bad
    mirror = [1, 2]
    if case == "rewritten":
        bad[0] = 5
    elif case == "longer":
        bad.append(4)
    elif case == "same_length":
        bad.pop()
    elif case == "placeholder":
        bad[-1] = -1
    elif case == "not_an_int":
        bad_items[-1] = "3"
    else:
        bad[-1] = 1 << 64
    mirrors = [[7, 8], mirror]
    assert _read(fns, [good, bad], mirrors)[0] == 1
    assert mirrors == [[7, 8], [1, 2]]


def test_a_long_list_is_compared_on_its_tail_and_a_short_one_whole(fns: tuple[Any, Any]) -> None:
    history = list(range(100)) + [100]
    deep, shallow = history[:100], history[:100]
    deep[10] = -5  # 90 back: outside a tail of 64
    shallow[60] = -5  # 40 back: inside it
    assert _read(fns, [history], [deep[:]], tail=64)[0] == -1
    assert _read(fns, [history], [shallow[:]], tail=64)[0] == 0
    assert _read(fns, [history], [deep[:]], tail=0)[0] == 0
    edge, past = history[:100], history[:100]
    edge[100 - 64] = -5  # the tail's first token
    past[100 - 65] = -5  # the one before it
    assert _read(fns, [history], [edge], tail=64)[0] == 0
    assert _read(fns, [history], [past], tail=64)[0] == -1


def _node(base: int, ids: list[int], token: int | None, to: Any) -> _Node:
    node = _Node((0,))
    node.base, node.flat, node.token, node.to = base, array("q", ids).tobytes(), token, to
    return node


def _gather(fns: tuple[Any, Any], nodes: list[Any], bases: list[int], cap: int = 1024) -> tuple[int, list[Any], list[int], list[int]]:
    guesses: list[Any] = ["old"] * len(nodes)
    tokens, out = array("q", [-7] * len(nodes)), bytearray(max(cap, 8))
    got = int(fns[1](len(nodes), nodes, bases, _Node, pass_native.slot_table(_Node), guesses, address(tokens), address(out), cap))
    return got, guesses, tokens.tolist(), array("q", bytes(out[:max(got, 0)])).tolist()


def test_gather_copies_every_rows_ids_and_takes_each_nodes_newest_link(fns: tuple[Any, Any]) -> None:
    base0, base1 = 1 << 30, 1 << 31
    after = _Node((1,))
    nodes = [_node(base0, [base0 + 3, base0 + 9], 12, after), _node(base1, [], None, None), _node(base0, [base0 + 1], BIG, after)]
    got, guesses, tokens, ids = _gather(fns, nodes, [base0, base1, base0])
    assert got == 24 and ids == [base0 + 3, base0 + 9, base0 + 1]
    assert guesses == [after, None, after] and tokens == [12, -1, BIG]


@pytest.mark.parametrize("case", ["stale_base", "equal_base_other_object", "other_type", "too_small"])
def test_gather_changes_nothing_where_a_row_does_not_hold(fns: tuple[Any, Any], case: str) -> None:
    base = 1 << 30
    nodes: list[Any] = [_node(base, [base + 1], 4, None), _node(base, [base + 2, base + 3], 5, None)]
    bases = [base, base]
    cap, want = 1024, -2
    if case == "stale_base":
        nodes[1].base = None
    elif case == "equal_base_other_object":
        bases[1] = int(str(base))  # made for another layout: compared by identity (a rebase makes it the layout's own)
    elif case == "other_type":
        nodes[1] = pass_native._ProbeNode(base, b"", 5)  # the same slots, in the same places
    else:
        cap, want = 16, -3
    got, guesses, tokens, _ = _gather(fns, nodes, bases, cap)
    assert got == want and guesses == ["old", "old"] and tokens == [-7, -7]


def test_the_layouts_the_source_reads_are_checked_before_loading() -> None:
    assert pass_native.layout_holds()
    offsets = pass_native.slot_offsets(_Node, pass_native.GATHER_NAMES)
    assert offsets is not None and len(set(offsets)) == 4

    class Plain:  # no slots: nothing found where the names are not slots
        pass

    assert pass_native.slot_offsets(Plain, ["base"]) is None


def test_an_item_whose_equality_changes_the_lists_ends_the_read_safely(fns: tuple[Any, Any]) -> None:
    history: list[Any] = []

    class Rewrites:
        def __eq__(self, other: object) -> bool:
            history.clear()  # its compare empties the list being read
            return True

        __hash__ = object.__hash__

    history.extend([Rewrites(), 4, 5])
    mirror: list[Any] = [Rewrites(), 4]
    assert _read(fns, [history], [mirror])[0] == 0
    assert len(mirror) == 2 and history == []
