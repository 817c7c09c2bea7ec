"""``dry``'s C reader of the V1 rows' live lists (``dry_native``'s ``dry_read``, loaded holding the
GIL): it steps the rows only where every list is the row's own object, as long as the row expects,
its last ``TAIL`` earlier tokens the row's window and its newest an id (not a placeholder, inside
int32), and otherwise changes nothing, leaving no Python error set. Needs a C compiler (``cc``)."""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest

from dynlogits.processors import dry_native

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")


@pytest.fixture(scope="module")
def reader() -> Any:
    assert dry_native.library(wait=True) is not None, "the native step did not build with this machine's cc"
    read = dry_native.reader()
    assert read is not None, "the C reader of the rows' lists did not load here"
    return read


def _read(read: Any, histories: list[Any], sources: list[Any], lens: list[int], windows: list[list[int]]) -> tuple[int, list[int], list[int]]:
    """``dry_read`` over rows ``0 ..`` of ``histories``: its result, the rows' lengths and new tokens after it."""
    tok = [np.array([*w, 0], dtype=np.int32) for w in windows]
    ends = [np.array([len(w)], dtype=np.int64) for w in windows]
    arrays = [np.arange(len(sources), dtype=np.int64), np.array([id(s) for s in sources], dtype=np.int64),
              np.array(lens, dtype=np.int64), np.array([t.ctypes.data for t in tok], dtype=np.int64),
              np.array([e.ctypes.data for e in ends], dtype=np.int64)]
    new = np.full(len(sources), -7, dtype=np.int32)
    got = read(len(sources), histories, *(a.ctypes.data for a in arrays), dry_native.TAIL, new.ctypes.data)
    return got, arrays[2].tolist(), new.tolist()


def test_the_c_reader_steps_only_lists_that_hold_and_changes_nothing_otherwise(reader: Any) -> None:
    big = 1 << 20
    window = [big + i for i in range(40)]
    held = [*window, 9]
    short = [3, 4]
    got = _read(reader, [held, short], [held, short], [41, 3], [window, [3, 4][:1]])
    assert got[0] == 1  # the second list is one token short of what its row expects
    got = _read(reader, [held, [3, 4]], [held, short], [41, 2], [window, [3]])
    assert got == (1, [41, 2], [-7, -7])  # another list object than the row's: nothing stepped
    got = _read(reader, [held, short], [held, short], [41, 2], [window, [3]])
    assert got == (-1, [42, 3], [9, 4])
    tail = dry_native.TAIL
    deep, deeper = list(held), list(held)
    deep[-1 - tail] = 5  # the farthest earlier token compared: seen
    deeper[-2 - tail] = 5  # one further back: not compared, as in the Python processors
    assert _read(reader, [deep], [deep], [41], [window])[0] == 0
    assert _read(reader, [deeper], [deeper], [41], [window])[0] == -1
    for newest in (-1, 1 << 31, 1 << 70, 2.0, "x", None):  # a placeholder, past int32, not an int
        odd = [*window, newest]
        assert _read(reader, [odd], [odd], [41], [window]) == (0, [41], [-7])
    assert _read(reader, [held], [held, held], [41, 41], [window, window])[0] == 1  # past the histories' end
