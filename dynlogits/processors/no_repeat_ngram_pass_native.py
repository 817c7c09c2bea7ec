"""``no_repeat_ngram``'s V1 pass (``no_repeat_ngram._Pass``) in C where it reads cold objects: the
rows' live lists checked and their new tokens read (``ngram_read``), and the nodes the rows move to
read (``ngram_gather``: their flat ids copied out, their newest links taken as the next guesses),
each a stage at a time for every row, so the rows' cache misses overlap. A library of its own,
loaded with ``ctypes.PyDLL`` (it calls CPython's C API, declared in the source, holding the GIL),
built with ``native_library.NativeLibrary`` at its first use after its probe passes; until then,
with ``DYN_NO_REPEAT_NGRAM_NATIVE=0``, where it cannot be built or on a free-threaded interpreter
(one info line), the pass runs in Python, with the same results
(``tests/processors/test_no_repeat_ngram_pass.py`` runs on both)."""

from __future__ import annotations

import ctypes
import logging
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from .native_library import NativeLibrary
from .no_repeat_ngram_native import ENV_SWITCH

__all__ = ["GATHER_NAMES", "PASS", "address", "functions", "layout_holds", "reset", "slot_offsets", "slot_table"]

log = logging.getLogger("dynlogits.processors.no_repeat_ngram_pass_native")

