"""Small C libraries of the processors' host steps (``dry_native``, ``no_repeat_ngram_native``,
``no_repeat_ngram_pass_native``): each compiled from a constant source with the system C compiler
(``$CC``, else ``cc``, split as a shell would) at its first use, on the kernels' compile thread (``dynlogits.kernels.variants.COMPILER``),
into a private temporary directory, then loaded with ``ctypes``. Until a library has loaded, and for
good where it cannot be built, fails its probe or its switch (an environment variable) is ``0``,
its callers run their Python or numpy steps; a build logs one line either way. Nothing a request
carries reaches the compiler."""

from __future__ import annotations

import ctypes
import logging
import os
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dynlogits.kernels.variants import COMPILER

__all__ = ["COMPILE_TIMEOUT_S", "NativeLibrary", "Signature"]

#: The compiler gets at most this long per library.
COMPILE_TIMEOUT_S = 60.0

#: An exported function's ctypes ``(restype, argtypes)``.
Signature = tuple[Any, Sequence[Any]]


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc")


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


class NativeLibrary:
    """One library: ``source`` compiled at the first ``function`` call (the build queued on the
    compile thread; ``wait``: built on the caller's thread), its ``functions`` typed by their
    signatures. ``switch``: the environment variable that turns it off (``0``). ``built`` and
    ``failed`` are the log lines (``{cc}``, ``{why}`` filled in; ``failed`` at ``failed_level``).
    ``holds_gil``: loaded with ``ctypes.PyDLL`` (its functions may read Python objects; never on a
    free-threaded interpreter). ``probe(functions)`` must pass before it is used. ``companions``:
    libraries built by the same task just before this one is published (each fails on its own)."""

    def __init__(self, name: str, source: str, functions: Mapping[str, Signature], switch: str, *,
                 logger: logging.Logger, built: str, failed: str, failed_level: int = logging.WARNING,
                 holds_gil: bool = False, probe: Callable[[Mapping[str, Any]], bool] | None = None,
                 companions: Sequence[NativeLibrary] = ()) -> None:
        self.name, self.source, self.signatures, self.switch = name, source, dict(functions), switch
        self.log, self.built_line, self.failed_line, self.failed_level = logger, built, failed, failed_level
        self.holds_gil, self.probe, self.companions = holds_gil, probe, tuple(companions)
        self._lock = threading.Lock()
        self._loaded: dict[str, Any] | None = None
        self._failed: str | None = None
        self._queued = False

    def function(self, name: str, wait: bool = False) -> Any:
        """The loaded function ``name``, or ``None`` while the library builds (the first call
        queues the build) and for good where it cannot be built or is switched off."""
        loaded = self._loaded  # once loaded it never changes but by ``reset``: no lock on the steady step
        if loaded is not None:
            return loaded[name]
        with self._lock:
            if self._loaded is not None:
                return self._loaded[name]
            if self._failed is not None:
                return None
            if os.environ.get(self.switch, "1") == "0":
                self._failed = f"{self.switch}=0"
                return None
            queued = self._queued
            if not wait and not queued:
                self._queued = True
        if wait:
            self.build()
        elif not queued and not COMPILER.submit(self.build):
            with self._lock:
                self._queued = False  # the queue was full: asked again at a later call
        with self._lock:
            return None if self._loaded is None else self._loaded[name]

    def build(self) -> None:
        """Compile, load and probe the library (once), its companions first; records the functions or why not."""
        with self._lock:
            if self._loaded is not None or self._failed is not None:
                return
        for companion in self.companions:
            companion.build()
        loaded: dict[str, Any] | None = None
        try:
            cc = _compiler()
            if cc is None:
                raise RuntimeError("no C compiler ($CC, cc)")
            if self.holds_gil and sysconfig.get_config_var("Py_GIL_DISABLED"):
                raise RuntimeError("a free-threaded interpreter")
            with tempfile.TemporaryDirectory(prefix=f"dynlogits-{self.name}-") as tmp:  # private (0700), removed after loading
                src, out = Path(tmp) / f"{self.name}.c", Path(tmp) / f"{self.name}.so"
                src.write_text(self.source)
                done = subprocess.run([*shlex.split(cc), "-O2", "-shared", "-fPIC", "-o", str(out), str(src)],
                                      capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"{cc} failed: {done.stderr.strip()[:300]}")
                lib = (ctypes.PyDLL if self.holds_gil else ctypes.CDLL)(str(out))  # mapped: the file may go
            loaded = {}
            for name, (restype, argtypes) in self.signatures.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, list(argtypes)
                loaded[name] = fn
            if self.probe is not None and not self.probe(loaded):
                raise RuntimeError("its probe gave wrong results")
            self.log.info(self.built_line.format(cc=cc))
        except Exception as exc:  # any reason: the callers' own steps, for good
            self.log.log(self.failed_level, self.failed_line.format(why=_reason(exc)))
            loaded = None
            with self._lock:
                self._failed = _reason(exc)
        with self._lock:
            self._loaded = loaded

    def reset(self) -> None:
        """Forget the build, the companions' too (tests)."""
        for companion in self.companions:
            companion.reset()
        with self._lock:
            self._loaded, self._failed, self._queued = None, None, False
