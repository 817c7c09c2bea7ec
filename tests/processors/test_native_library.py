"""The processors' small C libraries (``native_library.NativeLibrary``): built from their source at
first use and typed by their signatures; a compiler that fails, a probe that fails or a switch set to
``0`` leaves the callers on their own steps for good, with one log line; a companion is built with
its parent. Needs a C compiler (``cc``)."""

from __future__ import annotations

import ctypes
import logging
import shutil
from collections.abc import Mapping
from typing import Any

import pytest

from dynlogits.processors.native_library import NativeLibrary

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")

SOURCE = "#include <stdint.h>\nint64_t twice(int64_t x) { return 2 * x; }\n"
LOG = logging.getLogger("tests.native_library")


def _library(switch: str = "DYN_TEST_NATIVE", probe: Any = None, **kwargs: Any) -> NativeLibrary:
    return NativeLibrary("twice", SOURCE, {"twice": (ctypes.c_int64, [ctypes.c_int64])}, switch, logger=LOG,
                         built="twice built ({cc})", failed="twice failed ({why})", probe=probe, **kwargs)


def test_a_library_builds_once_and_its_functions_are_typed(caplog: pytest.LogCaptureFixture) -> None:
    lib = _library()
    with caplog.at_level(logging.INFO, logger=LOG.name):
        twice = lib.function("twice", wait=True)
        assert twice is not None and twice(21) == 42
        assert lib.function("twice") is twice
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["twice built"]


def test_a_failing_compiler_leaves_the_callers_on_their_own_steps_with_one_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CC", "false")
    lib = _library()
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert lib.function("twice", wait=True) is None
        assert lib.function("twice", wait=True) is None  # not tried again
    (record,) = caplog.records
    assert record.getMessage().startswith("twice failed (RuntimeError: false failed")


def test_switched_off_it_is_never_built(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("DYN_TEST_NATIVE", "0")
    lib = _library()
    with caplog.at_level(logging.INFO, logger=LOG.name):
        assert lib.function("twice", wait=True) is None
    assert not caplog.records


def test_a_failing_probe_keeps_it_unused_and_a_companion_is_built_first(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def probe(functions: Mapping[str, Any]) -> bool:
        seen.append("probe")
        return bool(functions["twice"](2) == 5)

    wrong = _library(probe=probe)
    parent = _library(companions=(wrong,), probe=lambda functions: seen.append("parent") is None)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert parent.function("twice", wait=True) is not None
    assert seen == ["probe", "parent"]
    assert wrong.function("twice") is None
    assert "its probe gave wrong results" in caplog.records[0].getMessage()
    parent.reset()
    assert wrong._failed is None and parent._loaded is None  # forgotten together