PASS = r"""#include <stdint.h>
#include <string.h>

/* CPython's C API, declared here (no Python.h needed): functions of the running interpreter, which
   exports them to the libraries it loads, as to its extension modules. */
typedef struct _object PyObject;
extern PyObject *PyTuple_GetItem(PyObject *tuple, intptr_t index);
extern PyObject *PyList_GetItem(PyObject *list, intptr_t index);
extern intptr_t PyList_Size(PyObject *list);
extern int PyList_Append(PyObject *list, PyObject *item);
extern int PyList_SetItem(PyObject *list, intptr_t index, PyObject *item);
extern int PyList_SetSlice(PyObject *list, intptr_t low, intptr_t high, PyObject *items);
extern long PyLong_AsLongAndOverflow(PyObject *value, int *overflow);
extern int PyObject_RichCompareBool(PyObject *a, PyObject *b, int op);
extern int PyBytes_AsStringAndSize(PyObject *bytes, char **buffer, intptr_t *length);
extern void Py_IncRef(PyObject *object);
extern void Py_DecRef(PyObject *object);
extern PyObject *PyErr_Occurred(void);
extern void PyErr_Clear(void);

/* CPython's layouts, checked before this library is loaded (``layout_holds``): a list's items
   array after its size, an object's type after its reference count */
#define ITEMS(list) (((PyObject *const *const *)(list))[3])
/* an object's type: CPython keeps it after the reference count */
#define TYPE(object) (((PyObject *const *)(object))[1])

static void prefetch_items(PyObject *list, intptr_t lo, intptr_t hi) {
    PyObject *const *items = ITEMS(list);
    for (intptr_t i = lo; i < hi; i += 8)
        __builtin_prefetch(items + i);
    if (hi > lo)
        __builtin_prefetch(items + hi - 1);
}

/* Called holding the GIL. sources and mirrors: tuples of n lists. Row r holds where, k being its
   mirror's length, its source is k + 1 long, the source's items below k equal the mirror's (all of
   them where tail is 0, else the last tail of them; equal: the same object or == ) and its item k is
   an int in [0, 2^63). Where every row holds, appends each source's item k to its mirror, writes its
   value to out[r] and returns -1; else returns the first row that does not hold (n: an append
   failed) and leaves the mirrors as they were. No error is left set. */
int64_t ngram_read(int64_t n, PyObject *sources, PyObject *mirrors, int64_t tail, int64_t *out) {
    for (int64_t r = 0; r < n; r++) {
        PyObject *h = PyTuple_GetItem(sources, (intptr_t)r), *m = PyTuple_GetItem(mirrors, (intptr_t)r);
        if (h == 0 || m == 0) {
            PyErr_Clear();
            return r;
        }
        __builtin_prefetch(h);
        __builtin_prefetch(m);
    }
    for (int64_t r = 0; r < n; r++) {
        PyObject *h = PyTuple_GetItem(sources, (intptr_t)r), *m = PyTuple_GetItem(mirrors, (intptr_t)r);
        intptr_t k = PyList_Size(m), len = PyList_Size(h);
        if (k < 0 || len < 0) {
            PyErr_Clear();
            return r;
        }
        if (len != k + 1)
            return r;
        intptr_t lo = tail > 0 && k > tail ? k - (intptr_t)tail : 0;
        prefetch_items(h, lo, k + 1);
        prefetch_items(m, lo, k);
    }
    for (int64_t r = 0; r < n; r++) {
        PyObject *h = PyTuple_GetItem(sources, (intptr_t)r), *m = PyTuple_GetItem(mirrors, (intptr_t)r);
        __builtin_prefetch(PyList_GetItem(h, PyList_Size(m)));
    }
    for (int64_t r = 0; r < n; r++) {
        PyObject *h = PyTuple_GetItem(sources, (intptr_t)r), *m = PyTuple_GetItem(mirrors, (intptr_t)r);
        intptr_t k = PyList_Size(m);
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(PyList_GetItem(h, k), &overflow);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return r;
        }
        if (overflow || v < 0)
            return r;
        intptr_t lo = tail > 0 && k > tail ? k - (intptr_t)tail : 0;
        PyObject *const *hi = ITEMS(h), *const *mi = ITEMS(m);
        for (intptr_t i = lo; i < k; i++) {
            if (hi[i] == mi[i])
                continue;
            PyObject *a = PyList_GetItem(h, i), *b = PyList_GetItem(m, i);
            if (a == 0 || b == 0) {
                PyErr_Clear();
                return r;
            }
            Py_IncRef(a); /* held while their == runs, as CPython's own list compare holds them */
            Py_IncRef(b);
            int equal = PyObject_RichCompareBool(a, b, 2 /* Py_EQ */);
            Py_DecRef(a);
            Py_DecRef(b);
            if (equal != 1) {
                PyErr_Clear();
                return r;
            }
            if (PyList_Size(h) != k + 1 || PyList_Size(m) != k) /* an item's == changed the lists */
                return r;
            hi = ITEMS(h);
            mi = ITEMS(m);
        }
        out[r] = (int64_t)v;
    }
    for (int64_t r = 0; r < n; r++) {
        PyObject *h = PyTuple_GetItem(sources, (intptr_t)r), *m = PyTuple_GetItem(mirrors, (intptr_t)r);
        intptr_t k = PyList_Size(m);
        PyObject *t = PyList_GetItem(h, k);
        if (t == 0 || PyList_Append(m, t) < 0) {
            PyErr_Clear();
            for (int64_t q = 0; q < r; q++) {
                PyObject *back = PyTuple_GetItem(mirrors, (intptr_t)q);
                PyList_SetSlice(back, PyList_Size(back) - 1, PyList_Size(back), 0);
            }
            PyErr_Clear();
            return n;
        }
    }
    return -1;
}

/* Called holding the GIL. nodes: a list of n objects of type node_type (its base, flat, token and
   to slots at offsets[0 .. 3] bytes in); bases: a list of n ints; guesses: a list of n items. Row r
   holds where its node is of node_type, its base is the object bases[r] and its flat is bytes. Where
   every row holds and their flats fit in cap bytes, copies them one after another to out, sets
   guesses[r] to each node's to and tokens[r] to its token's value (-1: not an int in [0, 2^63)), and
   returns the bytes copied; else returns -1 - r for the first row that does not hold (-1 - n: more
   than cap bytes) and changes nothing. No error is left set. */
int64_t ngram_gather(int64_t n, PyObject *nodes, PyObject *bases, PyObject *node_type, const int64_t *offsets,
                     PyObject *guesses, int64_t *tokens, char *out, int64_t cap) {
#define SLOT(node, k) (*(PyObject **)((char *)(node) + offsets[k]))
    if (guesses == nodes)
        return -1 - n;
    PyObject *const *items = ITEMS(nodes);
    for (int64_t r = 0; r < n; r++) {
        if (PyList_GetItem(nodes, (intptr_t)r) == 0 || PyList_GetItem(bases, (intptr_t)r) == 0) {
            PyErr_Clear();
            return -1 - r;
        }
        __builtin_prefetch(items[r]);
    }
    int64_t size = 0;
    for (int64_t r = 0; r < n; r++) {
        PyObject *node = items[r];
        if (TYPE(node) != node_type || SLOT(node, 0) != PyList_GetItem(bases, (intptr_t)r))
            return -1 - r;
        char *bytes;
        intptr_t length;
        if (PyBytes_AsStringAndSize(SLOT(node, 1), &bytes, &length) < 0) {
            PyErr_Clear();
            return -1 - r;
        }
        __builtin_prefetch(bytes);
        __builtin_prefetch(SLOT(node, 2));
        size += (int64_t)length;
    }
    if (size > cap)
        return -1 - n;
    int64_t at = 0;
    for (int64_t r = 0; r < n; r++) {
        PyObject *node = items[r];
        char *bytes;
        intptr_t length;
        if (PyBytes_AsStringAndSize(SLOT(node, 1), &bytes, &length) == 0) { /* bytes: checked above */
            memcpy(out + at, bytes, (size_t)length);
            at += (int64_t)length;
        }
        int overflow = 0;
        long value = PyLong_AsLongAndOverflow(SLOT(node, 2), &overflow); /* None: an error, cleared */
        if ((value == -1 && PyErr_Occurred()) || overflow || value < 0) {
            PyErr_Clear();
            value = -1;
        }
        tokens[r] = (int64_t)value;
        PyObject *to = SLOT(node, 3);
        Py_IncRef(to);
        if (PyList_SetItem(guesses, (intptr_t)r, to) < 0) /* steals the reference */
            PyErr_Clear();
    }
    return at;
#undef SLOT
}
"""

