"""Shared by the admission-consistency tests: the one problem a refused wire payload is named by."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.specs import SpecError, decode_wire_payload


def refusal(payload: list[dict[str, Any]]) -> str:
    """``path: rule`` of the single problem ``decode_wire_payload`` refuses ``payload`` with."""
    with pytest.raises(SpecError) as err:
        decode_wire_payload(payload)
    (problem,) = err.value.problems
    return str(problem)
