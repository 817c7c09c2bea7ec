"""The engine half of ``dynlogits.testing.plugin_kinds``: factories ``(entry, ctx) -> processor``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dynlogits.processors.base import RealizeContext

from .faults import BanId, KeepOnly, RaiseAfter
from .plugin_kinds import BanBeyondSpec, FactsSpec, KeepOnlySpec, RaiseAfterSpec

__all__ = ["ban_beyond", "facts", "keep_only", "raise_after", "recording"]

#: The contexts ``facts`` was given, by the entry's tag, in realization order (see ``recording``).
_RECORDED: dict[str, list[RealizeContext]] = {}


def raise_after(entry: RaiseAfterSpec, ctx: RealizeContext) -> RaiseAfter:
    return RaiseAfter(entry.after)


def keep_only(entry: KeepOnlySpec, ctx: RealizeContext) -> KeepOnly:
    return KeepOnly(entry.token_ids)


def ban_beyond(entry: BanBeyondSpec, ctx: RealizeContext) -> BanId:
    return BanId(ctx.vocab_size + entry.beyond)


def facts(entry: FactsSpec, ctx: RealizeContext) -> KeepOnly:
    """Record ``ctx`` under ``entry.tag``; the processor keeps only the prompt's and the stop ids'
    logits (those inside the width), so the facts act on the rows too."""
    _RECORDED.setdefault(entry.tag, []).append(ctx)
    return KeepOnly(sorted({t for t in (*ctx.prompt_ids, *ctx.stop_token_ids) if 0 <= t < ctx.vocab_size}))


@contextmanager
def recording() -> Iterator[dict[str, list[RealizeContext]]]:
    """The contexts ``kit.facts`` factories are given during the block, by tag (this process only:
    the kit drives adapters in-process)."""
    _RECORDED.clear()
    try:
        yield _RECORDED
    finally:
        _RECORDED.clear()
