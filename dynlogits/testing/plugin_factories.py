"""The engine half of ``dynlogits.testing.plugin_kinds``: factories ``(entry, ctx) -> processor``."""

from __future__ import annotations

from typing import Any

from dynlogits.processors.base import RealizeContext

from .faults import BanId, KeepOnly, RaiseAfter

__all__ = ["ban_beyond", "keep_only", "raise_after"]


def raise_after(entry: Any, ctx: RealizeContext) -> RaiseAfter:
    return RaiseAfter(entry.after)


def keep_only(entry: Any, ctx: RealizeContext) -> KeepOnly:
    return KeepOnly(entry.token_ids)


def ban_beyond(entry: Any, ctx: RealizeContext) -> BanId:
    return BanId(ctx.vocab_size + entry.beyond)
