"""Per-slot entry tables sized to a window-decided group's current members: the device layout that
``banned_phrases`` and ``multiple_choice`` share under Model Runner V2."""

from __future__ import annotations

from typing import Any

import torch

from .modes import WindowDecided
from .slots import Group, SlotTable, Template

__all__ = ["EntryTablesGroup"]


class EntryTablesGroup(WindowDecided):
    """A window-decided group whose every slot holds ``entries`` entries of ``width`` token columns
    (a template's ``geometry``), as large for every slot as the largest current member needs.

    A member that needs more than the tables hold rebuilds them at the current members' geometry
    (every member written again), so a request that has left sizes nothing from the next rebuild
    on; admission (``fits_window``) counts the current members only: at most ``MAX_WINDOW_CELLS``
    cells per slot, else the request is hosted. Subclasses make the tables (``_new_tables``) and
    write one slot's entries into them (``_write_entries``)."""

    #: the most prefix cells per slot (``entries x width``): 16 KiB of int32 per slot, so 16 MiB for
    #: 1024 slots on the device and as much pinned on the host
    MAX_WINDOW_CELLS = 4096

    @classmethod
    def fits_window(cls, template: Template, group: Group | None) -> bool:
        entries, width = template.geometry  # type: ignore[attr-defined]  # a window-decided kind's template has one
        if isinstance(group, EntryTablesGroup):
            held, wide = group.members_geometry()
            entries, width = max(entries, held), max(width, wide)
        return entries * width <= cls.MAX_WINDOW_CELLS

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self._templates: dict[int, Any] = {}  # slot -> its template (window-decided members only)
        self._shapes: dict[int, tuple[int, int]] = {}  # slot -> its template's geometry
        self._held: tuple[int, int] | None = (0, 0)  # the members' geometry (``None``: to recompute)
        self.entries = self.width = 0  # the device tables' geometry
        self._own: tuple[SlotTable, ...] = ()
        self._rebuild()

    def members_geometry(self) -> tuple[int, int]:
        """The most entries and columns any current member needs (kept between batch changes; a
        member leaving with the most of either has it recounted at the next call)."""
        if self._held is None:
            shapes = self._shapes.values()
            self._held = max((e for e, _ in shapes), default=0), max((w for _, w in shapes), default=0)
        return self._held

    def _rebuild(self) -> None:
        for old in self._own:
            self.tables.remove(old)
        self._own = self._new_tables()

    def _new_tables(self) -> tuple[SlotTable, ...]:
        """Fresh tables of the current geometry (``entries``, ``width``), set as the subclass's
        attributes; returns them all."""
        raise NotImplementedError

    def _write_entries(self, slot: int, template: Any) -> None:
        """``template``'s entries into ``slot``'s rows of the tables, padded to ``entries``."""
        raise NotImplementedError

    def assign(self, slot: int, template: Template | None) -> None:
        if template is None:
            self._templates.pop(slot, None)
            self._leave(slot)
        super().assign(slot, template)

    def _leave(self, slot: int) -> None:
        shape = self._shapes.pop(slot, None)
        held = self._held
        if shape is not None and held is not None and (shape[0] >= held[0] or shape[1] >= held[1]):
            self._held = None

    def _write(self, slot: int, template: Any) -> None:
        if not self.from_window:
            return  # decided on the host: the entry tables are not read
        self._leave(slot)  # a slot written again without leaving first
        self._templates[slot] = template
        entries, width = self._shapes[slot] = template.geometry
        if self._held is not None:
            self._held = max(self._held[0], entries), max(self._held[1], width)
        if entries > self.entries or width > self.width:  # rebuilt at the members' geometry, every member again
            self.entries, self.width = self.members_geometry()
            self._rebuild()
            for member, written in self._templates.items():
                self._write_entries(member, written)
        else:
            self._write_entries(slot, template)
