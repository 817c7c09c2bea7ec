"""The environment variables that profile the engine suite's timed adapter (``timed``), set by the
driver (``engine``) for its worker (``engine_worker``): one home, imported by all three."""

from __future__ import annotations

__all__ = ["PROFILE_ENV", "SECTIONS_ENV"]

#: a folder: the timed adapter's calls profiled per kind (``<kind>.prof``)
PROFILE_ENV = "DYNLOGITS_BENCH_PROFILE"
#: with ``PROFILE_ENV``: comma-separated ``module:qualname`` functions timed instead (``sections.json``)
SECTIONS_ENV = "DYNLOGITS_BENCH_SECTIONS"