#: The nodes' slots ``ngram_gather`` reads, in its order.
GATHER_NAMES = ("base", "flat", "token", "to")


def layout_holds() -> bool:
    """CPython's layouts as ``PASS`` reads them, checked on a fresh list (only its header read until
    it holds): its type after its reference count, then its size, then its items array."""
    marks = [object() for _ in range(3)]
    words = (ctypes.c_size_t * 4).from_address(id(marks))
    if words[1] != id(list) or words[2] != len(marks):
        return False
    items = (ctypes.c_size_t * len(marks)).from_address(words[3])
    return list(items) == list(map(id, marks))


def slot_offsets(cls: type[Any], names: Sequence[str]) -> array[int] | None:
    """Where ``cls``'s slots ``names`` lie in its objects (bytes from the start), found by writing a
    distinct object to each and reading an object's words back; ``None`` where one is not found
    exactly once."""
    obj = object.__new__(cls)
    marks = [object() for _ in names]
    for name, mark in zip(names, marks):
        setattr(obj, name, mark)
    size = getattr(cls, "__basicsize__", 0)
    words = (ctypes.c_size_t * (size // ctypes.sizeof(ctypes.c_size_t))).from_address(id(obj))
    found = [[i * ctypes.sizeof(ctypes.c_size_t) for i, word in enumerate(words) if word == id(mark)] for mark in marks]
    return array("q", [at[0] for at in found]) if all(len(at) == 1 for at in found) else None


class _ProbeNode:
    """A node as ``ngram_gather`` reads one (its own slots' offsets found as ``_Node``'s are)."""

    __slots__ = ("key", "base", "flat", "token", "to")

    def __init__(self, base: int = 0, flat: bytes = b"", token: int | None = None, to: object = None) -> None:
        self.key, self.base, self.flat, self.token, self.to = (), base, flat, token, to


def _probe(loaded: Mapping[str, Any]) -> bool:
    """Both functions on small cases, once the layouts hold: lists that hold, one rewritten, a
    negative new token; nodes whose base is the row's, a stale one, an object of another type."""
    if not layout_holds():
        return False
    slots = slot_table(_ProbeNode)
    if not slots:
        return False
    read, gather = loaded["ngram_read"], loaded["ngram_gather"]
    out = array("q", [0, 0])
    big = [1 << 40, 1 << 41]
    held, mirror = [5, 6, *big, 9], [5, 6, *(int(str(b)) for b in big)]  # equal, other objects
    rewritten, mirror2 = [5, 7, *big, 9], [5, 6, *big]
    results = [read(2, (held, held[:]), (mirror, mirror[:]), 0, address(out)), out.tolist(), mirror]
    results += [read(2, (held[:5], rewritten), (mirror2[:], mirror2), 0, address(out)), mirror2]
    results += [read(1, ([1, -3],), ([1],), 0, address(out))]
    base = 1 << 30
    nodes = [_ProbeNode(base, array("q", [3, 4]).tobytes(), 8, "next"), _ProbeNode(base)]
    guesses: list[object] = [None, None]
    tokens, flat = array("q", [0, 0]), bytearray(64)
    at = (address(tokens), address(flat))
    results += [gather(2, nodes, [base, base], _ProbeNode, slots, guesses, at[0], at[1], 64), guesses, tokens.tolist(),
                array("q", bytes(flat[:16])).tolist()]
    results += [gather(2, nodes, [base, 1 << 31], _ProbeNode, slots, [None, None], at[0], at[1], 64)]
    results += [gather(2, [nodes[0], "node"], [base, base], _ProbeNode, slots, [None, None], at[0], at[1], 64)]
    return results == [-1, [9, 9], [5, 6, *big, 9], 1, [5, 6, *big], 0, 16, ["next", None], [8, -1], [3, 4], -2, -2]


def address(buffer: array[int] | bytearray) -> int:
    """The address of a writable buffer's first byte (kept alive and never resized by its holder)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


#: per class: its slots' offsets (``GATHER_NAMES``' order; kept alive here) and their address
_SLOT_TABLES: dict[type[Any], tuple[array[int] | None, int]] = {}


def slot_table(cls: type[Any]) -> int:
    """The address of ``cls``'s ``GATHER_NAMES`` offsets as ``ngram_gather`` takes them (found once
    per class, ``slot_offsets``); 0 where they are not found."""
    table = _SLOT_TABLES.get(cls)
    if table is None:
        offsets = slot_offsets(cls, GATHER_NAMES)
        table = _SLOT_TABLES[cls] = (offsets, 0 if offsets is None else address(offsets))
    return table[1]


_I64, _PTR, _OBJ = ctypes.c_int64, ctypes.c_void_p, ctypes.py_object
_LIBRARY = NativeLibrary(
    "no_repeat_ngram_pass", PASS,
    {"ngram_read": (_I64, [_I64, _OBJ, _OBJ, _I64, _PTR]),
     "ngram_gather": (_I64, [_I64, _OBJ, _OBJ, _OBJ, _PTR, _OBJ, _PTR, _PTR, _I64])},
    ENV_SWITCH, logger=log, built="no_repeat_ngram: the rows' lists and nodes are read in C ({cc})",
    failed="no_repeat_ngram: the rows' lists and nodes are read in Python (the C pass: {why})",
    failed_level=logging.INFO, holds_gil=True, probe=_probe)


def functions(wait: bool = False) -> tuple[Any, Any] | None:
    """``(ngram_read, ngram_gather)``, or ``None`` while the library builds (the first call queues
    the build) and for good where it cannot be built, fails its probe or is switched off."""
    read = _LIBRARY.function("ngram_read", wait)
    return None if read is None else (read, _LIBRARY.function("ngram_gather"))


def reset() -> None:
    """Forget the build (tests)."""
    _LIBRARY.reset()
